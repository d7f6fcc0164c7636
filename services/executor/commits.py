"""Where a pass's database work commits. The runner's per-task loop calls the port,
:class:`Commits` (open a task, claim a node, record calls and take the next step, extend a
lease, publish progress); each of its calls is one item of a transaction in
:class:`Flushes`, which holds the transactions, each for a list of items, and the
statements they run (:mod:`dispo.executor.passes`, :mod:`dispo.executor.store`). Two
ways to run them, as River's completers (ADR-0088):

- :class:`GroupCommits`: the items waiting at a moment share one transaction and a few
  set-based statements (a :class:`~dispo.libs.batcher.Batcher` per kind, ADR-0022); a
  caller is answered once its transaction committed;
- :class:`InlineCommits`: each item its own transaction, a list of one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from dispo.executor.actions import Result
from dispo.executor.domain import NodeRun
from dispo.executor.failures import Move
from dispo.executor.passes import Opening, Pass, Passes, Step, Stepping, give_back
from dispo.executor.plan import NodeChange
from dispo.executor.slots import Slots
from dispo.executor.states import TaskState
from dispo.executor.store import node_runs, status_events, task_runs, worker_runs
from dispo.executor.store.worker_runs import Completion, Offer
from dispo.libs import metrics
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.batcher import Batcher
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.outbox import OutboxRelay, Staged

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Claim:
    """A node about to be called, claimed for its pass's lease owner ``owner``."""

    task_id: str
    node_id: str
    owner: str


@dataclass
class Recording:
    """A finished call and what to record for it: ``change`` (from RUNNING);
    ``recorded`` once the write committed."""

    node: NodeRun
    result: Result
    move: Move
    change: NodeChange
    took: float
    recorded: bool = False


@dataclass(frozen=True)
class Progress:
    """A running task's progress to publish, if ``owner`` still holds its lease."""

    task_id: str
    owner: str
    trace: str | None = None


@dataclass
class Advance:
    """A pass's finished calls to record, then (unless ``final``: the pass stops) its next
    step."""

    env: task_pb2.Task
    owner: str
    state: Pass
    calls: list[Recording]
    trace: str | None = None
    final: bool = False


class Commits(Protocol):
    """The port a pass writes through: each call is answered once its write committed."""

    async def open(self, opening: Opening) -> Step:
        """Record and lease the task, recover its interrupted nodes, take its first step."""
        ...

    async def claim(self, claim: Claim) -> node_runs.Claimed | None:
        """PENDING → RUNNING for a node about to be called (None: the claim was lost)."""
        ...

    async def advance(self, advance: Advance) -> Step:
        """Record a pass's finished calls, then take its next step."""
        ...

    async def extend(self, task_id: str, owner: str) -> datetime | None:
        """The lease's new end, or None where ``owner`` no longer holds it."""
        ...

    async def progress(self, progress: Progress) -> bool:
        """A running task's status event, written while its pass holds the lease."""
        ...

    async def outputs(self, task_id: str, node_ids: Sequence[str]) -> dict[str, bytes]:
        """The outputs these nodes of the task recorded (a read), by node id."""
        ...

    async def offer(self, offer: Offer) -> None:
        """A worker node's run offered on its queue (ADR-0099)."""
        ...

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """Workers' outcomes (a worker's call may carry several), each recorded if its
        worker still holds the run (False: refused, nothing written for it)."""
        ...


