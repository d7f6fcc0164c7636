"""Operators' commands over the reconciler, the pool, the intelligence service and each
service's quarantine: each one call (or one call per id) and a table of its reply.

dispo failed list|show|resume|abandon|resolve   ReconcilerService (failed, parked, uncertain work)
dispo downstreams list|pause|resume             ReconcilerService (downstreams)
dispo downstreams limits                        ExecutorService (ListDownstreams)
dispo queues                                    ExecutorService (worker queues)
dispo businesses list|pause|resume              ExecutorService (fair share, paused businesses)
dispo pool status|queue|evaluations|boost|bounds   PoolService
dispo jobs list|show|trigger                    IntelligenceService
dispo quarantine list|show|replay|discard       QuarantineService of one service
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import grpc
import typer
import yaml
from dispo.libs.api.executor.v1 import executor_pb2 as epb
from dispo.libs.api.executor.v1 import executor_pb2_grpc
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as ipb
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
from dispo.libs.api.pool.v1 import pool_pb2 as ppb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.api.quarantine.v1 import quarantine_pb2 as qpb
from dispo.libs.api.quarantine.v1 import quarantine_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as rpb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.tools.cli._common import (
    JSON_OPTION,
    actor,
    as_dict,
    brief,
    duration_seconds,
    emit_json,
    enum_name,
    out,
    progress_bar,
    show,
    target,
    usage,
    when,
)
from dispo.tools.stack.state import SERVICES
from google.protobuf.json_format import ParseDict, ParseError
from google.protobuf.message import Message
from rich.table import Table

failed_app = typer.Typer(
    help="The reconciler's failed, parked and uncertain work.", no_args_is_help=True
)
downstreams_app = typer.Typer(help="Downstream health, pauses and backlogs.", no_args_is_help=True)
businesses_app = typer.Typer(
    help="Businesses: their weights, pauses and paused depth.", no_args_is_help=True
)
pool_app = typer.Typer(help="The cron pool.", no_args_is_help=True)
evaluations_app = typer.Typer(help="The pool's evaluations.", no_args_is_help=True)
pool_app.add_typer(evaluations_app, name="evaluations")
jobs_app = typer.Typer(help="Intelligence analysis and comparison jobs.", no_args_is_help=True)
quarantine_app = typer.Typer(
    help="Messages a service's consumers set aside (quarantine).", no_args_is_help=True
)

Column = tuple[str, Callable[[Any], Any]]
T = TypeVar("T")
S = TypeVar("S")
# How long one call may take.
CALL_SECONDS = 10


def table(rows: Sequence[Any], columns: Sequence[Column]) -> Table:
    drawn = Table(box=None, pad_edge=False)
    for header, _ in columns:
        drawn.add_column(header, overflow="fold")
    for row in rows:
        drawn.add_row(*(str(cell(row)) for _, cell in columns))
    return drawn


def fields(message: Message) -> Table:
    """One message as a two-column table of its fields."""
    drawn = Table(box=None, pad_edge=False, show_header=False)
    drawn.add_column(style="bold")
    drawn.add_column(overflow="fold")
    for name, value in as_dict(message).items():
        drawn.add_row(name, value if isinstance(value, str) else repr(value))
    return drawn


@contextmanager
def _stub(ctx: typer.Context, service: str, stub: Callable[[grpc.Channel], S]) -> Iterator[S]:
    """``service``'s stub on a channel to the command's stack; a call on it that fails ends
    the command (3 or 4)."""
    with target(ctx).channel(service) as channel:
        yield stub(channel)


def _reconciler(
    ctx: typer.Context,
) -> AbstractContextManager[reconciler_pb2_grpc.ReconcilerServiceStub]:
    return _stub(ctx, "reconciler", reconciler_pb2_grpc.ReconcilerServiceStub)


# --- failed -------------------------------------------------------------------------------

_KINDS = {
    "failed": rpb.WORK_KIND_FAILED,
    "awaiting-redrive": rpb.WORK_KIND_AWAITING_REDRIVE,
    "demoted": rpb.WORK_KIND_DEMOTED,
    "unknown-outcome": rpb.WORK_KIND_UNKNOWN_OUTCOME,
}
_WORK_COLUMNS: list[Column] = [
    ("task", lambda w: w.task.task_id),
    ("kind", lambda w: enum_name(rpb.WorkKind, w.kind, "WORK_KIND_")),
    ("business", lambda w: w.task.business),
    ("state", lambda w: enum_name(rpb.RecoveryState, w.task.state, "RECOVERY_STATE_")),
    ("downstreams", lambda w: ",".join(w.task.downstreams)),
    ("error", lambda w: w.task.error_class),
    ("age", lambda w: f"{w.age_seconds}s"),
    ("reason", lambda w: brief(w.task.reason)),
]


def _kind(kind: str) -> rpb.WorkKind.ValueType:
    if kind not in _KINDS:
        usage(f"--kind {kind}: one of {', '.join(_KINDS)}")
    return _KINDS[kind]


def _work_filter(
    kinds: list[str] | None, business: str, downstream: str, min_age: str | None
) -> rpb.FailedWorkFilter:
    return rpb.FailedWorkFilter(
        kinds=[_kind(k) for k in kinds or []],
        business=business,
        downstream=downstream,
        min_age_seconds=duration_seconds(min_age) if min_age else 0,
    )


KIND_OPTION = Annotated[
    list[str] | None,
    typer.Option("--kind", help=f"only this kind (repeatable): {', '.join(_KINDS)}"),
]
BUSINESS_OPTION = Annotated[str, typer.Option(help="only this business's work")]
DOWNSTREAM_OPTION = Annotated[str, typer.Option(help="only work that uses this downstream")]
MIN_AGE_OPTION = Annotated[
    str | None, typer.Option(help="parked at least this long ago (90s, 15m, 2h)")
]
REASON_OPTION = Annotated[str, typer.Option(help="why (recorded with the action)")]


@failed_app.command(name="list")
def failed_list(
    ctx: typer.Context,
    kind: KIND_OPTION = None,
    business: BUSINESS_OPTION = "",
    downstream: DOWNSTREAM_OPTION = "",
    min_age: MIN_AGE_OPTION = None,
    limit: Annotated[int, typer.Option(help="items per page", min=1, max=500)] = 50,
    page_token: Annotated[str, typer.Option(help="the page after this one")] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """Failed, parked and uncertain work, oldest parked first."""
    request = rpb.ListFailedWorkRequest(filter=_work_filter(kind, business, downstream, min_age))
    request.page.page_size, request.page.page_token = limit, page_token
    with _reconciler(ctx) as reconciler:
        reply = reconciler.ListFailedWork(request, timeout=CALL_SECONDS)
    show(reply, as_json, lambda r: table(r.work, _WORK_COLUMNS))
    if not as_json and reply.page.next_page_token:
        out.print(f"more: --page-token {reply.page.next_page_token}", style="dim", highlight=False)


@failed_app.command(name="show")
def failed_show(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    as_json: JSON_OPTION = False,
) -> None:
    """One task the reconciler holds: its envelope, failures, redrives and settlements."""
    with _reconciler(ctx) as reconciler:
        reply = reconciler.GetRecoveryTask(
            rpb.GetRecoveryTaskRequest(task_id=task_id), timeout=CALL_SECONDS
        )
    show(reply, as_json, lambda r: fields(r.task))


@failed_app.command(name="resume")
def failed_resume(
    ctx: typer.Context,
    task_ids: Annotated[
        list[str] | None, typer.Argument(help="the tasks (or --all with the filters)")
    ] = None,
    all_: Annotated[
        bool, typer.Option("--all", help="every listed item matching the filters")
    ] = False,
    kind: KIND_OPTION = None,
    business: BUSINESS_OPTION = "",
    downstream: DOWNSTREAM_OPTION = "",
    min_age: MIN_AGE_OPTION = None,
    include_permanent: Annotated[
        bool, typer.Option(help="also retry nodes that failed permanently (4xx)")
    ] = False,
    reason: REASON_OPTION = "resumed from the command line",
    as_json: JSON_OPTION = False,
) -> None:
    """Redrive parked tasks now, or resume FAILED ones from their failure (a progress bar
    when there are several)."""
    if bool(task_ids) == all_:
        usage("name the tasks, or say --all (with filters)")
    with _reconciler(ctx) as stub:
        ids = list(task_ids or []) or _every_listed(
            stub, _work_filter(kind, business, downstream, min_age)
        )
        replies = []
        with progress_bar(len(ids), "resuming", disable=as_json or len(ids) < 2) as advance:
            for task_id in ids:
                replies.append(
                    stub.RedriveTask(
                        rpb.RedriveTaskRequest(
                            task_id=task_id,
                            actor=actor(),
                            reason=reason,
                            include_permanent=include_permanent,
                        ),
                        timeout=CALL_SECONDS,
                    )
                )
                advance()
    if as_json:
        emit_json({"items": [as_dict(r) for r in replies]})
    else:
        out.print(table([r.task for r in replies], _RECOVERY_COLUMNS))


def _every_listed(
    stub: reconciler_pb2_grpc.ReconcilerServiceStub, filter_: rpb.FailedWorkFilter
) -> list[str]:
    ids: list[str] = []
    token = ""
    while True:
        request = rpb.ListFailedWorkRequest(filter=filter_)
        request.page.page_size, request.page.page_token = 500, token
        reply = stub.ListFailedWork(request, timeout=CALL_SECONDS)
        ids += [w.task.task_id for w in reply.work]
        token = reply.page.next_page_token
        if not token:
            return ids


_RECOVERY_COLUMNS: list[Column] = [
    ("task", lambda t: t.task_id),
    ("state", lambda t: enum_name(rpb.RecoveryState, t.state, "RECOVERY_STATE_")),
    ("generation", lambda t: t.generation),
    ("redrives", lambda t: t.redrives),
    ("reason", lambda t: brief(t.reason)),
]


@failed_app.command(name="abandon")
def failed_abandon(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    reason: REASON_OPTION = "abandoned from the command line",
    as_json: JSON_OPTION = False,
) -> None:
    """Give up on a parked task: it is cancelled through the executor's normal path."""
    with _reconciler(ctx) as reconciler:
        reply = reconciler.AbandonTask(
            rpb.AbandonTaskRequest(task_id=task_id, actor=actor(), reason=reason),
            timeout=CALL_SECONDS,
        )
    show(reply, as_json, lambda r: table([r.task], _RECOVERY_COLUMNS))


