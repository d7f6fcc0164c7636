"""ExecutorService: the downstream registry and breaker states and the worker queues
(operational views), and the
outputs a task's nodes recorded (ADR-0093). WorkerService: worker runs taken, heartbeated,
completed and handed back (ADR-0099)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from dispo.executor import pausing
from dispo.executor.breaker import BreakerState
from dispo.executor.envelope import task_result
from dispo.executor.runner import Executor
from dispo.executor.shares import pace_key, slots_key
from dispo.executor.states import TaskState
from dispo.executor.store import node_runs, task_runs, worker_runs
from dispo.executor.store.worker_runs import Completion, Outcome, RunKey
from dispo.executor.worker_probes import probe_node
from dispo.executor.worker_runs import MAX_WAIT_MS, BadToken, RunRef, WorkerRuns, parse_run
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc, worker_pb2, worker_pb2_grpc
from dispo.libs.auth.scope import queue_scope, require_queues
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import Aborted, InvalidArgument, NotFound
from dispo.libs.payload import (
    PayloadError,
    canonical_json,
    json_payload,
    parse_json_value,
    payload_problem,
)
from dispo.libs.proto_enums import from_short_name
from dispo.libs.shares import Use
from dispo.libs.timestamps import to_timestamp


def use_of(use: dict[str, Use], key: str) -> int:
    found = use.get(key)
    return found.granted if found is not None else 0


class ExecutorServicer(executor_pb2_grpc.ExecutorServiceServicer):
    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    async def ListDownstreams(
        self, request: executor_pb2.ListDownstreamsRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ListDownstreamsResponse:
        ex = self.executor
        now = ex.clock.now()
        use = await ex.shares.use() if ex.shares is not None else None
        out = executor_pb2.ListDownstreamsResponse()
        for name, d in sorted(ex.registry.items()):
            breaker = ex.breakers[name]
            slots, pace = ex.slots[name], ex.paces.get(name)
            item = out.downstreams.add(
                name=name,
                base_url=d.base_url,
                timeout_ms=d.timeout_ms,
                max_concurrency=d.max_concurrency,
                health_url=d.health_url,
                breaker_state=from_short_name(
                    executor_pb2.BreakerState, breaker.state_at(now).name
                ),
                recent_failures=breaker.recent_failures(now),
                max_calls_per_second=d.max_calls_per_second,
                slots_share=slots.bound,
                calls_in_flight=slots.held,
                cluster_slots=d.max_concurrency if use is None else use_of(use, slots_key(name)),
                per_second_share=pace.bound if pace is not None else 0,
                cluster_per_second=(
                    d.max_calls_per_second if use is None else use_of(use, pace_key(name))
                ),
                per_business_max_concurrency=d.per_business.max_concurrency,
                per_business_max_calls_per_second=d.per_business.max_calls_per_second,
            )
            if breaker.state_at(now) is BreakerState.OPEN and breaker.open_until is not None:
                item.open_until.CopyFrom(to_timestamp(breaker.open_until))
        return out

    async def ListQueues(
        self, request: executor_pb2.ListQueuesRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ListQueuesResponse:
        out = executor_pb2.ListQueuesResponse()
        for q in await self.executor.worker_runs.queues():
            item = out.queues.add(
                name=q.queue,
                live_workers=q.live_workers,
                live=q.live,
                offered=q.offered,
                taken=q.taken,
                max_concurrency=q.max_concurrency,
                max_calls_per_second=q.max_calls_per_second,
                taken_last_second=q.taken_last_second,
            )
            if q.last_seen is not None:
                item.last_seen.CopyFrom(to_timestamp(q.last_seen))
        return out

    async def GetOutputs(
        self, request: executor_pb2.GetOutputsRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.GetOutputsResponse:
        task_id = request.task_id
        if not task_id:
            raise InvalidArgument("task_id", "required")
        if len(task_id) > 64:
            raise InvalidArgument("task_id", "longer than 64 characters")
        async with self.executor.db.connection() as conn:
            rows, _ = await task_runs.tasks_lock_many(conn, [task_id], lock=False, envelopes=True)
            row = rows.get(task_id)
            if row is None or row.envelope is None:
                raise NotFound(f"task {task_id} is not recorded by the executor")
            outputs = (await node_runs.node_outputs_many(conn, [(task_id, None)]))[task_id]
        out = executor_pb2.GetOutputsResponse()
        for node in row.envelope.nodes:  # in topological order
            if node.node_id in outputs:
                out.outputs.add(node_id=node.node_id, output=json_payload(outputs[node.node_id]))
        if row.status is TaskState.SUCCEEDED:
            out.result.CopyFrom(json_payload(task_result(row.envelope, outputs)))
        return out

    async def ProbeWorkerNode(
        self, request: executor_pb2.ProbeWorkerNodeRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ProbeWorkerNodeResponse:
        if not request.task_id:
            raise InvalidArgument("task_id", "required")
        if len(request.task_id) > 64:
            raise InvalidArgument("task_id", "longer than 64 characters")
        if not request.node_id:
            raise InvalidArgument("node_id", "required")
        if not 1 <= request.wait_ms <= MAX_WAIT_MS:
            raise InvalidArgument("wait_ms", f"must be 1 to {MAX_WAIT_MS}")
        answer = await probe_node(
            self.executor.db,
            self.executor.worker_runs,
            request.task_id,
            request.node_id,
            request.wait_ms / 1000,
        )
        said = {
            None: executor_pb2.PROBE_ANSWER_NONE,
            True: executor_pb2.PROBE_ANSWER_DONE,
            False: executor_pb2.PROBE_ANSWER_NOT_DONE,
        }[answer.done]
        return executor_pb2.ProbeWorkerNodeResponse(
            answer=said, fenced=answer.fenced, detail=answer.detail
        )

    async def PauseBusiness(
        self, request: executor_pb2.PauseBusinessRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.PauseBusinessResponse:
        state = await pausing.pause(self.executor, request.business, request.actor, request.reason)
        return executor_pb2.PauseBusinessResponse(business=_business_state(state))

    async def ResumeBusiness(
        self, request: executor_pb2.ResumeBusinessRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ResumeBusinessResponse:
        state = await pausing.resume(self.executor, request.business)
        return executor_pb2.ResumeBusinessResponse(business=_business_state(state))

    async def ListBusinesses(
        self, request: executor_pb2.ListBusinessesRequest, context: grpc.aio.ServicerContext
    ) -> executor_pb2.ListBusinessesResponse:
        states = await pausing.states(self.executor)
        return executor_pb2.ListBusinessesResponse(businesses=[_business_state(s) for s in states])


def _business_state(state: pausing.BusinessState) -> executor_pb2.BusinessState:
    out = executor_pb2.BusinessState(
        business=state.business, weight=state.weight, waiting_here=state.waiting_here
    )
    if state.paused is not None:
        out.paused = True
        out.paused_at.CopyFrom(to_timestamp(state.paused.paused_at))
        out.paused_by = state.paused.paused_by
        out.paused_reason = state.paused.reason
    return out


# A PollRuns takes at most this many runs.
MAX_RUNS = 100


def _token(token: str, field: str = "run_token") -> RunRef:
    """The run a token names (INVALID_ARGUMENT naming ``field`` when it names none), of a
    queue the caller serves (PERMISSION_DENIED naming ``field`` otherwise)."""
    try:
        ref = parse_run(token)
    except BadToken as bad:
        raise InvalidArgument(field, str(bad)) from None
    require_queues([ref.queue], field)
    return ref


def _worker_id(worker_id: str) -> str:
    if not worker_id:
        raise InvalidArgument("worker_id", "required")
    if len(worker_id) > 200:
        raise InvalidArgument("worker_id", "longer than 200 characters")
    return worker_id


def _held_by(tokens: Sequence[str], worker_id: str) -> list[RunKey]:
    """The runs the tokens name, each taken by ``worker_id`` (INVALID_ARGUMENT naming the
    token otherwise)."""
    keys = []
    for i, token in enumerate(tokens):
        ref = _token(token, f"run_tokens[{i}]")
        if ref.worker_id != worker_id:
            raise InvalidArgument(f"run_tokens[{i}]", f"names a run taken by {ref.worker_id!r}")
        keys.append(ref.key)
    return keys


def _json(output: common_pb2.Payload, field: str) -> bytes | None:
    """An output's JSON, canonical (None: empty; INVALID_ARGUMENT naming ``field`` when it
    is not JSON Dispo records)."""
    problem = payload_problem(output)
    if problem is not None:
        raise InvalidArgument(field, problem)
    if not output.data:
        return None
    try:
        value = parse_json_value(output.data)
    except PayloadError as error:
        raise InvalidArgument(field, f"not JSON Dispo records: {error}") from None
    return canonical_json(value)


def _outcome(request: worker_pb2.CompleteRunRequest, probe: bool, field: str = "") -> Outcome:
    """A CompleteRun's outcome (INVALID_ARGUMENT naming the field, after ``field``, when
    malformed, or when a probe run is answered as a call or a call as a probe)."""
    which = request.WhichOneof("result")
    if which == "probe":
        if not probe:
            raise InvalidArgument(f"{field}probe", "the run is an action's call, not a probe run")
        answer = request.probe
        if answer.done:
            if answer.fenced:
                raise InvalidArgument(f"{field}probe.fenced", "only a 'not done' answer is fenced")
            return Outcome(worker_runs.DONE, _json(answer.output, f"{field}probe.output"))
        if answer.HasField("output") and answer.output.data:
            raise InvalidArgument(f"{field}probe.output", "only a 'done' answer has an output")
        return Outcome(worker_runs.NOT_DONE, fenced=answer.fenced)
    if which == "output":
        if probe:
            raise InvalidArgument(f"{field}output", "a probe run is answered with probe")
        data = _json(request.output, f"{field}output")
        return Outcome(worker_runs.OUTPUT, request.output.data if data is not None else None)
    if which == "error":
        if not request.error.message:
            raise InvalidArgument(f"{field}error.message", "required")
        return Outcome(
            worker_runs.ERROR, None, truncate_error(request.error.message), request.error.retryable
        )
    if which == "not_sent":
        return Outcome(worker_runs.NOT_SENT, None, truncate_error(request.not_sent))
    raise InvalidArgument(f"{field}result", "one of output, error or not_sent is required")


def _completion(ref: RunRef, outcome: Outcome) -> Completion:
    """A run's completion; a worker token's must be of the run's queue as its token names it
    (the token is the worker's word: the row's queue is checked as it is recorded)."""
    return (ref.key, ref.worker_id, outcome, None if queue_scope() is None else ref.queue)


def _lost(key: RunKey, worker_id: str) -> str:
    """Why a completion was refused."""
    task_id, node_id, attempt = key
    return (
        f"the run's lease was lost: node {node_id} of task {task_id} (attempt"
        f" {attempt}) is no longer held by worker {worker_id!r}; nothing recorded"
    )


class WorkerServicer(worker_pb2_grpc.WorkerServiceServicer):
    """WorkerService (ADR-0099): thin, over :class:`WorkerRuns`."""

    def __init__(self, runs: WorkerRuns) -> None:
        self.runs = runs

    async def PollRuns(
        self, request: worker_pb2.PollRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.PollRunsResponse:
        if not request.queues and not request.probe_queues:
            raise InvalidArgument("queues", "at least one queue (or probe queue) is required")
        for i, queue in enumerate(request.queues):
            if not queue or len(queue) > 63:
                raise InvalidArgument(f"queues[{i}]", "a queue name of 1 to 63 characters")
        worker_id = _worker_id(request.worker_id)
        if not 1 <= request.max_runs <= MAX_RUNS:
            raise InvalidArgument("max_runs", f"must be 1 to {MAX_RUNS}")
        if not 0 <= request.wait_ms <= MAX_WAIT_MS:
            raise InvalidArgument("wait_ms", f"must be 0 to {MAX_WAIT_MS}")
        for i, queue in enumerate(request.probe_queues):
            if not queue or len(queue) > 63:
                raise InvalidArgument(f"probe_queues[{i}]", "a queue name of 1 to 63 characters")
        require_queues(request.queues, "queues")
        require_queues(request.probe_queues, "probe_queues")
        taken = await self.runs.poll(
            list(request.queues),
            worker_id,
            request.max_runs,
            request.wait_ms,
            list(request.probe_queues),
        )
        out = worker_pb2.PollRunsResponse(lease_ms=int(self.runs.lease_seconds * 1000))
        for t in taken:
            row = t.row
            run = out.runs.add(
                run_token=t.token,
                task_id=row.task_id,
                node_id=row.node_id,
                action=row.action,
                queue=row.queue,
                idempotency_key=row.idempotency_key,
                payload=json_payload(row.payload),
                attempt=row.attempt,
                probe=row.kind == "probe",
            )
            run.lease_until.CopyFrom(to_timestamp(row.lease_until))
            run.deadline.CopyFrom(to_timestamp(row.deadline))
        return out

    async def HeartbeatRuns(
        self, request: worker_pb2.HeartbeatRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.HeartbeatRunsResponse:
        worker_id = _worker_id(request.worker_id)
        keys = _held_by(request.run_tokens, worker_id)
        held = await self.runs.heartbeat(worker_id, keys, queue_scope())
        out = worker_pb2.HeartbeatRunsResponse()
        for token, key in zip(request.run_tokens, keys, strict=True):
            lease = out.leases.add(run_token=token, held=key in held)
            if key in held:
                lease.lease_until.CopyFrom(to_timestamp(held[key]))
        return out

    async def CompleteRun(
        self, request: worker_pb2.CompleteRunRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.CompleteRunResponse:
        ref = _token(request.run_token)
        if not (await self.runs.complete([_completion(ref, _outcome(request, ref.probe))]))[0]:
            raise Aborted(_lost(ref.key, ref.worker_id))
        return worker_pb2.CompleteRunResponse()

    async def CompleteRuns(
        self, request: worker_pb2.CompleteRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.CompleteRunsResponse:
        if not 1 <= len(request.completions) <= MAX_RUNS:
            raise InvalidArgument("completions", f"1 to {MAX_RUNS} completions")
        completions = []
        for i, one in enumerate(request.completions):  # all checked before any is recorded
            ref = _token(one.run_token, f"completions[{i}].run_token")
            completions.append(_completion(ref, _outcome(one, ref.probe, f"completions[{i}].")))
        recorded = await self.runs.complete(completions)
        out = worker_pb2.CompleteRunsResponse()
        for one, (key, worker_id, _, _), ok in zip(
            request.completions, completions, recorded, strict=True
        ):
            out.results.add(
                run_token=one.run_token, recorded=ok, detail="" if ok else _lost(key, worker_id)
            )
        return out

    async def ReleaseRuns(
        self, request: worker_pb2.ReleaseRunsRequest, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ReleaseRunsResponse:
        worker_id = _worker_id(request.worker_id)
        keys = _held_by(request.run_tokens, worker_id)
        released = await self.runs.release(worker_id, keys, queue_scope())
        return worker_pb2.ReleaseRunsResponse(released=released)