@dataclass
class Flushes:
    """The executor's transactions, each for a list of items (one result per item, in
    order; an item that fails alone has its exception in its place)."""

    db: Database
    relay: OutboxRelay
    clock: Clock
    passes: Passes
    lease_ttl: float

    async def open(self, openings: list[Opening]) -> Sequence[Step | BaseException]:
        """Open a pass over each task and take its first step, in one transaction
        (:meth:`Passes.open_many`); each pass's lease as the opening wrote it."""
        now = self.clock.now()
        staged = self.relay.staged()
        taken: list[Slots] = []
        try:
            async with self.db.transaction() as conn:
                steps = await self.passes.open_many(conn, openings, now, staged, taken)
        except BaseException:
            give_back(taken)
            raise
        self.relay.publish_committed(staged)
        until = now + timedelta(seconds=self.lease_ttl)  # as the opening wrote it
        for step in steps:
            if isinstance(step, Step):
                step.state.lease_until = until
        return steps

    async def outputs(self, wanted: list[tuple[str, Sequence[str]]]) -> Sequence[dict[str, bytes]]:
        """The outputs each ``(task_id, node_ids)`` asks for, read with one statement."""
        async with self.db.connection() as conn:
            tasks = sorted({task_id for task_id, _ in wanted})
            found = await node_runs.node_outputs_many(conn, [(t, None) for t in tasks])
        return [
            {n: raw for n, raw in found.get(task_id, {}).items() if n in node_ids}
            for task_id, node_ids in wanted
        ]

    async def offer(self, offers: list[Offer]) -> Sequence[None]:
        """Worker nodes' runs offered on their queues, with one statement."""
        async with self.db.connection() as conn:
            await worker_runs.runs_offer_many(conn, offers, self.clock.now())
        return [None] * len(offers)

    async def complete(self, completions: list[Completion]) -> Sequence[bool]:
        """Workers' outcomes, each recorded where its worker still holds the run, with one
        statement. A run completed twice in one flush is recorded once: the first in line
        (as if they came one after the other, the second is refused)."""
        async with self.db.connection() as conn:
            return await worker_runs.runs_complete_if_held_many(conn, completions, self.clock.now())

    async def progress(self, progress: list[Progress]) -> Sequence[bool]:
        """The running tasks' status events, in one transaction: each task locked, and
        published only while its pass still holds the lease (a task that settled in the
        meantime published it as its pass ended)."""
        now = self.clock.now()
        staged = self.relay.staged()
        async with self.db.transaction() as conn:
            rows, _ = await task_runs.tasks_lock_many(conn, [r.task_id for r in progress])
            live = {
                r.task_id
                for r in progress
                if (row := rows.get(r.task_id)) is not None
                and row.lease_owner == r.owner
                and row.status is TaskState.RUNNING
            }
            if live:
                traces = {r.task_id: r.trace for r in progress}
                await status_events.emit_status_many(conn, sorted(live), now, (), traces, staged)
        self.relay.publish_committed(staged)
        return [r.task_id in live for r in progress]

    async def extend(self, leases: list[tuple[str, str]]) -> Sequence[datetime | None]:
        """The leases due for a heartbeat, extended in one transaction: each one's new end,
        or None where its owner no longer holds it."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            extended = await task_runs.leases_extend_many(conn, leases, now, self.lease_ttl)
        until = now + timedelta(seconds=self.lease_ttl)
        return [until if lease in extended else None for lease in leases]

    async def advance(self, advances: list[Advance]) -> Sequence[Step | BaseException]:
        """Record the passes' finished calls and take their next steps, in one transaction:
        the task rows locked (in task_id order), each call's node moved from RUNNING under
        its run's owner, then :meth:`Passes.step_many` for the passes still holding their
        lease; one status event per task."""
        now = self.clock.now()
        staged = self.relay.staged()
        results: list[Step | BaseException | None] = [None] * len(advances)
        seen: set[str] = set()
        for i, a in enumerate(advances):
            if a.env.task_id in seen:  # one pass per task: a second is a bug, failed alone
                results[i] = RuntimeError(f"two passes of task {a.env.task_id} in one flush")
            seen.add(a.env.task_id)
        todo = [i for i, r in enumerate(results) if r is None]
        taken: list[Slots] = []
        try:
            recorded = await self._advance(advances, todo, results, now, staged, taken)
        except BaseException:
            give_back(taken)
            raise
        self.relay.publish_committed(staged)
        for i in todo:  # known once committed
            for c, ok in zip(advances[i].calls, recorded[i], strict=True):
                c.recorded = ok
        return [r if r is not None else Step(advances[i].state) for i, r in enumerate(results)]

    async def _advance(
        self,
        advances: list[Advance],
        todo: list[int],
        results: list[Step | BaseException | None],
        now: datetime,
        staged: Staged,
        taken: list[Slots],
    ) -> dict[int, list[bool]]:
        """The transaction of :meth:`advance`: fills ``results`` in; returns, by
        advance, which of its calls were recorded."""
        recorded: dict[int, list[bool]] = {}
        async with self.db.transaction() as conn:
            rows, _ = await task_runs.tasks_lock_many(conn, [advances[i].env.task_id for i in todo])
            changes = [c.change for i in todo for c in advances[i].calls]
            applied = iter(await node_runs.nodes_set_status_if_many(conn, changes))
            for i in todo:
                recorded[i] = [next(applied) for _ in advances[i].calls]
            # A worker node's run is forgotten with its record (that attempt's run only).
            runs = [
                (c.change.task_id, c.node.node_id, c.node.attempts)
                for i in todo
                for c in advances[i].calls
                if c.node.spec.kind == "worker"
            ]
            await worker_runs.runs_delete_many(conn, runs)
            stepping: list[int] = []
            steppings: list[Stepping] = []
            emitting: list[str] = []
            for i in todo:
                a = advances[i]
                row = rows.get(a.env.task_id)
                changed = any(recorded[i])
                if a.final or row is None or row.lease_owner != a.owner:
                    if not a.final:
                        results[i] = Step(a.state, lease_lost=True)
                    if changed or a.state.unreported:  # the pass stops: what it did, now
                        emitting.append(a.env.task_id)
                    continue
                row.envelope = a.env
                stepping.append(i)
                # Its nodes are read below, after every write of theirs in this transaction.
                steppings.append(
                    Stepping(a.env, a.owner, a.state, row, {}, changed, a.trace, nodes_current=True)
                )
            known = await node_runs.nodes_get_many(
                conn, [s.env for s in steppings], {s.env.task_id: s.state.nodes for s in steppings}
            )
            for s in steppings:
                s.nodes = known[s.env.task_id]
            stepped = await self.passes.step_many(conn, steppings, now, staged, taken)
            for i, step in zip(stepping, stepped, strict=True):
                results[i] = step
            if emitting:
                traces = {advances[i].env.task_id: advances[i].trace for i in todo}
                await status_events.emit_status_many(conn, emitting, now, (), traces, staged)
        return recorded

    async def claim(self, claims: list[Claim]) -> Sequence[node_runs.Claimed | None]:
        """PENDING → RUNNING for nodes about to be called that their step could not claim
        (no call slot was free then), in one transaction (the task rows locked first, in
        task_id order). A claim is its pass's progress (published by :meth:`_progress`).
        Returns each claim's new attempt counts (None: lost)."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            await task_runs.tasks_lock_many(conn, [c.task_id for c in claims])
            won = await node_runs.nodes_claim_if_pending_many(
                conn, [(c.task_id, c.node_id, c.owner) for c in claims], now
            )
        return [won.get((c.task_id, c.node_id, c.owner)) for c in claims]