@failed_app.command(name="abandon-all")
def failed_abandon_all(
    ctx: typer.Context,
    business: BUSINESS_OPTION = "",
    downstream: DOWNSTREAM_OPTION = "",
    min_age: MIN_AGE_OPTION = None,
    rate: Annotated[
        float, typer.Option(help="at most this many abandons a second", min=0.001, max=1000)
    ] = 100,
    limit: Annotated[int, typer.Option(help="at most this many tasks", min=1, max=1000)] = 1000,
    reason: REASON_OPTION = "abandoned from the command line",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count the tasks it would abandon; change nothing")
    ] = False,
    as_json: JSON_OPTION = False,
) -> None:
    """Give up on every matching parked task (the reconciler's AbandonByFilter), each as
    `failed abandon` does, at --rate a second, a bar following it."""
    filter_ = rpb.RecoveryFilter(
        business=business,
        downstream=downstream,
        min_age_seconds=duration_seconds(min_age) if min_age else 0,
    )
    with _reconciler(ctx) as stub:
        counted = stub.AbandonByFilter(
            rpb.AbandonByFilterRequest(filter=filter_, limit=limit, dry_run=True),
            timeout=CALL_SECONDS,
        )
        if dry_run:
            if as_json:
                emit_json(counted)
            else:
                out.print(f"{counted.matched} tasks would be abandoned (dry run)", highlight=False)
            return
        done = rpb.AbandonByFilterResponse(matched=counted.matched)
        step = max(1, min(100, int(rate * 10)))  # calls of about ten seconds at most
        with progress_bar(counted.matched, "abandoning", disable=as_json) as advance:
            while len(done.task_ids) < counted.matched:
                reply = stub.AbandonByFilter(
                    rpb.AbandonByFilterRequest(
                        filter=filter_,
                        limit=min(step, counted.matched - len(done.task_ids)),
                        rate_per_second=rate,
                        reason=reason,
                    ),
                    timeout=CALL_SECONDS + step / rate,
                )
                if not reply.task_ids:
                    break
                done.task_ids.extend(reply.task_ids)
                advance(len(reply.task_ids))
    if as_json:
        emit_json(done)
    else:
        out.print(f"{len(done.task_ids)} of {done.matched} tasks abandoned", highlight=False)


