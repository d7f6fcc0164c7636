"""Control messages for tasks the executor may not be running right now: task.cancel and
task.signal and task.erase (from the gateway) and task.close (from the reconciler); and the sweep of the
wait nodes whose timeout has passed (ADR-0102)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dispo.executor import waits
from dispo.executor.domain import Next, decide, to_cancel
from dispo.executor.plan import NodeChange, TaskStatusChange
from dispo.executor.runner import Executor
from dispo.executor.states import TASK_ENDED, TASK_FINAL, NodeState, TaskState
from dispo.executor.store import erasure, node_runs, signals, status_events, task_runs
from dispo.executor.store.rows import TaskRow
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import ACK, Bus, Disposition, Nak, StreamUnavailable
from dispo.libs.contracts import tasks
from dispo.libs.db.driver import Conn
from dispo.libs.erasure import erase_task
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.payload import payload_data
from dispo.libs.tracing import current

log = get_logger(__name__)


async def _locked(conn: Conn, task_id: str) -> TaskRow | None:
    """The task's row with its envelope, locked."""
    rows, _ = await task_runs.tasks_lock_many(conn, [task_id], envelopes=True)
    return rows.get(task_id)


async def handle_close(
    ex: Executor, task_id: str, reason: str, generation: int, version: int = 0
) -> Disposition:
    """The reconciler ended a parked task: record FAILED unless a redrive overtook it, end
    the nodes that can no longer run (``tasks.CLOSED_NODE``: the closer's snapshot shows
    them so), and number the next snapshot after the closer's (``version``)."""
    now = ex.clock.now()
    reason = truncate_error(reason or "closed")
    async with ex.db.transaction() as conn:
        row = await _locked(conn, task_id)
        if row is None or row.generation > generation:
            return ACK
        parked = (TaskState.RETRY_EXHAUSTED, TaskState.DEMOTED)
        close = TaskStatusChange(task_id, parked, TaskState.FAILED, reason)
        if not await task_runs.tasks_set_status_if_many(conn, [close], now):
            return ACK
        changes = []
        if row.envelope is not None:
            nodes = (await node_runs.nodes_get_many(conn, [row.envelope]))[task_id]
            for node in nodes.values():
                new = tasks.CLOSED_NODE.get(node.status.to_proto())
                if new is not None:
                    fields = {
                        "finished_at": now,
                        "last_error": tasks.closed_node_error(new, reason),
                        "retryable": node.status is NodeState.DEMOTED,
                    }
                    to = NodeState.from_proto(new)
                    changes.append(NodeChange(task_id, node.node_id, node.status, to, None, fields))
        applied = await node_runs.nodes_set_status_if_many(conn, changes)
        ended = [c.node_id for c, done in zip(changes, applied, strict=True) if done]
        await task_runs.tasks_version_at_least_many(conn, [(task_id, version)])
    log.info("parked task closed", task_id=task_id, reason=reason, nodes_ended=ended)
    return ACK


# A task.erase for a run not finished here yet (a resume got there first) comes back then.
ERASE_RETRY_SECONDS = 5.0


async def handle_erase(ex: Executor, task_id: str, bus: Bus) -> Disposition:
    """The gateway erased a finished task: its run's payloads, outputs and errors become
    tombstones, and its status snapshots (which carry its nodes' paths and errors) are
    purged from the status stream (ADR-0113). A run this executor never recorded has nothing
    to erase; one not finished here, or a stream that cannot purge now, is asked again
    later."""
    async with ex.db.transaction() as conn:
        row = await _locked(conn, task_id)
        if row is None:
            return ACK
        if row.status not in task_runs.FINISHED:
            return Nak(ERASE_RETRY_SECONDS)
        envelope = None if row.envelope is None else erase_task(row.envelope).SerializeToString()
        await erasure.tasks_erase_if_finished_many(conn, [(task_id, envelope)])
    try:
        await bus.purge_subject(tasks.TASK_STATUS.name, tasks.task_status_all(task_id))
    except StreamUnavailable:
        return Nak(ERASE_RETRY_SECONDS)
    log.info("task erased", task_id=task_id)
    return ACK


async def handle_cancel(ex: Executor, task_id: str) -> Disposition:
    """Pending (and parked) nodes become CANCELLED; a running pass sees the flag itself."""
    now = ex.clock.now()
    async with ex.db.transaction() as conn:
        row = await _locked(conn, task_id)
        if row is None:
            reason = "cancelled before start"
            if await task_runs.tasks_insert_cancelled_many(conn, [task_id], reason, now):
                # No status event yet: it would carry no nodes. The task.create, if it ever
                # comes, records the nodes CANCELLED and reports them.
                return ACK
            row = await _locked(conn, task_id)  # recorded meanwhile by its task.create
            assert row is not None
        if row.status in TASK_ENDED:
            return ACK
        await task_runs.tasks_request_cancel_many(conn, [task_id])
        trace = {task_id: current()}
        if row.leased_by_other("", now) or row.envelope is None:
            # The running pass sees the flag between rounds.
            await status_events.emit_status_many(conn, [task_id], now, (), trace)
            return ACK
        nodes = (await node_runs.nodes_get_many(conn, [row.envelope]))[task_id]
        changes = [
            NodeChange(task_id, node_id, nodes[node_id].status, NodeState.CANCELLED, None,
                       {"finished_at": now})
            for node_id in to_cancel(nodes)
        ]  # fmt: skip
        for change, done in zip(
            changes, await node_runs.nodes_set_status_if_many(conn, changes), strict=True
        ):
            if done:
                nodes[change.node_id].status = NodeState.CANCELLED
        decision = decide(nodes, now, True)
        if decision.next is Next.FINISH and decision.status is not None:
            finish = TaskStatusChange(task_id, (row.status,), decision.status, decision.reason)
            await task_runs.tasks_set_status_if_many(conn, [finish], now)
        await status_events.emit_status_many(conn, [task_id], now, (), trace)
    ex.relay.kick()
    return ACK


