"""Control messages for tasks the executor may not be running right now: task.cancel
(from the gateway) and task.close (from the reconciler)."""

from __future__ import annotations

from dispo.executor import repository as repo
from dispo.executor import repository_many as many
from dispo.executor.domain import Next, decide, to_cancel
from dispo.executor.plan import NodeChange
from dispo.executor.runner import Executor
from dispo.executor.states import TASK_ENDED, NodeState, TaskState
from dispo.libs.bus import ACK, Disposition
from dispo.libs.contracts import tasks
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.tracing import current

log = get_logger(__name__)


async def handle_close(
    ex: Executor, task_id: str, reason: str, generation: int, version: int = 0
) -> Disposition:
    """The reconciler ended a parked task: record FAILED unless a redrive overtook it, end
    the nodes that can no longer run (``tasks.CLOSED_NODE``: the closer's snapshot shows
    them so), and number the next snapshot after the closer's (``version``)."""
    now = ex.clock.now()
    reason = truncate_error(reason or "closed")
    async with ex.engine.begin() as conn:
        row = await repo.task_get(conn, task_id, for_update=True)
        if row is None or row.generation > generation:
            return ACK
        if not await repo.task_set_status(
            conn,
            task_id,
            TaskState.FAILED,
            reason,
            now,
            expected=(TaskState.RETRY_EXHAUSTED, TaskState.DEMOTED),
        ):
            return ACK
        changes = []
        if row.envelope is not None:
            for node in (await repo.nodes_get(conn, row.envelope)).values():
                new = tasks.CLOSED_NODE.get(node.status.to_proto())
                if new is not None:
                    fields = {
                        "finished_at": now,
                        "last_error": tasks.closed_node_error(new, reason),
                        "retryable": node.status is NodeState.DEMOTED,
                    }
                    to = NodeState.from_proto(new)
                    changes.append(NodeChange(task_id, node.node_id, node.status, to, None, fields))
        applied = await many.nodes_set_status_if_many(conn, changes)
        ended = [c.node_id for c, done in zip(changes, applied, strict=True) if done]
        await repo.task_version_at_least(conn, task_id, version)
    log.info("parked task closed", task_id=task_id, reason=reason, nodes_ended=ended)
    return ACK


async def handle_cancel(ex: Executor, task_id: str) -> Disposition:
    """Pending (and parked) nodes become CANCELLED; a running pass sees the flag itself."""
    now = ex.clock.now()
    async with ex.engine.begin() as conn:
        row = await repo.task_get(conn, task_id, for_update=True)
        if row is None:
            await repo.task_insert(conn, None, task_id, now, cancel_requested=True)
            await repo.task_set_status(
                conn,
                task_id,
                TaskState.CANCELLED,
                "cancelled before start",
                now,
                expected=(TaskState.ACCEPTED,),
            )
            # No status event yet: it would carry no nodes. The task.create, if it ever
            # comes, records the nodes CANCELLED and reports them.
            return ACK
        if row.status in TASK_ENDED:
            return ACK
        await repo.task_set_cancel_requested(conn, task_id)
        if row.leased_by_other("", now) or row.envelope is None:
            # The running pass sees the flag between rounds.
            await repo.emit_status(conn, task_id, now, current())
            return ACK
        nodes = await repo.nodes_get(conn, row.envelope)
        for node_id in to_cancel(nodes):
            await repo.node_set_status_if(
                conn, task_id, node_id, nodes[node_id].status, NodeState.CANCELLED, finished_at=now
            )
            nodes[node_id].status = NodeState.CANCELLED
        decision = decide(nodes, now, True)
        if decision.next is Next.FINISH:
            await repo.task_set_status(
                conn, task_id, decision.status, decision.reason, now, expected=(row.status,)
            )
        await repo.emit_status(conn, task_id, now, current())
    ex.relay.kick()
    return ACK