@failed_app.command(name="resolve")
def failed_resolve(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    node_id: Annotated[str, typer.Argument(help="the UNKNOWN node")],
    done: Annotated[
        bool | None,
        typer.Option(
            "--done/--retry",
            help="--done: the effect happened (the node is SUCCEEDED); --retry: it did not"
            " (the node runs again)",
        ),
    ] = None,
    reason: Annotated[str, typer.Option(help="why (required; recorded with the decision)")] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """Decide an UNKNOWN node that could not be settled automatically."""
    if done is None:
        usage("say --done or --retry")
    if not reason.strip():
        usage("say why with --reason (it is recorded with the decision)")
    resolution = rpb.RESOLUTION_DONE if done else rpb.RESOLUTION_RETRY
    with _reconciler(ctx) as reconciler:
        reply = reconciler.ResolveNode(
            rpb.ResolveNodeRequest(
                task_id=task_id,
                node_id=node_id,
                resolution=resolution,
                actor=actor(),
                reason=reason,
            ),
            timeout=CALL_SECONDS,
        )
    show(reply, as_json, lambda r: table([r.task], _RECOVERY_COLUMNS))


# --- downstreams --------------------------------------------------------------------------

_DOWNSTREAM_COLUMNS: list[Column] = [
    ("downstream", lambda d: d.name),
    ("health", lambda d: ("healthy" if d.healthy else "unhealthy") if d.probed else "not probed"),
    ("paused", lambda d: f"paused: {d.paused_reason}" if d.paused else ""),
    ("demoted", lambda d: d.demoted_depth),
    ("oldest demoted", lambda d: f"{d.oldest_demoted_age_seconds}s" if d.demoted_depth else ""),
    ("failed", lambda d: d.failed_depth),
    ("oldest failed", lambda d: f"{d.oldest_failed_age_seconds}s" if d.failed_depth else ""),
    ("release/s", lambda d: d.release_rate_per_second),
]


@downstreams_app.command(name="list")
def downstreams_list(ctx: typer.Context, as_json: JSON_OPTION = False) -> None:
    """Each downstream: health, pause, demoted and failed backlog."""
    with _reconciler(ctx) as reconciler:
        reply = reconciler.ListDownstreams(rpb.ListDownstreamsRequest(), timeout=CALL_SECONDS)
    show(reply, as_json, lambda r: table(r.downstreams, _DOWNSTREAM_COLUMNS))


@downstreams_app.command(name="pause")
def downstreams_pause(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the downstream")],
    reason: REASON_OPTION = "paused from the command line",
    as_json: JSON_OPTION = False,
) -> None:
    """Hold the work of a downstream (nothing is released to it until resumed)."""
    with _reconciler(ctx) as reconciler:
        reply = reconciler.PauseDownstream(
            rpb.PauseDownstreamRequest(name=name, actor=actor(), reason=reason),
            timeout=CALL_SECONDS,
        )
    show(reply, as_json, lambda r: table([r.downstream], _DOWNSTREAM_COLUMNS))


@downstreams_app.command(name="resume")
def downstreams_resume(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the downstream")],
    as_json: JSON_OPTION = False,
) -> None:
    """Release a paused downstream's work again."""
    with _reconciler(ctx) as reconciler:
        reply = reconciler.ResumeDownstream(
            rpb.ResumeDownstreamRequest(name=name, actor=actor()), timeout=CALL_SECONDS
        )
    show(reply, as_json, lambda r: table([r.downstream], _DOWNSTREAM_COLUMNS))


_LIMIT_COLUMNS: list[Column] = [
    ("downstream", lambda d: d.name),
    ("max at once", lambda d: d.max_concurrency),
    ("held", lambda d: d.cluster_slots),
    ("this executor", lambda d: f"{d.calls_in_flight}/{d.slots_share}"),
    ("max a second", lambda d: d.max_calls_per_second or ""),
    ("held a second", lambda d: d.cluster_per_second if d.max_calls_per_second else ""),
    ("this executor a second", lambda d: d.per_second_share if d.max_calls_per_second else ""),
    ("a business at once", lambda d: d.per_business_max_concurrency or ""),
    ("a business a second", lambda d: d.per_business_max_calls_per_second or ""),
]


@downstreams_app.command(name="limits")
def downstreams_limits(ctx: typer.Context, as_json: JSON_OPTION = False) -> None:
    """Each downstream's limits across the cluster (the executor's ListDownstreams): calls
    at once and a second, what every executor holds of them, and what the executor asked
    holds and uses, and what each business may have of it (per_business; ADR-0108)."""
    with _stub(ctx, "executor", executor_pb2_grpc.ExecutorServiceStub) as executor:
        reply = executor.ListDownstreams(epb.ListDownstreamsRequest(), timeout=CALL_SECONDS)
    show(reply, as_json, lambda r: table(r.downstreams, _LIMIT_COLUMNS))


# --- queues -------------------------------------------------------------------------------

_QUEUE_COLUMNS: list[Column] = [
    ("queue", lambda q: q.name),
    ("workers", lambda q: q.live_workers),
    ("health", lambda q: "live" if q.live else "no live worker"),
    ("last seen", lambda q: when(q.last_seen) if q.HasField("last_seen") else ""),
    ("offered", lambda q: q.offered),
    ("taken", lambda q: q.taken),
    ("max", lambda q: q.max_concurrency or ""),
    (
        "per second",
        lambda q: (
            f"{q.taken_last_second}/{q.max_calls_per_second}" if q.max_calls_per_second else ""
        ),
    ),
]


def queues(ctx: typer.Context, as_json: JSON_OPTION = False) -> None:
    """Each worker queue: its live workers, runs offered and taken, its limits: runs at once,
    and runs taken in the last second of its most a second (the executor's ListQueues)."""
    with _stub(ctx, "executor", executor_pb2_grpc.ExecutorServiceStub) as executor:
        reply = executor.ListQueues(epb.ListQueuesRequest(), timeout=CALL_SECONDS)
    show(reply, as_json, lambda r: table(r.queues, _QUEUE_COLUMNS))


# --- businesses ---------------------------------------------------------------------------


def _executor(ctx: typer.Context) -> AbstractContextManager[executor_pb2_grpc.ExecutorServiceStub]:
    return _stub(ctx, "executor", executor_pb2_grpc.ExecutorServiceStub)


def _show_businesses(
    ctx: typer.Context, states: Sequence[epb.BusinessState], as_json: bool
) -> None:
    """The businesses with their paused depth: the gateway's count of their ACCEPTED tasks
    (accepted, not started)."""
    with target(ctx).client() as client:
        accepted = {s.business: client.count(business=s.business)["ACCEPTED"] for s in states}
    if as_json:
        emit_json(
            {"businesses": [{**as_dict(s), "accepted": accepted[s.business]} for s in states]}
        )
        return
    columns: list[Column] = [
        ("business", lambda s: s.business),
        ("weight", lambda s: s.weight),
        ("paused", lambda s: f"paused: {s.paused_reason}" if s.paused else ""),
        ("since", lambda s: when(s.paused_at) if s.paused else ""),
        ("accepted (not started)", lambda s: accepted[s.business]),
        ("waiting here", lambda s: s.waiting_here),
    ]
    out.print(table(states, columns))


@businesses_app.command(name="list")
def businesses_list(ctx: typer.Context, as_json: JSON_OPTION = False) -> None:
    """The businesses paused, weighted in the policy or waiting for the executor: weight,
    pause, and their accepted tasks not started (the paused depth)."""
    with _executor(ctx) as executor:
        reply = executor.ListBusinesses(epb.ListBusinessesRequest(), timeout=CALL_SECONDS)
    _show_businesses(ctx, reply.businesses, as_json)


@businesses_app.command(name="pause")
def businesses_pause(
    ctx: typer.Context,
    business: Annotated[str, typer.Argument(help="the business")],
    reason: REASON_OPTION = "paused from the command line",
    as_json: JSON_OPTION = False,
) -> None:
    """Stop starting a business's tasks: they are still accepted and wait until resumed."""
    with _executor(ctx) as executor:
        reply = executor.PauseBusiness(
            epb.PauseBusinessRequest(business=business, actor=actor(), reason=reason),
            timeout=CALL_SECONDS,
        )
    _show_businesses(ctx, [reply.business], as_json)


@businesses_app.command(name="resume")
def businesses_resume(
    ctx: typer.Context,
    business: Annotated[str, typer.Argument(help="the business")],
    as_json: JSON_OPTION = False,
) -> None:
    """Start a paused business's tasks again."""
    with _executor(ctx) as executor:
        reply = executor.ResumeBusiness(
            epb.ResumeBusinessRequest(business=business), timeout=CALL_SECONDS
        )
    _show_businesses(ctx, [reply.business], as_json)


# --- pool ---------------------------------------------------------------------------------


def _pool(ctx: typer.Context) -> AbstractContextManager[pool_pb2_grpc.PoolServiceStub]:
    return _stub(ctx, "pool", pool_pb2_grpc.PoolServiceStub)


def _status_table(status: ppb.PoolStatus) -> Table:
    return fields(status)


@pool_app.command(name="status")
def pool_status(ctx: typer.Context, as_json: JSON_OPTION = False) -> None:
    """Size, busy, idle, stuck, bounds, queue depth and oldest wait."""
    with _pool(ctx) as pool:
        reply = pool.GetPoolStatus(ppb.GetPoolStatusRequest(), timeout=CALL_SECONDS)
    show(reply, as_json, _status_table)


@pool_app.command(name="queue")
def pool_queue(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(help="at most this many", min=1, max=1000)] = 100,
    as_json: JSON_OPTION = False,
) -> None:
    """Evaluations waiting for a cron, in the order crons will take them."""
    with _pool(ctx) as pool:
        reply = pool.ListQueue(ppb.ListQueueRequest(limit=limit), timeout=CALL_SECONDS)
    columns: list[Column] = [
        ("evaluation", lambda i: i.evaluation_id),
        ("status", lambda i: enum_name(ppb.EvaluationStatus, i.status, "EVALUATION_STATUS_")),
        ("boost", lambda i: i.priority_boost),
        ("slot due", lambda i: "yes" if i.slot_due else ""),
        ("debt", lambda i: i.debt),
        ("waiting since", lambda i: when(i.waiting_since)),
    ]
    show(reply, as_json, lambda r: table(r.items, columns))