# A signal for a task whose task.create this executor has not recorded yet comes back
# after this many seconds (it is kept on the stream until then).
SIGNAL_EARLY_DELAY = 1.0
# The most tasks one sweep of wait timeouts takes (the next sweep takes the rest).
SWEEP_LIMIT = 500


async def handle_signal(ex: Executor, request: task_pb2.SignalRequest) -> Disposition:
    """Record a task's signal once per signal id, under the task's row lock; a node WAITING
    for its name takes it at once (SUCCEEDED, its payload the output) and the task is
    resumed; else it is kept until a node starts waiting for it (which reads it under the
    same lock, :meth:`~dispo.executor.passes.Passes.step_many`)."""
    now = ex.clock.now()
    task_id = request.task_id
    signal = waits.Signal(task_id, request.signal_id, request.signal, payload_data(request.payload))
    async with ex.db.transaction() as conn:
        row = await _locked(conn, task_id)
        if row is None:  # its task.create is not recorded here yet
            return Nak(delay=SIGNAL_EARLY_DELAY)
        if row.envelope is None:  # cancelled before its task.create came: nothing waits
            return ACK
        if not await signals.signals_insert_many(conn, [signal], now):
            log.info("duplicate signal", task_id=task_id, signal_id=signal.signal_id)
            return ACK
        nodes = (await node_runs.nodes_get_many(conn, [row.envelope]))[task_id]
        waiting = [n for n in waits.waiting_nodes(nodes) if n.spec.signal == signal.signal]
        if row.status in TASK_FINAL or not waiting:
            log.info("signal kept until a node waits for it", task_id=task_id,
                     signal=signal.signal, signal_id=signal.signal_id)  # fmt: skip
            return ACK
        change = waits.signalled(task_id, waiting[0], signal.payload, now)
        [taken] = await node_runs.nodes_set_status_if_many(conn, [change])
        if taken:
            take = (task_id, signal.signal_id, change.node_id)
            await signals.signals_take_if_free_many(conn, [take], now)
            await signals.waits_delete_many(conn, [(task_id, change.node_id)])
            await _resume(conn, [task_id], now)
    log.info("signal taken", task_id=task_id, node_id=change.node_id,
             signal_id=signal.signal_id, status=change.new.value)  # fmt: skip
    ex.relay.kick()
    return ACK


async def sweep_timeouts(ex: Executor, limit: int = SWEEP_LIMIT) -> int:
    """The WAITING nodes whose time is up, of at most ``limit`` tasks: each FAILED or
    SUCCEEDED with its default output, as its ``on_timeout`` says (:func:`waits.timed_out`),
    and its task resumed. Returns the nodes moved."""
    now = ex.clock.now()
    async with ex.db.transaction() as conn:
        due = await signals.waits_due_many(conn, now, limit)
        if not due:
            return 0
        rows, _ = await task_runs.tasks_lock_many(conn, list(due), envelopes=True)
        envs = [row.envelope for row in rows.values() if row.envelope is not None]
        nodes = await node_runs.nodes_get_many(conn, envs)
        changes = [
            waits.timed_out(task_id, node, now)
            for task_id, runs in nodes.items()
            for node in waits.due(runs, now)
        ]
        applied = await node_runs.nodes_set_status_if_many(conn, changes)
        moved = [c for c, ok in zip(changes, applied, strict=True) if ok]
        # Every due wait read is done with: timed out here, or its node moved before.
        await signals.waits_delete_many(conn, [(t, n) for t, ns in due.items() for n in ns])
        await _resume(conn, sorted({c.task_id for c in moved}), now)
    for c in moved:
        log.info("wait timed out", task_id=c.task_id, node_id=c.node_id, status=c.new.value)
    ex.relay.kick()
    return len(moved)


async def _resume(conn: Conn, task_ids: Sequence[str], now: datetime) -> None:
    """Tasks whose wait nodes moved: a status event each, and a task.create of a new
    generation for each parked one (RUNNING without a live lease) to run what follows; a
    task with a live pass is left to it, a parked-with-the-reconciler one to its redrive."""
    if not task_ids:
        return
    resumed = await task_runs.tasks_resume_if_idle_many(conn, task_ids, now)
    events = [(t, tasks.TASK_CREATE, tasks.create_id(t, g)) for t, g in sorted(resumed.items())]
    traces = {t: current() for t in task_ids}
    await status_events.emit_status_many(conn, task_ids, now, events, traces)
