"""``dispo schedules``: the gateway's schedules (ScheduleService, docs/schedules.md).

The template is a submission file as ``dispo submit`` takes it (JSON or YAML: business,
cells, callback_url), without an idempotency key: each firing's is
``schedule:<id>:<fire time>``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from dispo.libs.api.gateway.v1 import gateway_pb2, schedule_pb2, schedule_pb2_grpc
from dispo.tools.cli._common import (
    JSON_OPTION,
    duration_seconds,
    enum_name,
    show,
    target,
    usage,
    when,
)
from google.protobuf.json_format import ParseDict, ParseError
from rich.table import Table

schedules_app = typer.Typer(
    help="Schedules: submissions the gateway makes on a cron expression or an interval.",
    no_args_is_help=True,
)

OVERLAPS = ("skip", "buffer_one", "allow")
ID = Annotated[str, typer.Argument(help="the schedule's id")]
FILE = Annotated[
    str | None,
    typer.Option(
        "--file", "-f", help="the template: a submission file (JSON or YAML), - for stdin"
    ),
]
CRON = Annotated[
    str | None, typer.Option(help="a cron expression, e.g. '0 2 * * *' (02:00 every day)")
]
TIME_ZONE = Annotated[
    str | None, typer.Option("--time-zone", help="the cron's IANA time zone (default UTC)")
]
EVERY = Annotated[
    str | None, typer.Option("--every", help="an interval instead of a cron: 90s, 15m, 12h, 1d")
]
JITTER = Annotated[str | None, typer.Option(help="fire up to this much later: 30s, 5m")]
OVERLAP = Annotated[
    str | None, typer.Option(help="while the previous task runs: skip, buffer_one or allow")
]
CATCHUP = Annotated[
    str | None, typer.Option(help="after downtime, missed firings this old still fire: 1h")
]
DESCRIPTION = Annotated[str | None, typer.Option(help="free text for operators")]


@contextmanager
def _stub(ctx: typer.Context) -> Iterator[schedule_pb2_grpc.ScheduleServiceStub]:
    with target(ctx).channel("gateway") as channel:
        yield schedule_pb2_grpc.ScheduleServiceStub(channel)


def _template(source: str) -> gateway_pb2.SubmitRequest:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as error:
        usage(f"cannot read {source}: {error.strerror}")
    try:
        data: Any = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            usage(f"{source} is neither JSON nor YAML: {error}")
    if not isinstance(data, dict):
        usage(f"{source} must hold one submission (business, cells, callback_url)")
    try:
        return ParseDict(data, gateway_pb2.SubmitRequest())
    except ParseError as error:
        usage(f"{source}: {error}")


def _apply(
    definition: schedule_pb2.ScheduleDefinition,
    *,
    file: str | None,
    cron: str | None,
    time_zone: str | None,
    every: str | None,
    jitter: str | None,
    overlap: str | None,
    catchup: str | None,
    description: str | None,
) -> schedule_pb2.ScheduleDefinition:
    """``definition`` with the options given (the others kept)."""
    if cron is not None and every is not None:
        usage("give --cron or --every, not both")
    if file is not None:
        definition.template.CopyFrom(_template(file))
    if cron is not None:
        definition.spec.cron = cron
    if every is not None:
        definition.spec.interval_seconds = duration_seconds(every)
        definition.spec.time_zone = ""
    if time_zone is not None:
        definition.spec.time_zone = time_zone
    if jitter is not None:
        definition.spec.jitter_seconds = duration_seconds(jitter)
    if overlap is not None:
        if overlap not in OVERLAPS:
            usage(f"--overlap must be one of {', '.join(OVERLAPS)}")
        definition.overlap = schedule_pb2.OverlapPolicy.Value(f"OVERLAP_POLICY_{overlap.upper()}")
    if catchup is not None:
        definition.catchup_window_seconds = duration_seconds(catchup)
    if description is not None:
        definition.description = description
    return definition


def _when(spec: schedule_pb2.ScheduleSpec) -> str:
    if spec.WhichOneof("when") == "interval_seconds":
        return f"every {spec.interval_seconds}s"
    return f"{spec.cron} ({spec.time_zone or 'UTC'})"


def _state(schedule: schedule_pb2.Schedule) -> str:
    return "paused" if schedule.paused else "active"


def _render(schedule: schedule_pb2.Schedule) -> Table:
    d = schedule.definition
    table = Table(show_header=False, box=None, title=f"schedule {schedule.schedule_id}")
    table.add_row("business", schedule.business)
    table.add_row("state", _state(schedule))
    table.add_row("when", _when(d.spec))
    table.add_row("jitter", f"{d.spec.jitter_seconds}s")
    overlap = enum_name(schedule_pb2.OverlapPolicy, d.overlap, "OVERLAP_POLICY_").lower()
    table.add_row("overlap", overlap)
    table.add_row("catch-up window", f"{d.catchup_window_seconds}s")
    table.add_row("cells", ", ".join(c.ref or c.cell for c in d.template.cells))
    if d.description:
        table.add_row("description", d.description)
    table.add_row("next firings", "\n".join(when(t) for t in schedule.next_fire_times) or "-")
    if schedule.HasField("buffered_fire_time"):
        table.add_row("buffered", when(schedule.buffered_fire_time))
    table.add_row(
        "skipped",
        f"{schedule.skipped_overlap} (overlap), {schedule.skipped_catchup} (catch-up window)",
    )
    for firing in schedule.recent_firings:
        outcome = enum_name(schedule_pb2.FiringOutcome, firing.outcome, "FIRING_OUTCOME_")
        what = firing.task_id or firing.reason
        manual = " (triggered)" if firing.manual else ""
        table.add_row("fired", f"{when(firing.fire_time)}  {outcome}  {what}{manual}")
    return table


@schedules_app.command()
def create(
    ctx: typer.Context,
    schedule_id: ID,
    file: FILE = None,
    cron: CRON = None,
    time_zone: TIME_ZONE = None,
    every: EVERY = None,
    jitter: JITTER = None,
    overlap: OVERLAP = None,
    catchup: CATCHUP = None,
    description: DESCRIPTION = None,
    paused: Annotated[bool, typer.Option("--paused", help="create it paused")] = False,
    as_json: JSON_OPTION = False,
) -> None:
    """Create a schedule: a template (--file) fired on --cron (with --time-zone) or --every."""
    if file is None:
        usage("--file (the template) is required")
    if cron is None and every is None:
        usage("give --cron or --every")
    definition = _apply(
        schedule_pb2.ScheduleDefinition(),
        file=file,
        cron=cron,
        time_zone=time_zone,
        every=every,
        jitter=jitter,
        overlap=overlap,
        catchup=catchup,
        description=description,
    )
    request = schedule_pb2.CreateScheduleRequest(
        schedule_id=schedule_id, definition=definition, paused=paused
    )
    with _stub(ctx) as stub:
        reply = stub.CreateSchedule(request, timeout=10)
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.schedule)))


@schedules_app.command()
def update(
    ctx: typer.Context,
    schedule_id: ID,
    file: FILE = None,
    cron: CRON = None,
    time_zone: TIME_ZONE = None,
    every: EVERY = None,
    jitter: JITTER = None,
    overlap: OVERLAP = None,
    catchup: CATCHUP = None,
    description: DESCRIPTION = None,
    as_json: JSON_OPTION = False,
) -> None:
    """Change a schedule: the options given replace its values, the others stay."""
    with _stub(ctx) as stub:
        current = stub.GetSchedule(
            schedule_pb2.GetScheduleRequest(schedule_id=schedule_id), timeout=10
        ).schedule
        definition = _apply(
            current.definition,
            file=file,
            cron=cron,
            time_zone=time_zone,
            every=every,
            jitter=jitter,
            overlap=overlap,
            catchup=catchup,
            description=description,
        )
        reply = stub.UpdateSchedule(
            schedule_pb2.UpdateScheduleRequest(schedule_id=schedule_id, definition=definition),
            timeout=10,
        )
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.schedule)))


@schedules_app.command(name="list")
def list_(
    ctx: typer.Context,
    business: Annotated[str, typer.Option(help="only this business's schedules")] = "",
    limit: Annotated[int, typer.Option(help="schedules per page", min=1, max=500)] = 100,
    page_token: Annotated[str, typer.Option(help="the page after this one (from --json)")] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """Schedules by id, with their next firing and their last one."""
    request = schedule_pb2.ListSchedulesRequest(business=business)
    request.page.page_size, request.page.page_token = limit, page_token
    with _stub(ctx) as stub:
        reply = stub.ListSchedules(request, timeout=10)

    def render(r: schedule_pb2.ListSchedulesResponse) -> Table:
        table = Table("schedule", "business", "state", "when", "next firing", "last firing")
        for s in r.schedules:
            last = s.recent_firings[0] if s.recent_firings else None
            table.add_row(
                s.schedule_id,
                s.business,
                _state(s),
                _when(s.definition.spec),
                when(s.next_fire_times[0]) if s.next_fire_times else "-",
                f"{when(last.fire_time)} {last.task_id or last.reason}" if last else "-",
            )
        if r.page.next_page_token:
            table.caption = f"more: --page-token {r.page.next_page_token}"
        return table

    raise typer.Exit(show(reply, as_json, render))


@schedules_app.command(name="show")
def show_(ctx: typer.Context, schedule_id: ID, as_json: JSON_OPTION = False) -> None:
    """A schedule: its spec, next firings, and last firings with their tasks."""
    with _stub(ctx) as stub:
        reply = stub.GetSchedule(
            schedule_pb2.GetScheduleRequest(schedule_id=schedule_id), timeout=10
        )
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.schedule)))


@schedules_app.command()
def pause(ctx: typer.Context, schedule_id: ID, as_json: JSON_OPTION = False) -> None:
    """Stop firing (the fire times that pass meanwhile are dropped, not caught up)."""
    with _stub(ctx) as stub:
        reply = stub.PauseSchedule(
            schedule_pb2.PauseScheduleRequest(schedule_id=schedule_id), timeout=10
        )
    raise typer.Exit(show(reply, as_json, lambda r: f"{schedule_id}  paused"))


@schedules_app.command()
def resume(ctx: typer.Context, schedule_id: ID, as_json: JSON_OPTION = False) -> None:
    """Fire again, from the first fire time after now."""
    with _stub(ctx) as stub:
        reply = stub.ResumeSchedule(
            schedule_pb2.ResumeScheduleRequest(schedule_id=schedule_id), timeout=10
        )

    def render(r: schedule_pb2.ResumeScheduleResponse) -> str:
        first = r.schedule.next_fire_times
        return f"{schedule_id}  active, next firing {when(first[0]) if first else '-'}"

    raise typer.Exit(show(reply, as_json, render))


@schedules_app.command()
def delete(ctx: typer.Context, schedule_id: ID, as_json: JSON_OPTION = False) -> None:
    """Delete a schedule (the tasks it submitted stay)."""
    with _stub(ctx) as stub:
        reply = stub.DeleteSchedule(
            schedule_pb2.DeleteScheduleRequest(schedule_id=schedule_id), timeout=10
        )
    raise typer.Exit(show(reply, as_json, lambda r: f"{schedule_id}  deleted"))


@schedules_app.command()
def trigger(ctx: typer.Context, schedule_id: ID, as_json: JSON_OPTION = False) -> None:
    """Fire now, outside the spec: prints the task submitted."""
    with _stub(ctx) as stub:
        reply = stub.TriggerSchedule(
            schedule_pb2.TriggerScheduleRequest(schedule_id=schedule_id), timeout=10
        )
    raise typer.Exit(
        show(reply, as_json, lambda r: f"{schedule_id}  fired: task {r.firing.task_id}")
    )
