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
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from dispo.executor.actions import Result, failed, output_result
from dispo.executor.domain import ActionSpec
from dispo.executor.failures import CallOutcome
from dispo.executor.queue_pace import counted, last_second, turns
from dispo.executor.store import queues as presence
from dispo.executor.store import worker_runs as store
from dispo.executor.store.worker_runs import Completion, Offer, Outcome, RunKey
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Conn, Database, Row
from dispo.libs.logging import get_logger

log = get_logger(__name__)

# A PollRuns waits at most this long (ms), and re-reads the table this often (s) for runs
# other executors offered.
MAX_WAIT_MS = 30_000
RECHECK_SECONDS = 0.2
# A poll whose queues' paces are all spent waits for the next turn, and at least this long
# (s of the clock): pollers that miss a turn do not race for every one after it.
TURN_SECONDS = 0.05
# How often the runs this process waits for are checked (s of the executor's clock).
CHECK_SECONDS = 0.1
RELEASED = "handed back by its worker as it shut down (its handler may have had its effect)"
# A worker's presence on its queues is written at most this often (s of the clock), and
# forgotten once it has not been seen for this long (s).
MARK_SECONDS = 1.0
FORGET_SECONDS = 3600.0
# The outcome of a run withdrawn because its queue had no live worker (never a row's: the
# row is deleted as it is withdrawn).
WITHDRAWN = "withdrawn"
NO_LIVE_WORKER = "queue {queue} had no live worker for {seconds:g} s"


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
    if outcome.kind == WITHDRAWN:  # never taken: nothing sent, the node is demoted
        return replace(failed(CallOutcome.NOT_SENT, outcome.message), demoted=True)
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


@dataclass(frozen=True)
class QueueState:
    """A queue as the executor sees it now: its live workers (seen within a run lease), the
    last time any of its workers was seen, its runs offered and taken, its limits, and its
    runs taken in the last whole second (across the cluster)."""

    queue: str
    live_workers: int = 0
    last_seen: datetime | None = None
    offered: int = 0
    taken: int = 0
    max_concurrency: int = 0
    max_calls_per_second: int = 0
    taken_last_second: int = 0

    @property
    def live(self) -> bool:
        return self.live_workers > 0


@dataclass
class QueuePolicy:
    """What the executor holds its queues to: how long a run may wait offered on a queue
    with no live worker before its node is demoted (ADR-0101), each declared queue's
    ``max_concurrency`` (``limits``) and ``max_calls_per_second`` (``rates``; 0 or absent:
    no limit; ADR-0108), and the fair order its runs are taken in (ADR-0109): the weights
    of the businesses the policy names (any other has ``default_weight``) and the
    businesses paused now (their runs stay offered)."""

    idle_seconds: float = 30.0
    limits: dict[str, int] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)
    default_weight: int = 1
    paused: Callable[[], Collection[str]] = tuple
    rates: dict[str, int] = field(default_factory=dict)


def withdrawable(
    offered_at: dict[RunKey, datetime], now: datetime, idle_seconds: float
) -> list[RunKey]:
    """The runs offered at least ``idle_seconds`` ago (their queue's liveness is checked
    by the statement that withdraws them)."""
    due = now - timedelta(seconds=idle_seconds)
    return sorted(key for key, at in offered_at.items() if at <= due)


