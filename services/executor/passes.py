"""The database side of a pass, for many tasks at once: open them (record the envelope,
take the lease, recover interrupted nodes, RUNNING) and take scheduling steps (apply a
cancel, doom nodes behind a failure, demote nodes behind an open breaker, run the ready
noop nodes, settle a task with nothing left to run), all in the caller's transaction with
the list-shaped statements of :mod:`dispo.executor.store`.

The decisions are :mod:`dispo.executor.plan`'s (pure); the per-task orchestration
(launching calls, the loop, heartbeats) is :mod:`dispo.executor.runner`'s. A step for one
task is a step for a list of one: there is one implementation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dispo.executor import plan, waits
from dispo.executor.breaker import Breaker
from dispo.executor.domain import Next, NodeRun, past_deadline
from dispo.executor.envelope import node_from_proto
from dispo.executor.per_business import BusinessLimits
from dispo.executor.plan import NodeChange, OpenPath
from dispo.executor.slots import Slots
from dispo.executor.states import NodeState, TaskState
from dispo.executor.store import node_runs, signals, status_events, task_runs, worker_runs
from dispo.executor.store.rows import TaskRow
from dispo.libs import metrics
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import ACK, Disposition, Nak
from dispo.libs.db.driver import Conn
from dispo.libs.logging import get_logger
from dispo.libs.outbox import Staged
from dispo.libs.timestamps import from_timestamp

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
    row: TaskRow
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
        business: BusinessLimits | None = None,
    ) -> None:
        self.breakers = breakers
        self.lease_ttl = lease_ttl
        # The downstreams' call slots: a step claims a ready HTTP node itself when its
        # downstream has one free, and its business's slot of it one too if the downstream
        # limits each business (else the node is claimed on its own, once it has them).
        self.slots = slots or {}
        self.business = business

    # ---- opening ------------------------------------------------------------------------
    async def open_many(
        self,
        conn: Conn,
        openings: Sequence[Opening],
        now: datetime,
        staged: Staged | None = None,
        taken: list[Slots] | None = None,
    ) -> list[Step]:
        """Open a pass over each task and take its first step (``taken``: as for
        :meth:`step_many`), a few statements for all of them whatever their case: a task
        first seen is recorded already opened (leased, RUNNING); one seen again is read
        first without a lock, and one leased by another pass, finished or stale is answered
        from that read (those facts only move forward), so its row is not held here while
        the pass owning it needs it; the others are locked and looked at again under the
        lock (:func:`plan.classify`): a redrive is applied, then the task opened with the
        rest; a cancelled task has its pending nodes cancelled (its envelope recorded first
        when the cancel came before it). Insert first, then lock, both in ``task_id``
        order: two executors opening overlapping batches wait for each other but never
        deadlock. The outbox rows written are staged in ``staged``."""
        results: list[Step | None] = [None] * len(openings)
        first: dict[str, int] = {}
        for i, o in enumerate(openings):
            if o.env.task_id in first:  # one pass per task in a process (Executor.in_hand)
                results[i] = Step(Pass(), disposition=Nak(delay=1.0))
            else:
                first[o.env.task_id] = i
        # A task first seen steps on its nodes as its envelope states them: made once, for
        # the insert and the step.
        stated = {
            tid: {n.node_id: node_from_proto(n) for n in openings[i].env.nodes}
            for tid, i in first.items()
        }
        inserted = await task_runs.tasks_insert_many(
            conn,
            [(openings[i].env, openings[i].owner) for i in first.values()],
            now,
            self.lease_ttl,
            stated,
        )
        again = [t for t in first if t not in inserted]
        seen, seen_bare = await task_runs.tasks_lock_many(conn, again, lock=False)
        to_lock = []
        for tid in again:
            found = self._classify(openings[first[tid]], seen.get(tid), tid in seen_bare, now)
            if isinstance(found, OpenPath):
                to_lock.append(tid)
            else:
                results[first[tid]] = Step(Pass(), disposition=found)
        rows, bare = await task_runs.tasks_lock_many(conn, to_lock)
        paths: dict[OpenPath, list[int]] = {path: [] for path in OpenPath}
        for tid in to_lock:
            i = first[tid]
            found = self._classify(openings[i], rows.get(tid), tid in bare, now)
            if isinstance(found, OpenPath):
                paths[found].append(i)
            else:
                results[i] = Step(Pass(), disposition=found)
        cancelled = [openings[i] for i in paths[OpenPath.CANCELLED]]
        await self._cancel_pending(conn, cancelled, bare, now, staged)
        for i in paths[OpenPath.CANCELLED]:
            results[i] = Step(Pass(), disposition=ACK)
        await self._redrive(conn, [openings[i] for i in paths[OpenPath.REDRIVE]], rows)
        for i in paths[OpenPath.REDRIVE]:
            row = rows[openings[i].env.task_id]
            if row.leased_by_other(openings[i].owner, now):
                results[i] = Step(Pass(), disposition=self._leased(row, now))
            else:
                paths[OpenPath.OPEN].append(i)
        opening = sorted([i for tid, i in first.items() if tid in inserted] + paths[OpenPath.OPEN])
        for i, step in zip(
            opening,
            await self._open(
                conn, [openings[i] for i in opening], inserted, rows, stated, now, staged, taken
            ),
            strict=True,
        ):
            results[i] = step
        return [r if r is not None else Step(Pass(), disposition=Nak(delay=1.0)) for r in results]

    async def _open(
        self,
        conn: Conn,
        openings: Sequence[Opening],
        inserted: set[str],
        rows: dict[str, TaskRow],
        stated: dict[str, dict[str, NodeRun]],
        now: datetime,
        staged: Staged | None,
        taken: list[Slots] | None,
    ) -> list[Step]:
        """Lease each task (those just inserted are leased already), recover the nodes an
        expired pass left RUNNING, and take the first step."""
        opened = inserted | await task_runs.tasks_open_many(
            conn,
            [(o.env.task_id, o.owner) for o in openings if o.env.task_id not in inserted],
            now,
            self.lease_ttl,
        )
        known = await node_runs.nodes_get_many(
            conn, [o.env for o in openings if o.env.task_id not in inserted]
        )
        recovered = await self._recover(conn, known, now)
        steps: dict[int, Step] = {}
        steppings: list[Stepping] = []
        stepped: list[int] = []
        for i, o in enumerate(openings):
            tid = o.env.task_id
            if tid not in opened:  # the row is locked here: another writer cannot have won
                log.warning("task lease not taken; later", task_id=tid)
                steps[i] = Step(Pass(), disposition=Nak(delay=1.0))
                continue
            row = rows.get(tid) or TaskRow(
                tid, TaskState.ACCEPTED, o.env.generation, 0, o.env.cancel_requested,
                None, None, None, "",
            )  # fmt: skip
            # as tasks_open_many (or the insert) left it, locked until commit
            row.envelope, row.lease_owner, row.status = o.env, o.owner, TaskState.RUNNING
            row.status_reason = ""
            fresh = tid not in known
            nodes = stated[tid] if fresh else known[tid]
            changed = tid in recovered
            # Recovery writes more than it keeps in ``nodes``: then its snapshot reads them.
            current = fresh or not changed
            steppings.append(
                Stepping(o.env, o.owner, Pass(), row, nodes, changed, o.trace, current)
            )
            stepped.append(i)
        for i, step in zip(
            stepped, await self.step_many(conn, steppings, now, staged, taken), strict=True
        ):
            steps[i] = step
        return [steps[i] for i in range(len(openings))]

    async def close_past_deadline(
        self, conn: Conn, rows: Sequence[TaskRow], owner: str, now: datetime, staged: Staged
    ) -> list[Step]:
        """Open a pass over each task (``rows``: locked here, with their envelopes, no pass
        holding them) and take its first step, which closes it: past its deadline a step
        closes the open nodes and settles the task FAILED (ADR-0103). The normal path of a
        pass, for a task no pass will come back to by itself (parked, or between passes)."""
        return await self._open(
            conn,
            [Opening(r.envelope, owner) for r in rows if r.envelope is not None],
            set(),
            {r.task_id: r for r in rows},
            {},
            now,
            staged,
            None,
        )

    @staticmethod
    async def _recover(conn: Conn, known: dict[str, dict[str, NodeRun]], now: datetime) -> set[str]:
        """Nodes left RUNNING by a pass whose lease expired: their call may have happened
        (:func:`plan.recover_changes`); a worker node's run is fenced in the same
        transaction (ADR-0099). Returns the tasks whose nodes changed."""
        changes = [c for tid, nodes in known.items() for c in plan.recover_changes(tid, nodes, now)]
        applied = await node_runs.nodes_set_status_if_many(conn, changes)
        # The run of a worker node is fenced with it: its worker's completion is refused.
        await worker_runs.runs_fence_many(
            conn,
            [
                c.key
                for c, ok in zip(changes, applied, strict=True)
                if ok and known[c.task_id][c.node_id].spec.kind == "worker"
            ],
        )
        recovered: set[str] = set()
        for change, ok in zip(changes, applied, strict=True):
            if ok:
                known[change.task_id][change.node_id].status = change.new
                recovered.add(change.task_id)
                log.warning(
                    "interrupted node recovered",
                    task_id=change.task_id,
                    node_id=change.node_id,
                    status=change.new.value,
                )
        return recovered

    @staticmethod
    async def _redrive(conn: Conn, redrives: Sequence[Opening], rows: dict[str, TaskRow]) -> None:
        """Apply each newer generation's redrive (:func:`apply_redrives`); the rows as it
        leaves them."""
        reset = await apply_redrives(conn, [o.env for o in redrives])
        for o in redrives:
            row = rows[o.env.task_id]
            row.generation = max(row.generation, o.env.generation)
            log.info(
                "redrive applied",
                task_id=o.env.task_id,
                generation=o.env.generation,
                nodes_reset=reset[o.env.task_id],
                settled=list(o.env.redrive.settled_nodes),
            )

    @staticmethod
    async def _cancel_pending(
        conn: Conn,
        cancelled: Sequence[Opening],
        bare: set[str],
        now: datetime,
        staged: Staged | None,
    ) -> None:
        """Tasks CANCELLED: the envelope recorded where the cancel came first, then every
        PENDING node CANCELLED, and a status event for each task whose nodes changed."""
        if not cancelled:
            return
        await task_runs.tasks_attach_envelopes_many(
            conn, [o.env for o in cancelled if o.env.task_id in bare]
        )
        nodes = await node_runs.nodes_get_many(conn, [o.env for o in cancelled])
        changes = [
            NodeChange(
                tid,
                node.node_id,
                NodeState.PENDING,
                NodeState.CANCELLED,
                None,
                {"finished_at": now},
            )
            for tid, runs in nodes.items()
            for node in runs.values()
            if node.status is NodeState.PENDING
        ]
        applied = await node_runs.nodes_set_status_if_many(conn, changes)
        emitting = sorted({c.task_id for c, ok in zip(changes, applied, strict=True) if ok})
        if emitting:
            traces = {o.env.task_id: o.trace for o in cancelled}
            await status_events.emit_status_many(conn, emitting, now, (), traces, staged)

    def _classify(
        self, o: Opening, row: TaskRow | None, bare: bool, now: datetime
    ) -> OpenPath | Disposition:
        """How to open a task recorded before (:func:`plan.classify`), or the answer at once."""
        found = plan.classify(o.env.generation, o.owner, row, bare, now, self.lease_ttl)
        if isinstance(found, OpenPath):
            return found
        assert row is not None
        log.debug(  # a redelivery or a newer generation: per message, not per task
            found.why,
            task_id=o.env.task_id,
            generation=o.env.generation,
            recorded=row.generation,
            owner=row.lease_owner,
        )
        return found.disposition

    def _leased(self, row: TaskRow, now: datetime) -> Disposition:
        """Another pass holds the task: come back when its lease would expire."""
        log.debug(
            "task leased by another executor; later", task_id=row.task_id, owner=row.lease_owner
        )
        return plan.leased(row, now, self.lease_ttl)

    # ---- stepping -----------------------------------------------------------------------
    async def step_many(
        self,
        conn: Conn,
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
            parking: list[tuple[int, NodeRun]] = []
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
                    task_past_deadline(it.env, now),
                )
                for node in round_.demoted:
                    metrics.node_demoted(node.action, node.spec.downstream)
                launch[i] = round_.launch
                changes.extend((i, change, node) for change, node in round_.writes)
                noops.extend((i, node) for node in round_.noops)
                parking.extend((i, node) for node in round_.waits)
            lost = await self._apply(conn, items, changes)
            signalled = await self._park(conn, items, [w for w in parking if w[0] not in lost], now)
            claims = [
                (items[i].env.task_id, node.node_id, items[i].owner)
                for i, node in noops
                if i not in lost
            ]
            won = await node_runs.nodes_run_noop_many(conn, claims, now)
            for i, node in noops:
                if i in lost:
                    continue
                items[i].state.attempted.add(node.node_id)
                claim = won.get((items[i].env.task_id, node.node_id, items[i].owner))
                if claim is None:
                    log.debug("node claim lost", task_id=items[i].env.task_id, node_id=node.node_id)
                    continue
                node.status, node.started_at, node.not_before = NodeState.SUCCEEDED, now, None
                node.attempts, node.round_attempts = claim.attempts, claim.round_attempts
                node.finished_at, node.last_error, node.retryable = now, "", False
                items[i].changed = True
                items[i].state.ran += 1
            for i in lost:
                steps[i] = Step(items[i].state, lease_lost=True)
            active = sorted(({i for i, _ in noops} | signalled) - lost)
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
                    task_past_deadline(items[i].env, now),
                ),
                now,
            )
            for i in settling
        ]
        task_writes = [d.write for d in decided]
        events = [(d.write.task_id, *d.event) for d in decided if d.event is not None]
        for d in decided:
            if d.next is not None:  # the task's line: where it goes; a short retry is a step
                (log.debug if d.next is Next.RETRY else log.info)(
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
                await status_events.tasks_write_many(
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

    @staticmethod
    async def _park(
        conn: Conn, items: Sequence[Stepping], parking: list[tuple[int, NodeRun]], now: datetime
    ) -> set[int]:
        """The ready wait nodes start waiting (:func:`waits.park`), and each takes at once a
        signal of its name recorded for its task before (ADR-0102): the task's row is locked
        in this transaction, as every signal's arrival locks it, so a signal is either read
        here or finds the node WAITING. Returns the items a node of which took a signal
        (its dependants may run in another round)."""
        if not parking:
            return set()
        parks = [waits.park(items[i].env.task_id, node, now) for i, node in parking]
        applied = await node_runs.nodes_set_status_if_many(conn, parks)
        parked: dict[int, list[NodeRun]] = {}
        for (i, node), change, ok in zip(parking, parks, applied, strict=True):
            items[i].state.attempted.add(node.node_id)
            if not ok:  # impossible while the lock and lease hold
                log.info("wait node not parked", task_id=change.task_id, node_id=node.node_id)
                continue
            _as_written(node, change)
            parked.setdefault(i, []).append(node)
            items[i].changed = True
            log.info("node waiting", task_id=change.task_id, node_id=node.node_id,
                     signal=node.spec.signal, until=change.fields["not_before"].isoformat())  # fmt: skip
        await signals.waits_insert_many(
            conn,
            [
                (items[i].env.task_id, n.node_id, n.not_before)
                for i, ns in parked.items()
                for n in ns
                if n.not_before is not None  # set by the park
            ],
        )
        free = await signals.signals_free_many(conn, [items[i].env.task_id for i in parked])
        pairs = [
            (i, node, signal)
            for i, nodes in parked.items()
            for node, signal in waits.match(nodes, free[items[i].env.task_id])
        ]
        takes = [
            waits.signalled(items[i].env.task_id, node, s.payload, now) for i, node, s in pairs
        ]
        taken = await node_runs.nodes_set_status_if_many(conn, takes)
        took = [
            (items[i].env.task_id, s.signal_id, node.node_id)
            for (i, node, s), ok in zip(pairs, taken, strict=True)
            if ok
        ]
        await signals.signals_take_if_free_many(conn, took, now)
        await signals.waits_delete_many(conn, [(t, n) for t, _, n in took])
        done: set[int] = set()
        for (i, node, s), change, ok in zip(pairs, takes, taken, strict=True):
            if ok:
                _as_written(node, change)
                done.add(i)
                log.info("signal taken", task_id=change.task_id, node_id=node.node_id,
                         signal_id=s.signal_id, status=change.new.value)  # fmt: skip
        return done

    async def _claim_ready(
        self,
        conn: Conn,
        items: Sequence[Stepping],
        steps: Sequence[Step | None],
        launch: dict[int, list[NodeRun]],
        now: datetime,
        taken: list[Slots] | None,
    ) -> None:
        """Claim the nodes to launch whose downstream has a call slot free now, taking it
        (see :meth:`step_many`), and the worker nodes to launch: each becomes RUNNING. A claim lost (impossible while the
        lock and lease hold) gives its slot back and drops the node from the launch."""
        if taken is None:
            return
        picks: list[tuple[int, NodeRun, list[Slots]]] = []
        for i, nodes in launch.items():
            if steps[i] is not None:
                continue
            for node in nodes:
                if node.spec.kind == "worker":  # no call slot: its queue bounds nothing yet
                    picks.append((i, node, []))
                    continue
                slots = self.slots.get(node.spec.downstream)
                if slots is None:
                    continue
                own = None
                if self.business is not None:
                    own = self.business.slots_of(node.spec.downstream, items[i].env.business)
                if own is not None and not await own.take_now():
                    continue
                if await slots.take_now():
                    pair = [slots] if own is None else [own, slots]
                    taken.extend(pair)
                    picks.append((i, node, pair))
                elif own is not None:
                    own.give_back()
        won = await node_runs.nodes_claim_if_pending_many(
            conn,
            [(items[i].env.task_id, node.node_id, items[i].owner) for i, node, _ in picks],
            now,
        )
        for i, node, pair in picks:
            claim = won.get((items[i].env.task_id, node.node_id, items[i].owner))
            if claim is None:
                log.debug("node claim lost", task_id=items[i].env.task_id, node_id=node.node_id)
                for slots in pair:
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
        conn: Conn,
        items: Sequence[Stepping],
        changes: list[tuple[int, plan.NodeChange, NodeRun]],
    ) -> set[int]:
        """Write the planned node changes; returns the items of which a write lost its race."""
        applied = await node_runs.nodes_set_status_if_many(conn, [c for _, c, _ in changes])
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


def _as_written(node: NodeRun, change: NodeChange) -> None:
    """``node`` as the row holds it once ``change`` is written."""
    node.status = change.new
    for name, value in change.fields.items():
        if name == "output":
            node.output_bytes = len(value)
        else:
            setattr(node, name, value)


async def apply_redrives(conn: Conn, envs: Sequence[task_pb2.Task]) -> dict[str, list[str]]:
    """Apply each newer generation's redrive (``env.redrive``) to the nodes recorded here
    (:func:`plan.redrive_changes`: each change from the recorded state, never the one the
    envelope states, guarded by it), clear the backoff of every PENDING node (it may run at
    once) and record the generation. Returns the nodes reset, by task id."""
    if not envs:
        return {}
    ids = [e.task_id for e in envs]
    here = await node_runs.node_states_lock_many(conn, ids)
    # The outputs workers' probes answered for the nodes settled SUCCEEDED (ADR-0100).
    settled = [(e.task_id, n) for e in envs for n in e.redrive.settled_nodes]
    probed = await worker_runs.runs_probe_outputs_many(conn, settled)
    changes = [
        c
        for e in envs
        for c in plan.redrive_changes(
            e.task_id,
            e.redrive.reset_nodes,
            e.redrive.settled_nodes,
            here.get(e.task_id, {}),
            {n: out for (t, n), out in probed.items() if t == e.task_id},
        )
    ]
    applied = await node_runs.nodes_set_status_if_many(conn, changes)
    await worker_runs.runs_fence_many(conn, settled)
    await node_runs.nodes_clear_backoff_many(conn, ids)
    await task_runs.tasks_set_generation_if_newer_many(conn, envs)
    reset: dict[str, list[str]] = {e.task_id: [] for e in envs}
    for change, ok in zip(changes, applied, strict=True):
        if ok and change.new is NodeState.PENDING:
            reset[change.task_id].append(change.node_id)
    return reset


def task_past_deadline(env: task_pb2.Task, now: datetime) -> bool:
    """Whether the task's deadline (its envelope's, ADR-0103) has passed at ``now``."""
    return past_deadline(from_timestamp(env.deadline, env.HasField("deadline")), now)


def give_back(taken: Sequence[Slots]) -> None:
    """Return the call slots of claims that were not committed."""
    for slots in taken:
        slots.give_back()
