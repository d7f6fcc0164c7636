"""Group commit across threads, for the blocking client: what :class:`~dispo.libs.batcher.Batcher`
does for coroutines, without a thread of its own.

A thread that finds no call on its way sends its item alone, at once. Items submitted while
a call is on its way wait in line; when the call ends, the thread that sent it hands the
next call to the first thread in line, which sends every item waiting (up to ``max_items``)
in one call and answers each of their threads. So a thread only ever sends a call that
carries its own item, and at most one call is on its way::

    gathered = Gathered(send, max_items=250)      # send(items) -> one result per item
    result = gathered.submit(item, timeout=10.0)  # raises TimeoutError if still in line then

``send`` returns one result per item, in order, or an exception instance in an item's place
(raised to that item's thread alone); an exception ``send`` raises is every item's. A
thread whose timeout passes while its item is still in line takes it out and raises
``TimeoutError``; once its item is in a call, it waits for the call (which carries the
latest deadline of its items).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


class _Waiting(Generic[T, R]):
    """One item in line: its thread waits on ``done``; set with ``lead`` (the call this
    thread is to send) or with its answer."""

    __slots__ = ("item", "done", "lead", "result", "error")

    def __init__(self, item: T) -> None:
        self.item = item
        self.done = threading.Event()
        self.lead: list[_Waiting[T, R]] | None = None
        self.result: R | None = None
        self.error: BaseException | None = None


class Gathered(Generic[T, R]):
    def __init__(
        self,
        send: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        max_items: int = 100,
    ) -> None:
        if max_items < 1:
            raise ValueError("need max_items >= 1")
        self._send = send
        self.max_items = max_items
        self._lock = threading.Lock()
        self._line: deque[_Waiting[T, R]] = deque()
        self._sending = False
        # Calls sent so far and the items they carried, for reports and tests.
        self.flushes = 0
        self.flushed_items = 0

    def submit(self, item: T, timeout: float | None = None) -> R:
        """Send ``item`` with the items waiting beside it; its result, or what it failed
        with."""
        me: _Waiting[T, R] = _Waiting(item)
        with self._lock:
            if self._sending:
                self._line.append(me)
            else:
                self._sending = True
                me.lead = [me]
        if me.lead is None and not me.done.wait(timeout):
            with self._lock:
                if me in self._line:  # not in a call yet: out of line
                    self._line.remove(me)
                    raise TimeoutError("still waiting to be sent")
            me.done.wait()  # in a call already, or just handed one to send
        if me.lead is not None:
            self._lead(me.lead)
        if me.error is not None:
            raise me.error
        return cast(R, me.result)

    def _lead(self, call: list[_Waiting[T, R]]) -> None:
        """Send ``call`` (this thread's item among them), answer the others, then hand the
        next call to the first thread in line."""
        try:
            results: Sequence[R | BaseException] = self._send([w.item for w in call])
            if len(results) != len(call):
                raise RuntimeError(f"send returned {len(results)} results for {len(call)} items")
        except BaseException as error:  # every item's
            results = [error] * len(call)
        self.flushes += 1
        self.flushed_items += len(call)
        for waiting, result in zip(call, results, strict=True):
            if isinstance(result, BaseException):
                waiting.error = result
            else:
                waiting.result = result
            waiting.lead = None
            waiting.done.set()
        with self._lock:
            if not self._line:
                self._sending = False
                return
            nxt = [self._line.popleft() for _ in range(min(self.max_items, len(self._line)))]
        nxt[0].lead = nxt
        nxt[0].done.set()


__all__ = ["Gathered"]