_EVALUATION_COLUMNS: list[Column] = [
    ("evaluation", lambda e: e.id),
    ("series", lambda e: e.series),
    ("period", lambda e: e.period),
    ("status", lambda e: enum_name(ppb.EvaluationStatus, e.status, "EVALUATION_STATUS_")),
    ("runs", lambda e: f"{e.runs_done}/{e.runs_total}"),
    ("debt", lambda e: e.debt),
    ("boost", lambda e: e.priority_boost),
    ("cron", lambda e: e.assigned_cron_id),
]


def _evaluation_call(ctx: typer.Context, method: str, request: Message, as_json: bool) -> None:
    with _pool(ctx) as pool:
        reply = getattr(pool, method)(request, timeout=CALL_SECONDS)
    show(reply, as_json, lambda e: table([e], _EVALUATION_COLUMNS))


EVALUATION_ID = Annotated[str, typer.Argument(help="the evaluation's id")]


@evaluations_app.command(name="show")
def evaluation_show(
    ctx: typer.Context, evaluation_id: EVALUATION_ID, as_json: JSON_OPTION = False
) -> None:
    """One evaluation with its runs done, debt and cron."""
    _evaluation_call(
        ctx, "GetEvaluation", ppb.GetEvaluationRequest(evaluation_id=evaluation_id), as_json
    )


