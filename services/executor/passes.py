"""The database side of a pass, for many tasks at once: open them (record the envelope,
take the lease, recover interrupted nodes, RUNNING) and take scheduling steps (apply a
cancel, doom nodes behind a failure, demote nodes behind an open breaker, run the ready
noop nodes, settle a task with nothing left to run), all in the caller's transaction with
the set-based statements of :mod:`dispo.executor.repository_many`.

The rules come from :mod:`dispo.executor.domain`; the per-task orchestration (launching
HTTP nodes, the loop, heartbeats) is :mod:`dispo.executor.runner`'s. A step for one task
is a step for a list of one: there is one implementation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dispo.executor import plan
from dispo.executor import repository as repo
from dispo.executor import repository_many as many
from dispo.executor.breaker import Breaker
from dispo.executor.domain import NodeRun
from dispo.executor.envelope import node_from_proto
from dispo.executor.plan import OpenPath
from dispo.executor.slots import Slots
from dispo.executor.states import TASK_ENDED, TASK_FINAL, NodeState, TaskState
from dispo.libs import metrics
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import ACK, Disposition, Nak
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.outbox import Staged
from sqlalchemy.ext.asyncio import AsyncConnection

log = get_logger(__name__)


@dataclass
class Pass:
    """What one pass over a task has done so far."""

    # The node calls under way, by node id (each ends with what to record for it).
    in_flight: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    attempted: set[str] = field(default_factory=set)
    ran: int = 0
    # Progress recorded but not yet published: node changes of a task that goes on
    # running. Its status event waits for the progress interval (``Executor._progress``),
    # or goes with the event of the pass's end, whichever comes first.
    unreported: bool = False
    progress_timer: asyncio.Task[Any] | None = None
    # The task's nodes as its last step had them: the next reads their states again from
    # the rows, and keeps the rest (spec, dependencies, key) rather than decode it again.
    nodes: dict[str, NodeRun] = field(default_factory=dict)
    # The task's lease as this pass last wrote it (opening, heartbeats): a call leaves only
    # while it runs beyond the send margin (``Executor._may_send``). ``lease_lost``: a
    # heartbeat found another owner, or none: nothing more is sent.
    lease_until: datetime | None = None
    lease_lost: bool = False

    def holds_lease(self, now: datetime, margin: float) -> bool:
        """Whether this pass's lease is proven to run at least ``margin`` seconds more."""
        return (
            not self.lease_lost
            and self.lease_until is not None
            and (self.lease_until - now).total_seconds() >= margin
        )


@dataclass
class Step:
    """What a step leaves the pass to do: launch nodes, or end with ``disposition``, or
    stop because the lease (or a node write) was lost to another executor. A node of
    ``launch`` that is RUNNING was claimed by the step (its downstream's call slot taken
    for it); a PENDING one is still to claim."""

    state: Pass
    launch: list[NodeRun] = field(default_factory=list)
    disposition: Disposition | None = None
    lease_lost: bool = False


@dataclass
class Stepping:
    """One task's input to a step: its row (locked in this transaction, leased to
    ``owner``), its nodes as just read, and whether nodes changed since the last status
    event."""

    env: task_pb2.Task
    owner: str
    state: Pass
    row: repo.TaskRow
    nodes: dict[str, NodeRun]
    changed: bool = False
    # The trace context of the message the pass serves (its events carry it).
    trace: str | None = None
    # ``nodes`` is what the task's node rows hold in this transaction (first recorded here
    # from its envelope, or read after the last write), kept so by the step's writes: its
    # snapshot need not read them again.
    nodes_current: bool = False


@dataclass(frozen=True)
class Opening:
    """A task.create to open a pass for, under the lease owner ``owner``, with the trace
    context it came with."""

    env: task_pb2.Task
    owner: str
    trace: str | None = None


