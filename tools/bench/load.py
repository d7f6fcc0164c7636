"""The load generator: Submits over gRPC, spread round-robin over the gateways, in one of
two modes, then the outcome of every task as the gateway records it.

- :func:`saturate` — closed loop: ``concurrency`` callers each submit their next task (or
  their next ``batch`` of tasks, by one SubmitMany) as soon as the previous call is answered,
  until ``count`` are sent;
- :func:`offer` — open loop: task ``i`` is sent at ``i / rate`` seconds whatever the answers
  (so a slow stack shows as latency, not as a lower offered rate);
- :func:`saturate_threads` — closed loop from ``threads`` threads sharing the blocking
  client (one per gateway), as a threaded web server or worker pool submits;
- :func:`outcomes` — once no task of the run's business is left unfinished, every task's
  status with its acceptance and last-change times (one paged ListTasks pass).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

import grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.sdk import AsyncClient, CellSpec, Client, DispoError, TaskRequest
from dispo.tools.bench.report import TERMINAL, LoadFacts, Outcome, Submission

T = TypeVar("T")

UNFINISHED = [
    name.removeprefix("TASK_STATUS_")
    for name in common_pb2.TaskStatus.keys()
    if name != "TASK_STATUS_UNSPECIFIED" and name.removeprefix("TASK_STATUS_") not in TERMINAL
]


# Answers after which a Submit may have been recorded or not: a caller retries those with
# the same idempotency key (and gets the same task if it was).
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class Submitter:
    """Submits task ``i`` of a run through gateway ``i mod len(clients)``, keyed ``<business>-i``.

    With ``retry_seconds`` a Submit answered UNAVAILABLE or DEADLINE_EXCEEDED is sent again
    under the same key (every ``retry_interval`` seconds, as a careful caller would) until
    that long after its first send; its figures then span every try. ``answered`` is called
    after each Submit's answer (a progress bar's step)."""

    def __init__(
        self,
        clients: Sequence[AsyncClient],
        business: str,
        cells: Callable[[], list[CellSpec]],
        *,
        retry_seconds: float = 0.0,
        retry_interval: float = 0.5,
        answered: Callable[[], None] = lambda: None,
    ) -> None:
        self.clients = list(clients)
        self.business = business
        self.cells = cells
        self.retry_seconds = retry_seconds
        self.retry_interval = retry_interval
        self.answered = answered
        self.start()

    def start(self, offered_rate: float | None = None) -> None:
        """Begin a run: fresh facts, times measured from now."""
        self.facts = LoadFacts(started_at=time.time(), offered_rate=offered_rate)
        self._origin = time.perf_counter()

    async def submit(self, i: int, lag: float = 0.0) -> None:
        """Task ``i`` by one Submit."""
        await self.submit_all([i], lag)

    async def submit_all(self, indices: Sequence[int], lag: float = 0.0) -> None:
        """Tasks ``indices``: one by Submit, several by one SubmitMany; each task's figures
        are the call's."""
        client = self.clients[indices[0] % len(self.clients)]
        sent = time.perf_counter()
        task_ids, error, tries = [""] * len(indices), "", 0
        while True:
            tries += 1
            try:
                if len(indices) == 1:
                    answers = [
                        await client.submit(
                            self.business, self.cells(), idempotency_key=self.key(indices[0])
                        )
                    ]
                else:
                    answers = await client.submit_many(
                        [TaskRequest(self.business, self.cells(), self.key(i)) for i in indices]
                    )
                task_ids, error = [a.task_id for a in answers], ""
                break
            except DispoError as failure:
                error = failure.code.name
                if (
                    failure.code not in RETRYABLE
                    or time.perf_counter() - sent + self.retry_interval > self.retry_seconds
                ):
                    break
            await asyncio.sleep(self.retry_interval)
        for task_id in task_ids:
            self.record(sent, task_id, error, lag, tries)

    def record(
        self, sent: float, task_id: str, error: str, lag: float = 0.0, tries: int = 1
    ) -> None:
        """One task's Submit, sent at ``sent`` (``time.perf_counter()``) and answered now:
        accepted as ``task_id``, or refused with ``error`` (a status code's name)."""
        seconds = time.perf_counter() - sent
        self.facts.submissions.append(
            Submission(sent - self._origin, seconds, task_id, error, lag, tries)
        )
        self.answered()

    def key(self, i: int) -> str:
        """The idempotency key of the run's task ``i``."""
        return f"{self.business}-{i}"