@evaluations_app.command(name="create")
def evaluation_create(
    ctx: typer.Context,
    source: Annotated[
        str, typer.Argument(help="a CreateEvaluationRequest as JSON or YAML; - for stdin")
    ],
    as_json: JSON_OPTION = False,
) -> None:
    """Queue an evaluation (the same request again returns the existing one)."""
    import sys

    text = sys.stdin.read() if source == "-" else _read_text(source)
    try:
        data = yaml.safe_load(text)  # YAML is a superset of JSON
        request = ParseDict(data, ppb.CreateEvaluationRequest())
    except (yaml.YAMLError, ParseError) as error:
        usage(f"{source}: not a CreateEvaluationRequest: {error}")
    _evaluation_call(ctx, "CreateEvaluation", request, as_json)


def _read_text(source: str) -> str:
    try:
        return Path(source).read_text()
    except OSError as error:
        usage(f"cannot read {source}: {error.strerror}")


def _evaluation_command(method: str, doc: str) -> Callable[..., None]:
    def command(
        ctx: typer.Context, evaluation_id: EVALUATION_ID, as_json: JSON_OPTION = False
    ) -> None:
        _evaluation_call(ctx, method, ppb.EvaluationRef(evaluation_id=evaluation_id), as_json)

    command.__doc__ = doc
    return command


