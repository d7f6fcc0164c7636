"""Probes served by workers (ADR-0100): the reconciler asks whether an UNKNOWN worker node's
effect happened (``ExecutorService.ProbeWorkerNode``); the executor offers a probe run on
the node's queue, a worker serving that queue's probes answers, and the answer goes back as
an http probe's would (:class:`ProbeAnswer`: done, not done and whether fenced, or nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from dispo.executor.envelope import spec_from_proto
from dispo.executor.states import NodeState
from dispo.executor.store import node_runs, task_runs
from dispo.executor.store import worker_runs as store
from dispo.executor.store.worker_runs import Offer, Outcome
from dispo.executor.worker_runs import WorkerRuns
from dispo.libs.db.driver import Database
from dispo.libs.errors import FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger

log = get_logger(__name__)

# A probe run's owner (the column names a pass's lease owner for a call's run).
PROBE_OWNER = "probe"
# A probe run carries no payload: its idempotency key names the effect asked about.
NO_PAYLOAD = b"{}"
NO_WORKER = "no worker of queue {queue!r} answered the probe within {wait:g} s"


@dataclass(frozen=True)
class ProbeAnswer:
    """``done`` True / False when a worker answered; None when none could say (``detail``
    says why). ``fenced``: with done False, the worker refuses the key from now on."""

    done: bool | None
    fenced: bool = False
    detail: str = ""


def answer_of(outcome: Outcome | None, queue: str, wait_seconds: float) -> ProbeAnswer:
    """What a probe run's outcome says (pure)."""
    if outcome is None:
        return ProbeAnswer(None, detail=NO_WORKER.format(queue=queue, wait=wait_seconds))
    if outcome.kind == store.DONE:
        return ProbeAnswer(True, detail="the worker's probe reports done")
    if outcome.kind == store.NOT_DONE:
        if outcome.fenced:
            return ProbeAnswer(False, True, "the worker's probe reports not done, fenced")
        return ProbeAnswer(False, detail="the worker's probe reports not done")
    return ProbeAnswer(None, detail=f"the worker's probe gave no answer: {outcome.message}")


async def probe_node(
    db: Database, runs: WorkerRuns, task_id: str, node_id: str, wait_seconds: float
) -> ProbeAnswer:
    """Ask a worker of the node's queue whether the UNKNOWN worker node's effect happened,
    waiting up to ``wait_seconds``. NOT_FOUND for a task the executor has not recorded;
    INVALID_ARGUMENT for a node it does not have; FAILED_PRECONDITION for a node that is
    not a worker action's, or not UNKNOWN."""
    async with db.connection() as conn:
        rows, _ = await task_runs.tasks_lock_many(conn, [task_id], lock=False, envelopes=True)
        row = rows.get(task_id)
        if row is None or row.envelope is None:
            raise NotFound(f"task {task_id} is not recorded by the executor")
        node = next((n for n in row.envelope.nodes if n.node_id == node_id), None)
        if node is None:
            raise InvalidArgument("node_id", f"task {task_id} has no node {node_id!r}")
        state = (await node_runs.node_rows_many(conn, [task_id]))[task_id].get(node_id)
    spec = spec_from_proto(node.spec)
    if spec.kind != "worker":
        raise FailedPrecondition(f"node {node_id} is a {spec.kind} action's, not a worker's")
    if state is None or NodeState(state.status) is not NodeState.UNKNOWN:
        status = NodeState(state.status).name if state is not None else "not recorded"
        raise FailedPrecondition(f"node {node_id} of task {task_id} is {status}, not UNKNOWN")
    offer = Offer(
        task_id,
        node_id,
        spec.queue,
        PROBE_OWNER,
        max(state.attempts, 1),
        node.idempotency_key,
        node.action,
        spec.idempotent,
        int(wait_seconds * 1000),
        NO_PAYLOAD,
        probe=True,
    )
    answer = answer_of(await runs.probe(offer, spec, wait_seconds), spec.queue, wait_seconds)
    log.info(
        "worker node probed",
        task_id=task_id,
        node_id=node_id,
        queue=spec.queue,
        done=answer.done,
        fenced=answer.fenced,
    )
    return answer
