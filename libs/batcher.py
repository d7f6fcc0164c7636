"""Group commit: many concurrent callers, one flush for all of them.

Each caller awaits :meth:`Batcher.submit` with one item (or :meth:`Batcher.submit_all`
with several, each answered on its own); the items waiting are handed to
the ``flush`` function together (one transaction, one multi-row statement) and every caller
gets its own result::

    async def insert_all(rows: list[Row]) -> list[bool]:   # one result per item, in order
        async with engine.begin() as conn:
            ...
    inserts = Batcher("task inserts", insert_all, max_items=200)
    inserted = await inserts.submit(row)       # returns when the flush holding it committed

A flush starts at once when none is running (an idle system pays no wait), so batches
form by themselves under load: while one flush runs, the items arriving meanwhile queue
up and the next flush takes them all (up to ``max_items``). ``linger`` makes a flush
wait that many seconds for more items first (0 by default). At most ``concurrency``
flushes run at the same time. Backpressure: with ``max_pending`` items queued, callers
wait for room before queueing theirs, so a slow database slows its callers instead of
growing memory.

Failures: an exception raised by ``flush`` reaches every caller of that flush (its
transaction rolled back as a whole); a flush that fails one item alone returns the
exception instance in that item's place, and only that caller raises it. With
``isolate=True`` a flush of several items that raises is tried again in halves, each half
that raises halved again (unless the database was unreachable), so one item that cannot be
written — a poison message behind a consumer — fails alone instead of failing everything it
was batched with, at the cost of about two flushes per halving rather than one per item of
the batch. A caller cancelled while it waits does not take its item back: the flush may already hold it
(exactly as a commit whose answer is lost) — callers retry under their own idempotency.

``observe``, when given, is called with the item count of every flush that succeeded (a
service passes its metrics recorder: ``dispo_group_commit_items``), so how well writes are
batched can be read off a running service.

As River's batch completer and Hatchet's buffered writes do, but with the flush as soon
as the previous one ended rather than on a timer.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    def __init__(
        self,
        name: str,
        flush: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]],
        *,
        max_items: int = 100,
        linger: float = 0.0,
        concurrency: int = 1,
        max_pending: int = 10_000,
        isolate: bool = False,
        observe: Callable[[int], None] | None = None,
    ) -> None:
        if max_items < 1 or concurrency < 1 or max_pending < max_items:
            raise ValueError("need max_items >= 1, concurrency >= 1, max_pending >= max_items")
        self.name = name
        self._flush = flush
        self.isolate = isolate
        self._observe = observe
        self.max_items = max_items
        self.linger = linger
        self.concurrency = concurrency
        self.max_pending = max_pending
        self._queue: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._room = asyncio.Condition()
        self._flushers: set[asyncio.Task[None]] = set()
        # Flushers not yet returned; counted by hand, not by the tasks' done callbacks, so an
        # item queued just as the last flusher finds the queue empty still gets a flusher.
        self._running = 0
        # Sizes of the flushes done so far (count and items), for reports and tests.
        self.flushes = 0
        self.flushed_items = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def submit(self, item: T) -> R:
        """Queue ``item`` for the next flush and return its result once flushed."""
        (future,) = await self._queued_when_room([item])
        return await future

    async def submit_all(self, items: Sequence[T]) -> list[R | BaseException]:
        """Queue ``items`` together, in order, and return once every one was flushed: each
        one's result, or the exception that item failed with in its place. They share
        flushes with each other and with every other caller's (as many as ``max_items``
        lets: a long list spans flushes, in order)."""
        futures = await self._queued_when_room(items)
        return await asyncio.gather(*futures, return_exceptions=True)

    async def _queued_when_room(self, items: Sequence[T]) -> list[asyncio.Future[R]]:
        # Backpressure by the queue's length before the items: a list may take the queue
        # past ``max_pending`` by its own length.
        if len(self._queue) >= self.max_pending:
            async with self._room:
                await self._room.wait_for(lambda: len(self._queue) < self.max_pending)
        return self._queued(items)

    def _queued(self, items: Sequence[T]) -> list[asyncio.Future[R]]:
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[R]] = []
        for item in items:
            future: asyncio.Future[R] = loop.create_future()
            self._queue.append((item, future))
            futures.append(future)
        if self._running < self.concurrency:
            self._running += 1
            # A flush serves many submitters: none of their log bindings (dispo.libs.logging).
            flusher = asyncio.create_task(
                self._run(), name=f"{self.name} flush", context=contextvars.Context()
            )
            self._flushers.add(flusher)
            flusher.add_done_callback(self._flushers.discard)
        return futures

    async def _run(self) -> None:
        try:
            while self._queue:
                if self.linger > 0 and len(self._queue) < self.max_items:
                    await asyncio.sleep(self.linger)
                count = min(self.max_items, len(self._queue))
                taken = [self._queue.popleft() for _ in range(count)]
                if not taken:
                    continue
                async with self._room:
                    self._room.notify_all()
                await self._flush_batch(taken)
        finally:  # no await between the empty queue and this: see ``_running``
            self._running -= 1

    async def _flush_batch(self, taken: list[tuple[T, asyncio.Future[R]]]) -> None:
        items = [item for item, _ in taken]
        try:
            results = await self._flush(items)
            if len(results) != len(items):
                raise RuntimeError(
                    f"{self.name}: flush returned {len(results)} results for {len(items)} items"
                )
        except asyncio.CancelledError as cancelled:
            # The database layer is imported on the services' failure paths only: the SDK's
            # clients gather submits with this module and need none of it.
            from dispo.libs.db.down import ConnectionLost, interrupted

            if not interrupted():
                raise  # the flusher itself is cancelled (the service stops)
            # Raised inside the flush with no one cancelling it (a connection closed under a
            # statement): a failure of this flush, which its callers must hear of.
            _fail(taken, ConnectionLost(f"{self.name}: flush interrupted: {cancelled!r}"))
            return
        except Exception as error:  # every caller of the flush raises it, and logs it
            if self.isolate and len(taken) > 1:
                from dispo.libs.db.down import database_unreachable

                if not database_unreachable(error):
                    half = len(taken) // 2
                    await self._flush_batch(taken[:half])
                    await self._flush_batch(taken[half:])
                    return
            _fail(taken, error)
            return
        self.flushes += 1
        self.flushed_items += len(items)
        if self._observe is not None:
            self._observe(len(items))
        for (_, future), result in zip(taken, results, strict=True):
            if future.done():  # the caller was cancelled
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def drain(self) -> None:
        """Wait until every queued item has been flushed."""
        while self._flushers:
            await asyncio.gather(*list(self._flushers), return_exceptions=True)


def _fail(taken: Sequence[tuple[object, asyncio.Future[R]]], error: BaseException) -> None:
    """Every caller of a flush still waiting raises ``error``."""
    for _, future in taken:
        if not future.done():
            future.set_exception(error)
