"""Worker actions, the executor's side (ADR-0099): a worker node's call is a run offered on
its queue; the pass waits for its outcome while a worker takes it (long-poll), holds it
under a run lease it extends by heartbeat, and completes it.

An outcome reaches the waiting pass at once when the completion arrives at this process
(:meth:`WorkerRuns.settle`), else through :meth:`WorkerRuns.check` (every ~100 ms, one
statement for all the runs this process waits for): runs completed through another
executor, runs whose worker lease ran out (the worker vanished: ambiguous) and runs past
their deadline (ambiguous). :func:`result_of` maps an outcome to the class an http answer
would have had (:mod:`dispo.executor.failures`), so the rules after it are the same.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from dispo.executor.actions import Result, failed, output_result
from dispo.executor.domain import ActionSpec
from dispo.executor.failures import CallOutcome
from dispo.executor.store import worker_runs as store
from dispo.executor.store.worker_runs import Offer, Outcome, RunKey
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database, Row
from dispo.libs.logging import get_logger

log = get_logger(__name__)

# A PollRuns waits at most this long (ms), and re-reads the table this often (s) for runs
# other executors offered.
MAX_WAIT_MS = 30_000
RECHECK_SECONDS = 0.2
# How often the runs this process waits for are checked (s of the executor's clock).
CHECK_SECONDS = 0.1
RELEASED = "handed back by its worker as it shut down (its handler may have had its effect)"


def result_of(outcome: Outcome, spec: ActionSpec) -> Result:
    """The call's result a run's outcome stands for: an output (checked as an http answer's
    would be) is a success; a retryable error an answer without effect (a short retry); a
    permanent one a definite failure; ``not_sent`` nothing sent; ``lost`` (the worker
    vanished, the deadline passed, the run taken back) ambiguous."""
    if outcome.kind == store.OUTPUT:
        if outcome.output is None:
            return Result(CallOutcome.SUCCESS)
        return output_result(outcome.output, spec)
    if outcome.kind == store.ERROR:
        cls = CallOutcome.REFUSED if outcome.retryable else CallOutcome.DEFINITE
        return failed(cls, f"worker: {outcome.message}")
    if outcome.kind == store.NOT_SENT:
        return failed(CallOutcome.NOT_SENT, f"worker: {outcome.message}")
    return failed(CallOutcome.AMBIGUOUS, outcome.message or store.LEASE_EXPIRED)


# ---- run tokens --------------------------------------------------------------------------
class BadToken(ValueError):
    """A run token that is not one PollRuns handed out."""


@dataclass(frozen=True)
class RunRef:
    """What a run token names: the run, the worker that took it, its queue, and whether it
    is a probe run (ADR-0100)."""

    key: RunKey
    worker_id: str
    queue: str = ""
    probe: bool = False


def run_token(key: RunKey, worker_id: str, queue: str = "", probe: bool = False) -> str:
    """The opaque token naming a run of ``queue`` taken by ``worker_id``."""
    task_id, node_id, attempt = key
    parts: list[object] = [task_id, node_id, attempt, worker_id, queue]
    if probe:
        parts.append(1)
    raw = json.dumps(parts, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def parse_run(token: str) -> RunRef:
    """The run a token names (BadToken when it names none)."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        parts = json.loads(raw)
        task_id, node_id, attempt, worker_id = parts[:4]
        queue = parts[4] if len(parts) > 4 else ""
        probe = len(parts) > 5 and parts[5] == 1
    except (ValueError, TypeError, KeyError) as error:
        raise BadToken("not a run token PollRuns handed out") from error
    if (
        not isinstance(parts, list)
        or len(parts) > 6
        or not all(isinstance(v, str) and v for v in (task_id, node_id, worker_id))
        or not isinstance(queue, str)
        or not (isinstance(attempt, int) and attempt > 0)
    ):
        raise BadToken("not a run token PollRuns handed out")
    return RunRef((task_id, node_id, attempt), worker_id, queue, probe)


def parse_token(token: str) -> tuple[RunKey, str]:
    """The run and worker a token names (BadToken when it names none)."""
    ref = parse_run(token)
    return ref.key, ref.worker_id


# ---- the runs of this process ------------------------------------------------------------
@dataclass(frozen=True)
class Taken:
    """A run a worker took: its row, and its token."""

    row: Row
    token: str