class Passes:
    """Opening and stepping for the executor's breakers and lease TTL."""

    def __init__(
        self,
        breakers: dict[str, Breaker],
        lease_ttl: float,
        slots: dict[str, Slots] | None = None,
    ) -> None:
        self.breakers = breakers
        self.lease_ttl = lease_ttl
        # The downstreams' call slots: a step claims a ready HTTP node itself when its
        # downstream has one free (else the node is claimed on its own, once it has one).
        self.slots = slots or {}

    # ---- opening ------------------------------------------------------------------------
    async def open_many(
        self,
        conn: AsyncConnection,
        openings: Sequence[Opening],
        now: datetime,
        staged: Staged | None = None,
        taken: list[Slots] | None = None,
    ) -> list[Step | BaseException]:
        """Open a pass over each task and take its first step (``taken``: as for
        :meth:`step_many`). The common cases — a task
        first seen, or seen again at its recorded generation, free to lease — take a few
        statements for all of them; a task leased by another pass, finished, or seen at a
        stale generation is answered from its row; the rare ones (a redrive, a task
        cancelled, or cancelled before it arrived, a repeat of a task in the same batch) go
        one by one, each in a savepoint of the same transaction. The common cases' outbox
        rows are staged in ``staged`` (the rare ones', written in a savepoint that may roll
        back, are not: ``staged.unstaged`` says there may be some)."""
        first: dict[str, int] = {}
        for i, o in enumerate(openings):
            first.setdefault(o.env.task_id, i)
        # Insert first, then lock: both in task_id order, so two executors opening
        # overlapping batches wait for each other but never deadlock (a row another
        # transaction is inserting is waited for by the insert, and is visible, committed,
        # to the lock that follows). A task seen again is read first without a lock: one
        # leased by another pass, finished or stale is answered from that read (those
        # facts only move forward), so its row is not held here while the pass owning it
        # needs it; the others are locked, and looked at again under the lock.
        # A task first seen is recorded already opened by its pass (leased, RUNNING).
        # A task first seen steps on its nodes as its envelope states them: made once,
        # for the insert and the step.
        stated = {
            tid: {n.node_id: node_from_proto(n) for n in openings[i].env.nodes}
            for tid, i in first.items()
        }
        inserted = await many.tasks_insert_many(
            conn,
            [(openings[i].env, openings[i].owner) for i in first.values()],
            now,
            self.lease_ttl,
            stated,
        )
        fast: list[int] = []
        slow: list[int] = []
        results: list[Step | BaseException | None] = [None] * len(openings)
        again = [t for t in first if t not in inserted]
        seen, seen_bare = await many.tasks_lock_many(conn, again, lock=False)
        to_lock = []
        for tid in again:
            o = openings[first[tid]]
            found = self._classify(o, seen.get(tid), tid in seen_bare, now)
            if isinstance(found, OpenPath):
                to_lock.append(tid)
            else:
                results[first[tid]] = Step(Pass(), disposition=found)
        rows, bare = await many.tasks_lock_many(conn, to_lock)
        for i, o in enumerate(openings):
            tid = o.env.task_id
            if first[tid] != i:
                slow.append(i)  # a repeat in this batch: after the first, on its own
            elif tid in inserted:
                fast.append(i)
            elif results[i] is None:
                found = self._classify(o, rows.get(tid), tid in bare, now)
                if isinstance(found, OpenPath):
                    (fast if found is OpenPath.FAST else slow).append(i)
                else:
                    results[i] = Step(Pass(), disposition=found)
        opened = inserted | await many.tasks_open_many(
            conn,
            [
                (openings[i].env.task_id, openings[i].owner)
                for i in fast
                if openings[i].env.task_id not in inserted
            ],
            now,
            self.lease_ttl,
        )
        known = await many.nodes_get_many(
            conn, [openings[i].env for i in fast if openings[i].env.task_id not in inserted]
        )
        steppings: list[Stepping] = []
        stepped: list[int] = []
        for i in fast:
            o = openings[i]
            tid = o.env.task_id
            if tid not in opened:  # the row is locked here: another writer cannot have won
                log.warning("task lease not taken; later", task_id=tid)
                results[i] = Step(Pass(), disposition=Nak(delay=1.0))
                continue
            row = rows.get(tid) or repo.TaskRow(
                tid, TaskState.ACCEPTED, o.env.generation, 0, o.env.cancel_requested,
                None, None, None, "",
            )  # fmt: skip
            # as tasks_open_many (or the insert) left it, locked until commit
            row.envelope, row.lease_owner, row.status = o.env, o.owner, TaskState.RUNNING
            row.status_reason = ""
            fresh = tid not in known
            if fresh:  # recorded just now, as the envelope says
                nodes = stated[tid]
                changed = False
            else:
                nodes = known[tid]
                changed = await recover(conn, tid, nodes, now)
            # Recovery writes more than it keeps in ``nodes``: then its snapshot reads them.
            current = fresh or not changed
            steppings.append(
                Stepping(o.env, o.owner, Pass(), row, nodes, changed, o.trace, current)
            )
            stepped.append(i)
        for i, step in zip(
            stepped, await self.step_many(conn, steppings, now, staged, taken), strict=True
        ):
            results[i] = step
        if slow and staged is not None:
            staged.unstaged = True
        for i in slow:
            results[i] = await self._open_one(conn, openings[i], now, taken)
        return [r if r is not None else RuntimeError("not opened") for r in results]

    async def _open_one(
        self,
        conn: AsyncConnection,
        opening: Opening,
        now: datetime,
        taken: list[Slots] | None = None,
    ) -> Step | BaseException:
        # Its own slots, given back if its savepoint rolls back.
        mine: list[Slots] | None = [] if taken is not None else None
        try:
            async with conn.begin_nested():
                opened = await self.open_one(conn, opening.env, opening.owner, now, opening.trace)
                if not isinstance(opened, tuple):
                    return Step(Pass(), disposition=opened)
                row, nodes, recovered = opened
                [step] = await self.step_many(
                    conn,
                    [
                        Stepping(
                            opening.env,
                            opening.owner,
                            Pass(),
                            row,
                            nodes,
                            recovered,
                            opening.trace,
                            nodes_current=not recovered,
                        )  # fmt: skip
                    ],
                    now,
                    taken=mine,
                )
        except Exception as error:
            give_back(mine or [])
            return error
        if taken is not None and mine:
            taken.extend(mine)
        return step

    async def open_one(
        self,
        conn: AsyncConnection,
        env: task_pb2.Task,
        owner: str,
        now: datetime,
        trace: str | None = None,
    ) -> Disposition | tuple[repo.TaskRow, dict[str, NodeRun], bool]:
        """Record the envelope, take the lease, recover interrupted nodes, for one task, in
        every case (a status event written here carries ``trace``). Returns a disposition when there is nothing to run, else the task row
        (locked, leased to ``owner``), its nodes and whether recovery changed nodes."""
        task_id = env.task_id
        row = await repo.task_get(conn, task_id, for_update=True)
        resumed = False
        if row is None:
            if await repo.task_insert(conn, env, task_id, now):  # ours and locked: as written
                row = repo.TaskRow(
                    task_id, TaskState.ACCEPTED, env.generation, 0, env.cancel_requested,
                    None, None, env, "",
                )  # fmt: skip
        elif row.envelope is None:
            await repo.task_attach_envelope(conn, env)
            row = None
        elif env.generation < row.generation:
            return self._stale(env, row)
        elif env.generation > row.generation and row.status not in TASK_FINAL:
            resumed = row.status is TaskState.FAILED  # an operator's resume
            reset = await repo.nodes_redrive(conn, env)
            log.info(
                "redrive applied",
                task_id=task_id,
                generation=env.generation,
                nodes_reset=reset,
                settled=list(env.redrive.settled_nodes),
            )
            row = None
        if row is None:  # written here (or inserted by a concurrent cancel): read it back
            row = await repo.task_get(conn, task_id, for_update=True)
        assert row is not None and row.envelope is not None
        if row.status in TASK_ENDED and not resumed:
            if row.status is TaskState.CANCELLED:  # the cancel arrived before the task
                nodes = await repo.nodes_get(conn, row.envelope)
                pending = [n for n in nodes.values() if n.status is NodeState.PENDING]
                for node in pending:
                    await repo.node_set_status_if(
                        conn,
                        task_id,
                        node.node_id,
                        NodeState.PENDING,
                        NodeState.CANCELLED,
                        finished_at=now,
                    )
                if pending:
                    await repo.emit_status(conn, task_id, now, trace)
            return ACK
        if row.leased_by_other(owner, now):
            return self._leased(row, now)
        if not await many.tasks_open_many(conn, [(task_id, owner)], now, self.lease_ttl):
            log.warning("task lease not taken; later", task_id=task_id)
            return Nak(delay=1.0)
        # as tasks_open_many left it, locked until commit
        row.lease_owner, row.status, row.status_reason = owner, TaskState.RUNNING, ""
        nodes = await repo.nodes_get(conn, row.envelope)
        recovered = await recover(conn, task_id, nodes, now)
        return row, nodes, recovered

    def _classify(
        self, o: Opening, row: repo.TaskRow | None, bare: bool, now: datetime
    ) -> OpenPath | Disposition:
        """How to open a task recorded before (:func:`plan.classify`), or the answer at once."""
        found = plan.classify(o.env.generation, o.owner, row, bare, now, self.lease_ttl)
        if isinstance(found, OpenPath):
            return found
        assert row is not None
        log.info(
            found.why,
            task_id=o.env.task_id,
            generation=o.env.generation,
            recorded=row.generation,
            owner=row.lease_owner,
        )
        return found.disposition

    @staticmethod
    def _stale(env: task_pb2.Task, row: repo.TaskRow) -> Disposition:
        log.info(
            "stale task.create dropped",
            task_id=env.task_id,
            generation=env.generation,
            recorded=row.generation,
        )
        return ACK

    def _leased(self, row: repo.TaskRow, now: datetime) -> Disposition:
        """Another pass holds the task: come back when its lease would expire."""
        log.info(
            "task leased by another executor; later", task_id=row.task_id, owner=row.lease_owner
        )
        return plan.leased(row, now, self.lease_ttl)

    # ---- stepping -----------------------------------------------------------------------
    async def step_many(
        self,
        conn: AsyncConnection,
        items: Sequence[Stepping],
        now: datetime,
        staged: Staged | None = None,
        taken: list[Slots] | None = None,
    ) -> list[Step]:
        """One scheduling step for each task, in the caller's transaction: apply a cancel,
        doom nodes behind a failure, demote nodes behind an open breaker, pick the ready
        ones; with nothing ready and nothing in flight, settle the task.

        ``noop`` nodes make no external call, so they are claimed and recorded right here,
        under the task's lock and lease, in one write (the same guard as any node's claim);
        what they unblock is scheduled in the same step. A node write that loses its race
        (impossible while the lock and lease hold) ends that task's pass.

        A settled task's status event is written with its settle (staged in ``staged``, if
        given). A task that goes on running publishes nothing here: its changes are its
        pass's progress (``Pass.unreported``), published by ``Executor._progress`` once the
        progress interval has passed, or with the settle if that comes first (ADR-0059).

        With ``taken`` given, a ready HTTP node whose downstream has a call slot free is
        claimed here too (PENDING → RUNNING, in the same write as any claim), in this step's
        transaction rather than one of its own; the slots are added to ``taken``, which the
        caller gives back if the transaction does not commit (else each belongs to its
        node's call)."""
        steps: list[Step | None] = [None] * len(items)
        launch: dict[int, list[NodeRun]] = {}
        for it in items:
            it.state.nodes = it.nodes
        active = list(range(len(items)))
        while active:
            changes: list[tuple[int, plan.NodeChange, NodeRun]] = []
            noops: list[tuple[int, NodeRun]] = []
            for i in active:
                it = items[i]
                round_ = plan.plan_round(
                    it.env.task_id,
                    it.nodes,
                    it.row.cancel_requested,
                    it.state.in_flight,
                    it.state.attempted,
                    self.breakers,
                    now,
                )
                for node in round_.demoted:
                    metrics.node_demoted(node.action, node.spec.downstream)
                launch[i] = round_.launch
                changes.extend((i, change, node) for change, node in round_.writes)
                noops.extend((i, node) for node in round_.noops)
            lost = await self._apply(conn, items, changes)
            claims = [
                (items[i].env.task_id, node.node_id, items[i].owner)
                for i, node in noops
                if i not in lost
            ]
            won = await many.nodes_run_noop_many(conn, claims, now)
            for i, node in noops:
                if i in lost:
                    continue
                items[i].state.attempted.add(node.node_id)
                claim = won.get((items[i].env.task_id, node.node_id, items[i].owner))
                if claim is None:
                    log.info("node claim lost", task_id=items[i].env.task_id, node_id=node.node_id)
                    continue
                node.status, node.started_at, node.not_before = NodeState.SUCCEEDED, now, None
                node.attempts, node.round_attempts = claim.attempts, claim.round_attempts
                node.finished_at, node.last_error, node.retryable = now, "", False
                items[i].changed = True
                items[i].state.ran += 1
            for i in lost:
                steps[i] = Step(items[i].state, lease_lost=True)
            active = sorted({i for i, _ in noops} - lost)
        await self._claim_ready(conn, items, steps, launch, now, taken)
        settling = [
            i
            for i in range(len(items))
            if steps[i] is None and not launch[i] and not items[i].state.in_flight
        ]
        decided = [
            plan.settle(
                plan.Settling(
                    items[i].env.task_id,
                    items[i].owner,
                    items[i].nodes,
                    items[i].row.cancel_requested,
                    items[i].row.generation,
                    items[i].state.ran,
                    items[i].changed or items[i].state.unreported,
                ),
                now,
            )
            for i in settling
        ]
        task_writes = [d.write for d in decided]
        events = [(d.write.task_id, *d.event) for d in decided if d.event is not None]
        for d in decided:
            if d.next is not None:
                log.info(
                    "task pass done",
                    task_id=d.write.task_id,
                    next=d.next.value,
                    status=d.status.value if d.status else None,
                    reason=d.reason,
                )
        settled = set(settling)
        for i, it in enumerate(items):
            if steps[i] is None and i not in settled and it.changed:
                it.state.unreported = True
        # One write for the settled tasks, with their events.
        written: set[str] = set()
        if task_writes:
            written = set(
                await many.tasks_write_many(
                    conn,
                    task_writes,
                    {it.env.task_id: it.row for it in items},
                    now,
                    events,
                    {it.env.task_id: it.trace for it in items},
                    staged,
                    {it.env.task_id: it.nodes for it in items if it.nodes_current},
                )
            )
        for k, i in enumerate(settling):  # the settlements come first
            disposition = decided[k].disposition
            if task_writes[k].task_id not in written:  # locked here: another writer cannot have won
                log.warning("task settle lost a race (lease lost?)", task_id=task_writes[k].task_id)
                disposition = Nak(delay=1.0)
            steps[i] = Step(items[i].state, disposition=disposition)
        return [
            step if step is not None else Step(items[i].state, launch=launch[i])
            for i, step in enumerate(steps)
        ]

    async def _claim_ready(
        self,
        conn: AsyncConnection,
        items: Sequence[Stepping],
        steps: Sequence[Step | None],
        launch: dict[int, list[NodeRun]],
        now: datetime,
        taken: list[Slots] | None,
    ) -> None:
        """Claim the nodes to launch whose downstream has a call slot free now, taking it
        (see :meth:`step_many`): each becomes RUNNING. A claim lost (impossible while the
        lock and lease hold) gives its slot back and drops the node from the launch."""
        if taken is None:
            return
        picks: list[tuple[int, NodeRun, Slots]] = []
        for i, nodes in launch.items():
            if steps[i] is not None:
                continue
            for node in nodes:
                slots = self.slots.get(node.spec.downstream)
                if slots is not None and await slots.take_now():
                    taken.append(slots)
                    picks.append((i, node, slots))
        won = await many.nodes_claim_if_pending_many(
            conn,
            [(items[i].env.task_id, node.node_id, items[i].owner) for i, node, _ in picks],
            now,
        )
        for i, node, slots in picks:
            claim = won.get((items[i].env.task_id, node.node_id, items[i].owner))
            if claim is None:
                log.info("node claim lost", task_id=items[i].env.task_id, node_id=node.node_id)
                taken.remove(slots)
                slots.give_back()
                launch[i].remove(node)
                continue
            node.status, node.started_at, node.not_before = NodeState.RUNNING, now, None
            node.attempts, node.round_attempts = claim.attempts, claim.round_attempts
            node.finished_at = None
            items[i].changed = True

    @staticmethod
    async def _apply(
        conn: AsyncConnection,
        items: Sequence[Stepping],
        changes: list[tuple[int, plan.NodeChange, NodeRun]],
    ) -> set[int]:
        """Write the planned node changes; returns the items of which a write lost its race."""
        applied = await many.nodes_set_status_if_many(conn, [c for _, c, _ in changes])
        lost: set[int] = set()
        for (i, change, _), ok in zip(changes, applied, strict=True):
            if ok:
                items[i].changed = True
            else:
                log.warning(
                    "node write lost a race; pass stopped",
                    task_id=change.task_id,
                    node_id=change.node_id,
                    expected=change.expected.value,
                )
                lost.add(i)
        return lost


