"""Control messages for tasks the executor may not be running right now: task.cancel
(from the gateway) and task.close (from the reconciler)."""

from __future__ import annotations

from dispo.executor.domain import Next, decide, to_cancel
from dispo.executor.plan import NodeChange, TaskStatusChange
from dispo.executor.runner import Executor
from dispo.executor.states import TASK_ENDED, NodeState, TaskState
from dispo.executor.store import node_runs, status_events, task_runs
from dispo.executor.store.rows import TaskRow
from dispo.libs.bus import ACK, Disposition
from dispo.libs.contracts import tasks
from dispo.libs.db.driver import Conn
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
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