for _name, _method, _doc in (
    ("pause", "PauseEvaluation", "Hold an evaluation out of the queue."),
    ("resume", "ResumeEvaluation", "Put a paused evaluation back in the queue."),
    ("cancel", "CancelEvaluation", "Cancel an evaluation."),
):
    evaluations_app.command(name=_name)(_evaluation_command(_method, _doc))


@pool_app.command(name="boost")
def pool_boost(
    ctx: typer.Context,
    evaluation_id: EVALUATION_ID,
    boost: Annotated[int, typer.Argument(help="0..1000; a higher boost is served first")],
    as_json: JSON_OPTION = False,
) -> None:
    """Set an evaluation's priority boost (replaces the current one)."""
    _evaluation_call(
        ctx,
        "BoostEvaluation",
        ppb.BoostEvaluationRequest(evaluation_id=evaluation_id, priority_boost=boost),
        as_json,
    )


@pool_app.command(name="bounds")
def pool_bounds(
    ctx: typer.Context,
    min_size: Annotated[int, typer.Argument(help="smallest pool size")],
    max_size: Annotated[int, typer.Argument(help="largest pool size")],
    as_json: JSON_OPTION = False,
) -> None:
    """Change the pool's size bounds; the scaler applies them at once."""
    with _pool(ctx) as pool:
        reply = pool.SetPoolBounds(
            ppb.SetPoolBoundsRequest(min_size=min_size, max_size=max_size), timeout=CALL_SECONDS
        )
    show(reply, as_json, _status_table)


# --- jobs ---------------------------------------------------------------------------------

_JOB_KINDS = {"analysis": ipb.JOB_KIND_ANALYSIS, "comparison": ipb.JOB_KIND_COMPARISON}
_JOB_STATUSES = {
    "queued": ipb.JOB_STATUS_QUEUED,
    "generating": ipb.JOB_STATUS_GENERATING,
    "completed": ipb.JOB_STATUS_COMPLETED,
    "failed": ipb.JOB_STATUS_FAILED,
}
_JOB_COLUMNS: list[Column] = [
    ("evaluation", lambda j: j.evaluation_id),
    ("kind", lambda j: enum_name(ipb.JobKind, j.kind, "JOB_KIND_")),
    ("status", lambda j: enum_name(ipb.JobStatus, j.status, "JOB_STATUS_")),
    ("attempts", lambda j: j.attempts),
    ("model", lambda j: j.analysis_model),
    ("baseline", lambda j: j.baseline_evaluation_id),
    ("updated", lambda j: when(j.updated_at)),
    ("error", lambda j: brief(j.error)),
]
KIND_ARG = Annotated[str, typer.Option("--kind", help="analysis or comparison")]