class WorkerRuns:
    """The worker runs this executor process offers and waits for, and the worker-facing
    operations (:class:`dispo.executor.worker_servicer.WorkerServicer` serves them)."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        lease_seconds: float,
        policy: QueuePolicy | None = None,
        completes: Callable[[Sequence[Completion]], Awaitable[list[bool]]] | None = None,
    ) -> None:
        self.db = db
        # Where completions are written (the executor's commit port: group-committed);
        # None: each call's with a statement of its own.
        self.completes = completes
        self.clock = clock
        self.lease_seconds = lease_seconds
        self.policy = policy or QueuePolicy()
        # When each committed offer of this process was written (for the idle check).
        self.offered_at: dict[RunKey, datetime] = {}
        # When each worker's presence was last written by this process (clock time).
        self._marked: dict[str, datetime] = {}
        # The queues each worker polled this process for (its heartbeats mark them too: a
        # worker with no free credit does not poll, and is live all the same).
        self._serves: dict[str, tuple[str, ...]] = {}
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
            self.offered_at[key] = self.clock.now()
            self._offered.set()
            self._offered = asyncio.Event()
            outcome = await waiter
        finally:
            self.committed.discard(key)
            self.offered_at.pop(key, None)
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
        out (one statement; none when nothing waits), then the runs offered too long on a
        queue with no live worker withdrawn (a statement only when one was offered that
        long): their nodes are demoted (ADR-0101)."""
        keys = [key for key in self.waiting if key in self.committed]
        if not keys:
            return
        now = self.clock.now()
        async with self.db.connection() as conn:
            settled = await store.runs_settled_many(conn, keys, now)
        self.settle(settled)
        idle = [
            key
            for key in withdrawable(self.offered_at, now, self.policy.idle_seconds)
            if key in self.waiting
        ]
        if not idle:
            return
        async with self.db.connection() as conn:
            rows = await store.runs_withdraw_if_idle_many(
                conn,
                idle,
                now - timedelta(seconds=self.policy.idle_seconds),
                now - timedelta(seconds=self.lease_seconds),
            )
        for row in rows:
            log.warning(
                "worker run withdrawn: no live worker",
                task_id=row.task_id,
                node_id=row.node_id,
                queue=row.queue,
            )
        self.settle(
            {
                (row.task_id, row.node_id, row.attempt): Outcome(
                    WITHDRAWN,
                    None,
                    NO_LIVE_WORKER.format(queue=row.queue, seconds=self.policy.idle_seconds),
                )
                for row in rows
            }
        )

    async def queues(self) -> list[QueueState]:
        """Every queue with a limit, a worker seen or a run, as it is now."""
        now = self.clock.now()
        limits, rates = self.policy.limits, self.policy.rates
        async with self.db.connection() as conn:
            rows = await presence.queues_summary(conn, now - timedelta(seconds=self.lease_seconds))
            paces = await presence.queue_paces_many(conn, list(rates))
        found = {
            r.queue: QueueState(r.queue, r.live_workers, r.last_seen, r.offered, r.taken)
            for r in rows
        }
        for name in {*limits, *rates}:
            found.setdefault(name, QueueState(name))
        return [
            replace(
                found[name],
                max_concurrency=limits.get(name, 0),
                max_calls_per_second=rates.get(name, 0),
                taken_last_second=last_second(paces.get(name), now) if rates.get(name) else 0,
            )
            for name in sorted(found)
        ]

    async def mark(self, queues: Sequence[str], worker_id: str) -> None:
        """The worker is live on ``queues`` now (written at most every
        :data:`MARK_SECONDS` of the clock per worker)."""
        now = self.clock.now()
        last = self._marked.get(worker_id)
        if last is not None and now - last < timedelta(seconds=MARK_SECONDS):
            return
        if len(self._marked) > 10_000:  # workers long gone
            recent = timedelta(minutes=1)
            self._marked = {w: at for w, at in self._marked.items() if now - at < recent}
            self._serves = {w: q for w, q in self._serves.items() if w in self._marked}
        self._marked[worker_id] = now
        self._serves[worker_id] = tuple(queues)
        async with self.db.connection() as conn:
            await presence.presence_mark_many(
                conn,
                [(q, worker_id) for q in queues],
                now,
                now - timedelta(seconds=FORGET_SECONDS),
            )

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
            await self.mark(queues, worker_id)
            rows, turn = await self._take(queues, worker_id, max_runs, probe_queues)
            left = end - loop.time()
            if not rows and left > 0 and turn is not None:
                # Every queue's pace is spent: the next turn, not the next offer.
                wait = max(TURN_SECONDS, (turn - self.clock.now()).total_seconds())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.clock.sleep(wait), min(wait, left))
                continue
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

    async def _take(
        self, queues: Sequence[str], worker_id: str, max_runs: int, probe_queues: Sequence[str]
    ) -> tuple[list[Row], datetime | None]:
        """One try at taking runs; the queues with a limit are locked for it, so their
        taken runs are counted by one taker at a time (across executor processes). A paced
        queue (``rates``) gives what its pace leaves now, and the runs taken are counted in
        its row before the lock is let go. The runs taken, and, when every queue asked for
        is paced and spent, when the soonest of them has its next turn."""
        policy = self.policy
        limits = {q: policy.limits[q] for q in queues if policy.limits.get(q)}
        rates = {q: policy.rates[q] for q in queues if policy.rates.get(q)}
        now = self.clock.now()
        paused = policy.paused()

        async def take(conn: Conn, rooms: dict[str, int] | None = None) -> list[Row]:
            return await store.runs_take_many(
                conn, queues, worker_id, max_runs, now, self.lease_seconds, limits or None,
                probe_queues, policy.weights, policy.default_weight, paused, rooms,
            )  # fmt: skip

        if not limits and not rates:
            async with self.db.connection() as conn:
                return await take(conn), None
        async with self.db.transaction() as conn:
            await store.queues_lock_many(conn, [*limits, *rates])
            if not rates:
                return await take(conn), None
            paces = await presence.queue_paces_many(conn, list(rates))
            due = {q: turns(rate, now, paces.get(q)) for q, rate in rates.items()}
            rows = await take(conn, {q: t.room for q, t in due.items()})
            took = Counter(r.queue for r in rows if r.kind == "action" and r.queue in rates)
            await presence.queue_paces_put_if_later_many(
                conn, {q: counted(paces.get(q), now, n) for q, n in took.items()}
            )
        spent = [t.next for t in due.values() if t.next is not None]
        if len(spent) < len(set(queues)):
            return rows, None
        return rows, min(spent)

    # ``queues`` (below): the queues the caller may serve (None: every queue); a run of
    # another queue is not held by it.
    async def heartbeat(
        self, worker_id: str, keys: Sequence[RunKey], queues: Sequence[str] | None = None
    ) -> dict[RunKey, datetime]:
        serves = self._serves.get(worker_id)
        if serves:
            await self.mark(serves, worker_id)
        async with self.db.connection() as conn:
            return await store.runs_extend_if_held_many(
                conn, worker_id, keys, self.clock.now(), self.lease_seconds, queues
            )

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """Record each ``(run, worker_id, outcome, queue)`` whose worker still holds the run
        (of ``queue`` unless None; False in its place: refused, nothing written for it); the
        passes of this process waiting for the runs recorded have their outcomes at once,
        together, so the steps they take next share a flush."""
        if self.completes is not None:  # group-committed with the others under way
            recorded = await self.completes(completions)
        else:
            async with self.db.connection() as conn:
                recorded = await store.runs_complete_if_held_many(
                    conn, completions, self.clock.now()
                )
        self.settle(
            {
                key: outcome
                for (key, _, outcome, _), ok in zip(completions, recorded, strict=True)
                if ok
            }
        )
        return recorded

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