async def retrying(call: Callable[[], Awaitable[T]], attempts: int = 20) -> T:
    """``call()``, made again 0.5 s later while the gateway answers it UNAVAILABLE (a
    restart, a leader election), ``attempts`` times at most; any other refusal at once."""
    for attempt in range(attempts):
        try:
            return await call()
        except DispoError as error:
            if error.code is not grpc.StatusCode.UNAVAILABLE or attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def saturate(submitter: Submitter, count: int, concurrency: int, batch: int = 1) -> LoadFacts:
    """``concurrency`` calls in flight, each of ``batch`` tasks (one Submit each, or one
    SubmitMany of ``batch``), until ``count`` tasks are sent."""
    submitter.start()
    batches = iter([list(range(i, min(count, i + batch))) for i in range(0, count, batch)])

    async def caller() -> None:
        for indices in batches:
            await submitter.submit_all(indices)

    await asyncio.gather(*(caller() for _ in range(max(1, concurrency))))
    return submitter.facts


def saturate_threads(
    submitter: Submitter, clients: Sequence[Client], count: int, threads: int
) -> LoadFacts:
    """``threads`` threads, each submitting its next task through the blocking client of
    gateway ``i mod len(clients)`` as soon as its previous one is answered, until ``count``
    are sent (keyed and recorded by ``submitter``, as its own Submits are). Blocks until all
    are answered."""
    submitter.start()
    following = iter(range(count))
    lock = threading.Lock()

    def next_index() -> int | None:
        with lock:
            return next(following, None)

    def caller() -> None:
        while (i := next_index()) is not None:
            sent = time.perf_counter()
            task_id, error = "", ""
            try:
                task_id = (
                    clients[i % len(clients)]
                    .submit(submitter.business, submitter.cells(), idempotency_key=submitter.key(i))
                    .task_id
                )
            except DispoError as failure:
                error = failure.code.name
            submitter.record(sent, task_id, error)

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for done in [pool.submit(caller) for _ in range(max(1, threads))]:
            done.result()
    return submitter.facts


async def offer(submitter: Submitter, count: int, rate: float) -> LoadFacts:
    """Send ``count`` Submits at ``rate`` per second on schedule; wait for every answer."""
    submitter.start(offered_rate=rate)
    loop = asyncio.get_running_loop()
    origin = loop.time()
    in_flight: set[asyncio.Task[None]] = set()
    for i in range(count):
        due = origin + i / rate
        delay = due - loop.time()
        # Behind schedule: send at once, but let the answers in between.
        await asyncio.sleep(max(0.0, delay))
        task = asyncio.create_task(submitter.submit(i, lag=max(0.0, loop.time() - due)))
        in_flight.add(task)
        task.add_done_callback(in_flight.discard)
    await asyncio.gather(*in_flight)
    return submitter.facts


async def unfinished(client: AsyncClient, business: str) -> bool:
    """Whether any task of ``business`` is not yet terminal (one page of one row)."""
    pages = cast(
        AsyncGenerator[object, None],
        client.list(business=business, statuses=UNFINISHED, page_size=1),
    )
    try:
        return await anext(pages, None) is not None
    finally:
        await pages.aclose()


async def outcomes(
    client: AsyncClient, business: str, timeout: float, interval: float = 0.2
) -> list[Outcome]:
    """Every task of ``business`` once none is unfinished (or after ``timeout`` seconds,
    as they are then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline and await unfinished(client, business):
        await asyncio.sleep(interval)
    return [
        Outcome(
            summary.task_id,
            summary.status,
            summary.raw.created_at.ToMicroseconds() / 1e6,
            summary.raw.updated_at.ToMicroseconds() / 1e6,
        )
        async for summary in client.list(business=business, page_size=500)
    ]