async def recover(
    conn: AsyncConnection, task_id: str, nodes: dict[str, NodeRun], now: datetime
) -> bool:
    """Nodes left RUNNING by an executor whose lease expired: their call may have happened."""
    recovered = False
    for node in nodes.values():
        if node.status is not NodeState.RUNNING:
            continue
        await outcome_unknown(conn, task_id, node, now, "executor stopped mid-call")
        log.warning(
            "interrupted node recovered",
            task_id=task_id,
            node_id=node.node_id,
            status=node.status.value,
        )
        recovered = True
    return recovered


async def outcome_unknown(
    conn: AsyncConnection,
    task_id: str,
    node: NodeRun,
    now: datetime,
    why: str,
    *,
    owner: str | None = None,
    not_before: datetime | None = None,
) -> bool:
    """A RUNNING node whose call may have had its effect without its result being recorded
    (the executor stopped mid-call, or the call's outcome was ambiguous) becomes UNKNOWN.
    An idempotent action is then run again under the same idempotency key (→ PENDING; a
    short retry not before ``not_before`` when given, else at once); any other stays UNKNOWN, never sent again by the executor, until
    the reconciler settles it by its status probe or an operator decides. ``owner`` guards
    the move by the node's runner; False when the node was not RUNNING (under ``owner``).
    Sets ``node.status``."""
    if node.spec.idempotent:
        err = truncate_error(f"re-run under the same idempotency key (idempotent): {why}")
        if not await repo.node_set_status_if(
            conn, task_id, node.node_id, NodeState.RUNNING, NodeState.UNKNOWN,
            owner=owner, last_error=err,
        ):  # fmt: skip
            return False
        fields: dict[str, Any] = {}
        if not_before is not None:  # a short retry, as after any retryable failure
            fields = {"not_before": not_before, "retryable": True}
        await repo.node_set_status_if(
            conn, task_id, node.node_id, NodeState.UNKNOWN, NodeState.PENDING, **fields
        )
        node.status = NodeState.PENDING
        return True
    err = truncate_error(f"outcome unknown until settled (status probe or operator): {why}")
    if not await repo.node_set_status_if(
        conn, task_id, node.node_id, NodeState.RUNNING, NodeState.UNKNOWN,
        owner=owner, last_error=err, finished_at=now,
    ):  # fmt: skip
        return False
    node.status = NodeState.UNKNOWN
    return True


def give_back(taken: Sequence[Slots]) -> None:
    """Return the call slots of claims that were not committed."""
    for slots in taken:
        slots.give_back()