def _intelligence(
    ctx: typer.Context,
) -> AbstractContextManager[intelligence_pb2_grpc.IntelligenceServiceStub]:
    return _stub(ctx, "intelligence", intelligence_pb2_grpc.IntelligenceServiceStub)


def _pick(table_: Mapping[str, T], value: str, option: str) -> T:
    if value not in table_:
        usage(f"{option} {value}: one of {', '.join(table_)}")
    return table_[value]


@jobs_app.command(name="list")
def jobs_list(
    ctx: typer.Context,
    evaluation: Annotated[str, typer.Option(help="only this evaluation's jobs")] = "",
    kind: Annotated[str | None, typer.Option(help="analysis or comparison")] = None,
    status: Annotated[
        str | None, typer.Option(help="queued, generating, completed or failed")
    ] = None,
    limit: Annotated[int, typer.Option(help="jobs per page", min=1, max=500)] = 50,
    page_token: Annotated[str, typer.Option(help="the page after this one")] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """Analysis and comparison jobs."""
    request = ipb.ListJobsRequest(
        evaluation_id=evaluation,
        kind=_pick(_JOB_KINDS, kind, "--kind") if kind else ipb.JOB_KIND_UNSPECIFIED,
        status=_pick(_JOB_STATUSES, status, "--status") if status else ipb.JOB_STATUS_UNSPECIFIED,
    )
    request.page.page_size, request.page.page_token = limit, page_token
    with _intelligence(ctx) as intelligence:
        reply = intelligence.ListJobs(request, timeout=CALL_SECONDS)
    show(reply, as_json, lambda r: table(r.jobs, _JOB_COLUMNS))


@jobs_app.command(name="show")
def jobs_show(
    ctx: typer.Context,
    evaluation_id: EVALUATION_ID,
    kind: KIND_ARG = "analysis",
    as_json: JSON_OPTION = False,
) -> None:
    """An evaluation's analysis (or comparison) with its job."""
    method = (
        "GetComparison"
        if _pick(_JOB_KINDS, kind, "--kind") == ipb.JOB_KIND_COMPARISON
        else "GetAnalysis"
    )
    with _intelligence(ctx) as stub:
        reply = getattr(stub, method)(
            ipb.GetJobRequest(evaluation_id=evaluation_id), timeout=CALL_SECONDS
        )
    show(reply, as_json, fields)


@jobs_app.command(name="trigger")
def jobs_trigger(
    ctx: typer.Context,
    evaluation_id: EVALUATION_ID,
    kind: KIND_ARG = "analysis",
    as_json: JSON_OPTION = False,
) -> None:
    """Start an evaluation's analysis (or comparison); an existing job is returned instead."""
    method = (
        "TriggerComparison"
        if _pick(_JOB_KINDS, kind, "--kind") == ipb.JOB_KIND_COMPARISON
        else "TriggerAnalysis"
    )
    with _intelligence(ctx) as stub:
        reply = getattr(stub, method)(
            ipb.TriggerJobRequest(evaluation_id=evaluation_id), timeout=CALL_SECONDS
        )
    show(reply, as_json, lambda r: table([r.job], _JOB_COLUMNS))


# --- quarantine ---------------------------------------------------------------------------

Service = StrEnum("Service", {name: name for name in SERVICES})  # type: ignore[misc]
EXECUTOR = Service("executor")
SERVICE_OPTION = Annotated[Service, typer.Option("--service", help="whose quarantine")]
_MESSAGE_COLUMNS: list[Column] = [
    ("id", lambda m: m.id),
    ("consumer", lambda m: m.consumer),
    ("subject", lambda m: m.subject),
    ("replays", lambda m: m.replays),
    ("deliveries", lambda m: m.deliveries),
    ("error", lambda m: brief(m.error)),
]


def _quarantine(
    ctx: typer.Context, service: Service
) -> AbstractContextManager[quarantine_pb2_grpc.QuarantineServiceStub]:
    return _stub(ctx, service.value, quarantine_pb2_grpc.QuarantineServiceStub)


@quarantine_app.command(name="list")
def quarantine_list(
    ctx: typer.Context,
    service: SERVICE_OPTION = EXECUTOR,
    consumer: Annotated[str, typer.Option(help="only this consumer's messages")] = "",
    limit: Annotated[int, typer.Option(help="messages per page", min=1, max=500)] = 50,
    page_token: Annotated[str, typer.Option(help="the page after this one")] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """Messages in a service's quarantine, oldest first."""
    request = qpb.ListMessagesRequest(consumer=consumer)
    request.page.page_size, request.page.page_token = limit, page_token
    with _quarantine(ctx, service) as quarantine:
        reply = quarantine.ListMessages(request, timeout=CALL_SECONDS)
    show(reply, as_json, lambda r: table(r.messages, _MESSAGE_COLUMNS))
    if not as_json:
        out.print(f"{reply.total} in quarantine", style="dim")


MESSAGE_ID = Annotated[int, typer.Argument(help="the message's id")]


@quarantine_app.command(name="show")
def quarantine_show(
    ctx: typer.Context,
    message_id: MESSAGE_ID,
    service: SERVICE_OPTION = EXECUTOR,
    as_json: JSON_OPTION = False,
) -> None:
    """One quarantined message."""
    with _quarantine(ctx, service) as quarantine:
        reply = quarantine.GetMessage(qpb.GetMessageRequest(id=message_id), timeout=CALL_SECONDS)
    show(reply, as_json, fields)


@quarantine_app.command(name="replay")
def quarantine_replay(
    ctx: typer.Context,
    message_id: MESSAGE_ID,
    service: SERVICE_OPTION = EXECUTOR,
    as_json: JSON_OPTION = False,
) -> None:
    """Publish a quarantined message again on its subject, and take it out."""
    with _quarantine(ctx, service) as quarantine:
        reply = quarantine.ReplayMessage(
            qpb.ReplayMessageRequest(id=message_id), timeout=CALL_SECONDS
        )
    show(reply, as_json, lambda r: table([r.message], _MESSAGE_COLUMNS))


@quarantine_app.command(name="discard")
def quarantine_discard(
    ctx: typer.Context,
    message_id: MESSAGE_ID,
    service: SERVICE_OPTION = EXECUTOR,
    as_json: JSON_OPTION = False,
) -> None:
    """Remove a quarantined message for good (nothing is published)."""
    with _quarantine(ctx, service) as quarantine:
        reply = quarantine.DiscardMessage(
            qpb.DiscardMessageRequest(id=message_id), timeout=CALL_SECONDS
        )
    show(reply, as_json, lambda r: table([r.message], _MESSAGE_COLUMNS))


# The rows a service's outbox relay set aside (QuarantineService's outbox calls).
outbox_app = typer.Typer(
    help="Outbox rows a service's relay set aside (their publication kept failing).",
    no_args_is_help=True,
)
quarantine_app.add_typer(outbox_app, name="outbox")
_OUTBOX_COLUMNS: list[Column] = [
    ("id", lambda r: r.id),
    ("subject", lambda r: r.subject),
    ("msg_id", lambda r: r.msg_id),
    ("bytes", lambda r: r.size),
    ("attempts", lambda r: r.attempts),
    ("error", lambda r: brief(r.last_error)),
]
ROW_IDS = Annotated[list[int], typer.Argument(help="the rows' ids (at most 100)")]


@outbox_app.command(name="list")
def outbox_list(
    ctx: typer.Context,
    service: SERVICE_OPTION = EXECUTOR,
    limit: Annotated[int, typer.Option(help="rows per page", min=1, max=200)] = 50,
    page_token: Annotated[str, typer.Option(help="the page after this one")] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """A service's set-aside outbox rows, oldest first (held until replayed or discarded)."""
    request = qpb.ListOutboxRowsRequest()
    request.page.page_size, request.page.page_token = limit, page_token
    with _quarantine(ctx, service) as quarantine:
        reply = quarantine.ListOutboxRows(request, timeout=CALL_SECONDS)
    show(reply, as_json, lambda r: table(r.rows, _OUTBOX_COLUMNS))


@outbox_app.command(name="replay")
def outbox_replay(
    ctx: typer.Context,
    row_ids: ROW_IDS,
    service: SERVICE_OPTION = EXECUTOR,
    as_json: JSON_OPTION = False,
) -> None:
    """Give set-aside rows back to the relay with a fresh count of attempts (once their
    cause is removed)."""
    with _quarantine(ctx, service) as quarantine:
        reply = quarantine.ReplayOutboxRows(
            qpb.OutboxRowsRequest(ids=row_ids), timeout=CALL_SECONDS
        )
    show(reply, as_json, lambda r: f"{r.changed} given back to the relay")


@outbox_app.command(name="discard")
def outbox_discard(
    ctx: typer.Context,
    row_ids: ROW_IDS,
    service: SERVICE_OPTION = EXECUTOR,
    as_json: JSON_OPTION = False,
) -> None:
    """Delete set-aside rows for good: their events are given up."""
    with _quarantine(ctx, service) as quarantine:
        reply = quarantine.DiscardOutboxRows(
            qpb.OutboxRowsRequest(ids=row_ids), timeout=CALL_SECONDS
        )
    show(reply, as_json, lambda r: f"{r.changed} discarded")