class WorkerRuns:
    """The worker runs this executor process offers and waits for, and the worker-facing
    operations (:class:`dispo.executor.worker_servicer.WorkerServicer` serves them)."""

    def __init__(self, db: Database, clock: Clock, lease_seconds: float) -> None:
        self.db = db
        self.clock = clock
        self.lease_seconds = lease_seconds
        # The runs passes of this process wait for, by run.
        self.waiting: dict[RunKey, asyncio.Future[Outcome]] = {}
        # Those of them whose offer has committed: only these are looked for in the table
        # (an offer not yet committed has no row, which is not a run taken back).
        self.committed: set[RunKey] = set()
        # Set (and replaced) when this process offers a run: wakes its long-polls.
        self._offered = asyncio.Event()

    async def run(
        self, offer: Offer, spec: ActionSpec, write: Callable[[Offer], Awaitable[None]]
    ) -> Result:
        """Offer the run (``write``: through the pass's commit port), then wait for its
        outcome, as the call's result."""
        key = offer.key
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.waiting[key] = waiter  # before the offer: a completion may come at once
        try:
            await write(offer)
            self.committed.add(key)
            self._offered.set()
            self._offered = asyncio.Event()
            outcome = await waiter
        finally:
            self.committed.discard(key)
            if self.waiting.get(key) is waiter:
                del self.waiting[key]
        return result_of(outcome, spec)

    async def probe(self, offer: Offer, spec: ActionSpec, wait_seconds: float) -> Outcome | None:
        """Offer a probe run (ADR-0100) and wait up to ``wait_seconds`` for a worker's
        answer: its outcome, or None when no worker answered in time (or the node's call is
        offered or under way, so it is not probed). A probe answered ``done`` keeps its row
        (its output is recorded by the redrive that settles the node); any other is
        deleted, and so is one whose output ``spec`` does not admit (an ``ERROR`` saying
        why: no answer)."""
        key = offer.key
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self.waiting[key] = waiter
        outcome: Outcome | None = None
        try:
            async with self.db.transaction() as conn:
                offered = await store.runs_offer_many(conn, [offer], self.clock.now())
            if key not in offered:
                return None
            self.committed.add(key)
            self._offered.set()
            self._offered = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                outcome = await asyncio.wait_for(asyncio.shield(waiter), wait_seconds)
        finally:
            self.committed.discard(key)
            if self.waiting.get(key) is waiter:
                del self.waiting[key]
        if outcome is not None and outcome.kind == store.DONE and outcome.output is not None:
            checked = output_result(outcome.output, spec)
            if checked.outcome is not CallOutcome.SUCCESS:
                outcome = Outcome(store.ERROR, None, f"the probe's output: {checked.detail}")
        if outcome is None or outcome.kind != store.DONE:
            async with self.db.transaction() as conn:
                await store.runs_delete_many(conn, [key])
        return outcome

    def settle(self, settled: dict[RunKey, Outcome]) -> None:
        """Hand each outcome to the pass of this process that waits for it, if any."""
        for key, outcome in settled.items():
            waiter = self.waiting.pop(key, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(outcome)

    async def check(self) -> None:
        """The outcomes of the runs this process waits for that ended elsewhere or timed
        out (one statement; none when nothing waits)."""
        keys = [key for key in self.waiting if key in self.committed]
        if not keys:
            return
        async with self.db.connection() as conn:
            settled = await store.runs_settled_many(conn, keys, self.clock.now())
        self.settle(settled)

    # ---- the worker's operations ---------------------------------------------------------
    async def poll(
        self,
        queues: Sequence[str],
        worker_id: str,
        max_runs: int,
        wait_ms: int,
        probe_queues: Sequence[str] = (),
    ) -> list[Taken]:
        """Take up to ``max_runs`` runs of ``queues`` (and probe runs of ``probe_queues``);
        wait up to ``wait_ms`` for one (woken by this process's offers, re-reading every
        :data:`RECHECK_SECONDS` for others')."""
        loop = asyncio.get_running_loop()
        end = loop.time() + min(max(wait_ms, 0), MAX_WAIT_MS) / 1000
        while True:
            offered = self._offered
            async with self.db.connection() as conn:
                rows = await store.runs_take_many(
                    conn,
                    queues,
                    worker_id,
                    max_runs,
                    self.clock.now(),
                    self.lease_seconds,
                    probe_queues,
                )
            left = end - loop.time()
            if rows or left <= 0:
                return [
                    Taken(
                        row,
                        run_token(
                            (row.task_id, row.node_id, row.attempt),
                            worker_id,
                            row.queue,
                            row.kind == "probe",
                        ),
                    )
                    for row in rows
                ]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(offered.wait(), min(RECHECK_SECONDS, left))

    # ``queues`` (below): the queues the caller may serve (None: every queue); a run of
    # another queue is not held by it.
    async def heartbeat(
        self, worker_id: str, keys: Sequence[RunKey], queues: Sequence[str] | None = None
    ) -> dict[RunKey, datetime]:
        async with self.db.connection() as conn:
            return await store.runs_extend_if_held_many(
                conn, worker_id, keys, self.clock.now(), self.lease_seconds, queues
            )

    async def complete(
        self,
        key: RunKey,
        worker_id: str,
        outcome: Outcome,
        queues: Sequence[str] | None = None,
    ) -> bool:
        """Record a worker's outcome if it still holds the run (False: refused, nothing
        written); a pass of this process waiting for it has it at once."""
        async with self.db.connection() as conn:
            done = await store.runs_complete_if_held_many(
                conn, [(key, worker_id, outcome)], self.clock.now(), queues
            )
        if key not in done:
            return False
        self.settle({key: outcome})
        return True

    async def release(
        self, worker_id: str, keys: Sequence[RunKey], queues: Sequence[str] | None = None
    ) -> int:
        """Hand back the runs ``worker_id`` holds (see
        :func:`store.runs_release_if_held_many`); how many it held."""
        async with self.db.connection() as conn:
            rows = await store.runs_release_if_held_many(
                conn, worker_id, keys, self.clock.now(), RELEASED, queues
            )
        if any(row.state == "offered" for row in rows):
            self._offered.set()
            self._offered = asyncio.Event()
        self.settle(
            {
                (row.task_id, row.node_id, row.attempt): Outcome(store.LOST, None, RELEASED)
                for row in rows
                if row.state == "done"
            }
        )
        for row in rows:
            log.info(
                "worker run handed back",
                task_id=row.task_id,
                node_id=row.node_id,
                worker_id=worker_id,
                offered_again=row.state == "offered",
            )
        return len(rows)