def _one(results: Sequence[R | BaseException]) -> R:
    [result] = results
    if isinstance(result, BaseException):
        raise result
    return result


class InlineCommits:
    """Each item its own transaction: the flush of a list of one."""

    def __init__(self, flushes: Flushes) -> None:
        self.flushes = flushes

    async def open(self, opening: Opening) -> Step:
        return _one(await self.flushes.open([opening]))

    async def claim(self, claim: Claim) -> node_runs.Claimed | None:
        return _one(await self.flushes.claim([claim]))

    async def advance(self, advance: Advance) -> Step:
        return _one(await self.flushes.advance([advance]))

    async def extend(self, task_id: str, owner: str) -> datetime | None:
        return _one(await self.flushes.extend([(task_id, owner)]))

    async def progress(self, progress: Progress) -> bool:
        return _one(await self.flushes.progress([progress]))

    async def outputs(self, task_id: str, node_ids: Sequence[str]) -> dict[str, bytes]:
        return _one(await self.flushes.outputs([(task_id, node_ids)]))

    async def offer(self, offer: Offer) -> None:
        _one(await self.flushes.offer([offer]))

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """A call's completions, in one statement (a list of one for CompleteRun)."""
        return list(await self.flushes.complete(list(completions)))


class GroupCommits:
    """The items waiting at a moment share one transaction, one Batcher per kind: openings
    of task.create messages (one that cannot be opened fails alone), node claims, finished
    calls recorded with their pass's next step, lease heartbeats, progress events, the
    reads of the outputs a call's references need, worker runs offered, workers'
    completions."""

    def __init__(self, flushes: Flushes, max_items: int, concurrency: int) -> None:
        def group(
            name: str,
            flush: Callable[[list[T]], Awaitable[Sequence[R | BaseException]]],
            *,
            serial: bool = False,
        ) -> Batcher[T, R]:
            # serial: one flush at a time, and never halved (a heartbeat or progress event
            # that fails is tried again on its own schedule)
            return Batcher(
                name,
                flush,
                max_items=max_items,
                concurrency=1 if serial else concurrency,
                isolate=not serial,
                observe=metrics.group_commit_flushes(name),
            )

        self.openings: Batcher[Opening, Step] = group("task openings", flushes.open)
        self.claims: Batcher[Claim, node_runs.Claimed | None] = group("node claims", flushes.claim)
        self.advances: Batcher[Advance, Step] = group("pass steps", flushes.advance)
        self.extensions: Batcher[tuple[str, str], datetime | None] = group(
            "lease extensions", flushes.extend, serial=True
        )
        self.progress_events: Batcher[Progress, bool] = group(
            "progress events", flushes.progress, serial=True
        )
        self.output_reads: Batcher[tuple[str, Sequence[str]], dict[str, bytes]] = group(
            "output reads", flushes.outputs
        )
        self.offers: Batcher[Offer, None] = group("worker run offers", flushes.offer)
        self.completions: Batcher[Completion, bool] = group(
            "worker run completions", flushes.complete
        )

    async def open(self, opening: Opening) -> Step:
        return await self.openings.submit(opening)

    async def claim(self, claim: Claim) -> node_runs.Claimed | None:
        return await self.claims.submit(claim)

    async def advance(self, advance: Advance) -> Step:
        return await self.advances.submit(advance)

    async def extend(self, task_id: str, owner: str) -> datetime | None:
        return await self.extensions.submit((task_id, owner))

    async def progress(self, progress: Progress) -> bool:
        return await self.progress_events.submit(progress)

    async def outputs(self, task_id: str, node_ids: Sequence[str]) -> dict[str, bytes]:
        return await self.output_reads.submit((task_id, node_ids))

    async def offer(self, offer: Offer) -> None:
        await self.offers.submit(offer)

    async def complete(self, completions: Sequence[Completion]) -> list[bool]:
        """A call's completions queued together: they share flushes with every other
        call's under way (one statement for all of them, up to the flush's size)."""
        results = await self.completions.submit_all(completions)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [bool(r) for r in results]
