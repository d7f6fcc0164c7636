"""``dispo submit`` and ``dispo tasks``: the gateway's tasks, through the SDK.

A submission file is the SubmitRequest as grpcurl takes it, in JSON or YAML::

    business: ecommerce
    idempotency_key: content-42-raise
    cells:
      - {cell: update_quality_level, payload: {content_id: content-42, level: 3}}
      - {cell: notify_owner, payload: {owner_id: user-7, message: label raised},
         depends_on: [update_quality_level]}

A file of several tasks is the SubmitManyRequest: ``requests:`` and a list of those
(at most 500), submitted by one SubmitMany, all or none. ``not_before`` and ``deadline`` are
ISO 8601 times (``2027-01-01T02:00:00Z``); ``--not-before``, ``--delay`` and ``--deadline``
set them for every task of the file. ``labels`` is a map (``{campaign: import-7}``);
``--label k=v`` (repeatable) adds one to every task of the file.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.payload import payload_value
from dispo.libs.proto_enums import from_short_name
from dispo.libs.task_requests import label_pairs
from dispo.libs.timestamps import set_timestamp
from dispo.sdk import TERMINAL, BulkAction, CellSpec, Submitted, TaskPage, TaskRequest, TaskView
from dispo.tools.cli._common import (
    ENDED_BADLY,
    JSON_OPTION,
    OK,
    as_dict,
    brief,
    duration_seconds,
    emit_json,
    moment,
    out,
    progress_bar,
    since,
    target,
    usage,
)
from rich.console import Group
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

tasks_app = typer.Typer(
    help="The gateway's tasks: list, count, show, events, watch, signal, cancel, cancel-all,"
    " erase.",
    no_args_is_help=True,
)

_SUBMIT_KEYS = {
    "business",
    "cells",
    "idempotency_key",
    "callback_url",
    "not_before",
    "deadline",
    "labels",
    "priority",
}
_CELL_KEYS = {"cell", "ref", "payload", "depends_on"}
_STYLES = {
    "SUCCEEDED": "green",
    "FAILED": "red",
    "DEPENDENCY_FAILED": "red",
    "CANCELLED": "yellow",
    "UNKNOWN": "magenta",
    "DEMOTED": "yellow",
    "RETRY_EXHAUSTED": "yellow",
    "RUNNING": "cyan",
    "WAITING": "blue",
}


def _read(source: str) -> tuple[list[dict[str, Any]], bool]:
    """The submissions in ``source`` (a path, or ``-`` for standard input), JSON or YAML:
    one object, or ``requests`` and a list of them (then True: for SubmitMany)."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as error:
        usage(f"cannot read {source}: {error.strerror}")
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as error:
            usage(f"{source} is neither JSON nor YAML: {error}")
    if not isinstance(data, dict):
        usage(f"{source} must hold one object (business, cells, …, or requests)")
    if set(data) == {"requests"}:
        items = data["requests"]
        if not isinstance(items, list) or not items:
            usage(f"{source}: requests must be a list of submissions")
        for i, item in enumerate(items):
            _known(item, f"{source}: requests[{i}]")
        return items, True
    _known(data, source)
    return [data], False


def _known(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        usage(f"{where} must be an object (business, cells, …)")
    unknown = sorted(set(data) - _SUBMIT_KEYS)
    if unknown:
        usage(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(_SUBMIT_KEYS))})")


def _cells(data: dict[str, Any], source: str) -> list[CellSpec]:
    cells = data.get("cells")
    if not isinstance(cells, list) or not cells:
        usage(f"{source}: cells must be a list of cells")
    specs = []
    for i, item in enumerate(cells):
        if not isinstance(item, dict) or "cell" not in item:
            usage(f"{source}: cells[{i}] must be an object with a cell name")
        unknown = sorted(set(item) - _CELL_KEYS)
        if unknown:
            usage(f"{source}: cells[{i}]: unknown field {unknown[0]!r}")
        specs.append(
            CellSpec(
                str(item["cell"]),
                dict(item.get("payload") or {}),
                str(item.get("ref") or ""),
                [str(d) for d in item.get("depends_on") or []],
            )
        )
    return specs


def _instant(value: Any, where: str) -> datetime | None:
    """An ISO 8601 time of a submission (a naive one is local time); None for none."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):  # YAML reads an unquoted time as one
        moment_ = value
    else:
        try:
            moment_ = datetime.fromisoformat(str(value))
        except ValueError:
            usage(f"{where}: not an ISO 8601 time: {value!r}")
    return moment_ if moment_.tzinfo else moment_.astimezone()


def _timing(
    found: list[dict[str, Any]], not_before: str | None, delay: str | None, deadline: str | None
) -> None:
    """``--not-before``, ``--delay`` and ``--deadline`` written into every submission."""
    if not_before and delay:
        usage("give --not-before or --delay, not both")
    start = _instant(not_before, "--not-before") if not_before else None
    if delay:
        start = datetime.now(UTC) + timedelta(seconds=duration_seconds(delay))
    end = _instant(deadline, "--deadline") if deadline else None
    for data in found:
        if start is not None:
            data["not_before"] = start
        if end is not None:
            data["deadline"] = end


def labels(pairs: list[str] | None) -> dict[str, str]:
    """``--label k=v`` options as a label map (a malformed pair is a usage error)."""
    try:
        return label_pairs(pairs or [])
    except ValueError as error:
        usage(f"--label: {error}")


def _labelled(found: list[dict[str, Any]], given: dict[str, str], source: str) -> None:
    """Each submission's ``labels`` as a map of strings, with ``--label``'s added."""
    for i, data in enumerate(found):
        own = data.get("labels") or {}
        if not isinstance(own, dict):
            where = f"requests[{i}].labels" if len(found) > 1 else "labels"
            usage(f"{source}: {where} must be a map of key to value")
        data["labels"] = {str(k): str(v) for k, v in {**own, **given}.items()}


LABEL_OPTION = Annotated[
    list[str] | None,
    typer.Option("--label", help="key=value: a label (repeat for several; all must match)"),
]
NOT_BEFORE_OPTION = Annotated[
    str | None,
    typer.Option("--not-before", help="start no earlier than this ISO 8601 time (a delayed start)"),
]
DELAY_OPTION = Annotated[
    str | None, typer.Option("--delay", help="start no earlier than this long from now: 90s, 15m")
]
DEADLINE_OPTION = Annotated[
    str | None,
    typer.Option("--deadline", help="end FAILED if not finished by this ISO 8601 time"),
]
PRIORITY_OPTION = Annotated[
    int | None,
    typer.Option("--priority", help="1 (highest) to 5 within the business's share (default 3)"),
]
PRIORITIES_OPTION = Annotated[
    list[int] | None,
    typer.Option(
        "--priority",
        min=1,
        max=5,
        help="only tasks of this priority, 1 (highest) to 5 (repeat for several: any of them)",
    ),
]


def _priority(data: dict[str, Any], where: str) -> int:
    value = data.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        usage(f"{where}: priority must be a whole number 1 to 5, got {value!r}")
    return int(value)


def submit(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="the submission: a JSON or YAML file, - for stdin")],
    wait: Annotated[bool, typer.Option("--wait", help="follow the task to its end")] = False,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits at most")] = 300.0,
    not_before: NOT_BEFORE_OPTION = None,
    delay: DELAY_OPTION = None,
    deadline: DEADLINE_OPTION = None,
    label: LABEL_OPTION = None,
    priority: PRIORITY_OPTION = None,
    as_json: JSON_OPTION = False,
) -> None:
    """Submit a task, or the tasks of a file of requests in one call (exit 1 with --wait
    when one ends FAILED or CANCELLED)."""
    found, many = _read(source)
    _timing(found, not_before, delay, deadline)
    _labelled(found, labels(label), source)
    if priority is not None:
        for data in found:
            data["priority"] = priority
    if many:
        raise typer.Exit(_submit_many(ctx, found, source, wait, timeout, as_json))
    data = found[0]
    cells = _cells(data, source)
    with target(ctx).client() as client:
        submitted = client.submit(
            str(data.get("business", "")),
            cells,
            idempotency_key=str(data.get("idempotency_key", "")),
            callback_url=str(data.get("callback_url", "")),
            not_before=_instant(data.get("not_before"), f"{source}: not_before"),
            deadline=_instant(data.get("deadline"), f"{source}: deadline"),
            labels=data.get("labels"),
            priority=_priority(data, source),
        )
        if not wait:
            if as_json:
                emit_json(_submit_response(submitted))
            else:
                _print_submitted(submitted)
            return
        client.wait(submitted.task_id, timeout=timeout)
        done = client.get(submitted.task_id)
    raise typer.Exit(_print_task(done, as_json))


def _submit_many(
    ctx: typer.Context,
    found: list[dict[str, Any]],
    source: str,
    wait: bool,
    timeout: float,
    as_json: bool,
) -> int:
    requests = [
        TaskRequest(
            str(data.get("business", "")),
            _cells(data, f"{source}: requests[{i}]"),
            idempotency_key=str(data.get("idempotency_key", "")),
            callback_url=str(data.get("callback_url", "")),
            not_before=_instant(data.get("not_before"), f"{source}: requests[{i}].not_before"),
            deadline=_instant(data.get("deadline"), f"{source}: requests[{i}].deadline"),
            labels=data.get("labels"),
            priority=_priority(data, f"{source}: requests[{i}]"),
        )
        for i, data in enumerate(found)
    ]
    with target(ctx).client() as client:
        submitted = client.submit_many(requests)
        if not wait:
            if as_json:
                emit_json(
                    gateway_pb2.SubmitManyResponse(
                        responses=[_submit_response(s) for s in submitted]
                    )
                )
            else:
                for s in submitted:
                    _print_submitted(s)
            return OK
        views = []
        for s in submitted:
            client.wait(s.task_id, timeout=timeout)
            views.append(client.get(s.task_id))
    if as_json:
        emit_json([gateway_pb2.GetTaskResponse(task=v.raw) for v in views])
    else:
        for v in views:
            out.print(Text.assemble(v.task_id, "  ", _styled(v.status)))
    return max(_final_code(v) for v in views)


def _submit_response(submitted: Submitted) -> gateway_pb2.SubmitResponse:
    return gateway_pb2.SubmitResponse(
        task_id=submitted.task_id,
        status=from_short_name(common_pb2.TaskStatus, submitted.status),
        duplicate=submitted.duplicate,
    )


def _print_submitted(submitted: Submitted) -> None:
    again = " (the same idempotency key: the earlier task)" if submitted.duplicate else ""
    out.print(f"{submitted.task_id}  {submitted.status}{again}", highlight=False)


def _final_code(view: TaskView) -> int:
    return OK if view.status == "SUCCEEDED" else ENDED_BADLY


def task_json(reply: gateway_pb2.GetTaskResponse) -> dict[str, Any]:
    """GetTaskResponse in the proto's JSON form, except that each node's ``output`` and the
    task's ``result`` are their JSON values, whole (not a Payload's base64 bytes)."""
    printed = as_dict(reply)
    task = reply.task
    for node, shown in zip(task.nodes, printed["task"]["nodes"], strict=True):
        shown["output"] = payload_value(node.output) if node.HasField("output") else None
    printed["task"]["result"] = payload_value(task.result) if task.HasField("result") else None
    return printed


def _print_task(view: TaskView, as_json: bool) -> int:
    if as_json:
        reply = gateway_pb2.GetTaskResponse(task=view.raw, labels=view.labels)
        if view.completion is not None:
            if view.completion.finished_at is not None:
                set_timestamp(reply.completion.finished_at, view.completion.finished_at)
            reply.completion.callback_url = view.completion.callback_url
        if view.erased_at is not None:
            reply.erasure.CopyFrom(_erasure(view))
        emit_json(task_json(reply))
    else:
        out.print(task_picture(view))
    return _final_code(view) if view.terminal else OK


def _erasure(view: TaskView) -> gateway_pb2.Erasure:
    erasure = gateway_pb2.Erasure(erased_by=view.erased_by)
    if view.erased_at is not None:
        set_timestamp(erasure.erased_at, view.erased_at)
    return erasure


def _styled(status: str) -> Text:
    return Text(status, style=_STYLES.get(status, ""))


def task_picture(view: TaskView) -> Group:
    """The task's header, its node table and its dependency tree."""
    head = Text.assemble(
        (view.task_id, "bold"), "  ", view.business, "  ", _styled(view.status), "  "
    )
    if view.cancel_requested:
        head.append("cancel requested  ", style="yellow")
    if view.status_reason:
        head.append(view.status_reason)
    if view.not_before is not None:
        scheduled = view.status == "ACCEPTED" and view.not_before > datetime.now(UTC)
        head.append(f"  {'scheduled, starts' if scheduled else 'started after'} ")
        head.append(moment(view.not_before))
    if view.deadline is not None:
        head.append(f"  deadline {moment(view.deadline)}")
    if view.labels:
        head.append(f"\nlabels {_labels_text(view.labels)}")
    if view.erased_at is not None:
        head.append("\nerased ", style="magenta")
        head.append(f"{moment(view.erased_at)} by {view.erased_by}")
    table = Table(box=None, pad_edge=False)
    for column in ("node", "status", "attempts", "last error", "started", "finished"):
        table.add_column(column, overflow="fold")
    for node in view.nodes:
        table.add_row(
            node.node_id,
            _styled(node.status),
            str(node.attempts),
            brief(node.last_error, 120),
            moment(node.started_at),
            moment(node.finished_at),
        )
    return Group(head, table, *outputs_picture(view), dependency_tree(view))


def _labels_text(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


# At a terminal, how much of an output or a result `tasks show` prints (`--json`: whole).
OUTPUT_BRIEF = 200


def _json_text(value: Any) -> str:
    return brief(json.dumps(value, ensure_ascii=False, separators=(",", ":")), OUTPUT_BRIEF)


def outputs_picture(view: TaskView) -> list[Any]:
    """What the task's nodes returned and its result, each as JSON (at a terminal its first
    200 characters); nothing for a task without outputs that has not SUCCEEDED."""
    if view.outputs_unavailable:
        return [
            Text(
                "outputs: not read (the executor did not answer); ask again, or --json later",
                style="yellow",
            )
        ]
    shown: list[Any] = []
    table = Table(box=None, pad_edge=False)
    for column in ("node", "output"):
        table.add_column(column, overflow="fold")
    for node in view.nodes:
        if node.output_bytes:
            table.add_row(node.node_id, _json_text(node.output))
    if table.row_count:
        shown.append(table)
    if view.raw.HasField("result"):
        shown.append(Text.assemble(("result ", "bold"), _json_text(view.result)))
    return shown


def dependency_tree(view: TaskView) -> Tree:
    """Each node under the nodes it waits for (a node after two others appears under both)."""
    tree = Tree("dependencies", guide_style="dim")
    after: dict[str, list[str]] = {n.node_id: [] for n in view.nodes}
    for node in view.nodes:
        for dependency in node.depends_on:
            after.setdefault(dependency, []).append(node.node_id)
    status = {n.node_id: n.status for n in view.nodes}

    def grow(branch: Tree, node_id: str, seen: frozenset[str]) -> None:
        leaf = branch.add(Text.assemble(node_id, " ", _styled(status.get(node_id, ""))))
        for child in after.get(node_id, []):
            if child not in seen:
                grow(leaf, child, seen | {child})

    for node in view.nodes:
        if not node.depends_on:
            grow(tree, node.node_id, frozenset({node.node_id}))
    return tree


SINCE_OPTION = Annotated[
    str | None,
    typer.Option("--since", help="created since: a duration back (15m, 2h, 3d) or an ISO time"),
]
KEY_OPTION = Annotated[
    str,
    typer.Option(
        "--idempotency-key", "--key", help="only the task submitted with this key (one a business)"
    ),
]


@tasks_app.command(name="list")
def list_(
    ctx: typer.Context,
    status: Annotated[
        list[str] | None,
        typer.Option(help="only tasks in this status (repeat for several): SUCCEEDED, FAILED, …"),
    ] = None,
    business: Annotated[str, typer.Option(help="only this business's tasks")] = "",
    since_: SINCE_OPTION = None,
    key: KEY_OPTION = "",
    limit: Annotated[int, typer.Option(help="tasks per page", min=1, max=500)] = 20,
    page_token: Annotated[
        str, typer.Option(help="the page after this one (from a --json page)")
    ] = "",
    oldest_first: Annotated[bool, typer.Option("--oldest-first", help="oldest first")] = False,
    scheduled: Annotated[
        bool, typer.Option("--scheduled", help="only tasks whose delayed start is ahead")
    ] = False,
    label: LABEL_OPTION = None,
    priority: PRIORITIES_OPTION = None,
    as_json: JSON_OPTION = False,
) -> None:
    """Tasks, newest first, a page at a time (a scheduled task shows when it starts)."""
    statuses = [s.upper().removeprefix("TASK_STATUS_") for s in status or []]
    with target(ctx).client() as client:
        page = client.list_page(
            business=business,
            statuses=_known_statuses(statuses),
            created_after=since(since_) if since_ else None,
            page_size=limit,
            page_token=page_token,
            order="oldest" if oldest_first else "newest",
            idempotency_key=key,
            scheduled=scheduled,
            labels=labels(label),
            priorities=priority or [],
        )
    if as_json:
        reply = gateway_pb2.ListTasksResponse(tasks=[t.raw for t in page.tasks], more=page.more)
        reply.page.next_page_token = page.next_page_token
        emit_json(reply)
        return
    out.print(_task_table(page))
    if page.more:
        out.print(f"more: --page-token {page.next_page_token}", style="dim", highlight=False)


@tasks_app.command()
def count(
    ctx: typer.Context,
    business: Annotated[str, typer.Option(help="only this business's tasks")] = "",
    since_: SINCE_OPTION = None,
    key: KEY_OPTION = "",
    label: LABEL_OPTION = None,
    priority: PRIORITIES_OPTION = None,
    as_json: JSON_OPTION = False,
) -> None:
    """How many tasks are in each status, exactly (the gateway's CountTasks)."""
    with target(ctx).client() as client:
        counts = client.count(
            business=business,
            created_after=since(since_) if since_ else None,
            idempotency_key=key,
            labels=labels(label),
            priorities=priority or [],
        )
    if as_json:
        reply = gateway_pb2.CountTasksResponse(total=sum(counts.values()))
        for name, n in counts.items():
            reply.counts.add(status=from_short_name(common_pb2.TaskStatus, name), count=n)
        emit_json(reply)
        return
    table = Table(box=None, pad_edge=False)
    table.add_column("status")
    table.add_column("tasks", justify="right")
    for name, n in counts.items():
        table.add_row(_styled(name), str(n))
    table.add_row("total", str(sum(counts.values())), style="bold")
    out.print(table)


def _known_statuses(statuses: list[str]) -> list[str]:
    names = [n.removeprefix("TASK_STATUS_") for n in common_pb2.TaskStatus.keys()][1:]
    for name in statuses:
        if name not in names:
            usage(f"--status {name}: not a task status (one of {', '.join(names)})")
    return statuses


def _task_table(page: TaskPage) -> Table:
    table = Table(box=None, pad_edge=False)
    labelled = any(task.labels for task in page.tasks)
    for column in ("task", "business", "status", "priority", "nodes", "created", "updated"):
        table.add_column(column)
    if labelled:
        table.add_column("labels", overflow="fold")
    now = datetime.now(UTC)
    for task in page.tasks:
        table.add_row(
            task.task_id,
            task.business,
            _styled(task.status)
            + (f" (scheduled {moment(task.not_before)})" if task.scheduled(now) else ""),
            str(task.priority),
            str(task.node_count),
            moment(task.created_at),
            moment(task.updated_at),
            *([_labels_text(task.labels)] if labelled else []),
        )
    return table


@tasks_app.command()
def show(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    as_json: JSON_OPTION = False,
) -> None:
    """A task's nodes (status, attempts, last error, times) and its dependency tree."""
    with target(ctx).client() as client:
        view = client.get(task_id)
    _print_task(view, as_json)


@tasks_app.command()
def events(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    limit: Annotated[int, typer.Option(help="events per page", min=1, max=500)] = 100,
    page_token: Annotated[
        str, typer.Option(help="the events after this page (from a --json page)")
    ] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """A task's history, oldest first: each status change, and what it changed in the
    nodes (the status stream keeps 7 days of it)."""
    with target(ctx).client() as client:
        page = client.events_page(task_id, page_size=limit, page_token=page_token)
    if as_json:
        reply = gateway_pb2.ListTaskEventsResponse(
            events=[e.raw for e in page.events], more=page.more
        )
        reply.page.next_page_token = page.next_page_token
        emit_json(reply)
        return
    table = Table(box=None, pad_edge=False)
    for column in ("time", "version", "by", "status", "changes"):
        table.add_column(column)
    for event in page.events:
        status = _styled(event.status)
        if event.status_reason:
            status.append(f" ({event.status_reason})", style="dim")
        table.add_row(
            moment(event.time),
            str(event.version),
            event.publisher,
            status,
            "\n".join(c.describe() for c in event.changes),
        )
    out.print(table)
    if page.more:
        out.print(f"more: --page-token {page.next_page_token}", style="dim", highlight=False)


@tasks_app.command()
def watch(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    as_json: JSON_OPTION = False,
) -> None:
    """Follow a task, redrawn in place, until it ends (exit 1 if FAILED or CANCELLED)."""
    from rich.live import Live

    last: TaskView | None = None
    with target(ctx).client() as client:
        if as_json:  # one line of JSON per change, outputs and result as JSON values
            for view in client.watch(task_id):
                last = view
                shown = task_json(gateway_pb2.GetTaskResponse(task=view.raw))["task"]
                sys.stdout.write(json.dumps(shown, ensure_ascii=False) + "\n")
                sys.stdout.flush()
        else:
            with Live(console=out, auto_refresh=False) as live:
                for view in client.watch(task_id):
                    last = view
                    live.update(task_picture(view), refresh=True)
    raise typer.Exit(_final_code(last) if last is not None and last.status in TERMINAL else OK)


@tasks_app.command()
def signal(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    name: Annotated[str, typer.Argument(metavar="SIGNAL", help="the signal's name")],
    payload: Annotated[
        str, typer.Option("--payload", help="the payload: a JSON object (default {})")
    ] = "{}",
    signal_id: Annotated[
        str, typer.Option("--signal-id", help="your id of the signal: a repeat is a no-op")
    ] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """Send a signal to a task's wait nodes: the payload becomes the output of the node
    waiting for it (docs/waiting.md)."""
    try:
        value = json.loads(payload)
    except ValueError as error:
        usage(f"--payload is not JSON: {error}")
    if not isinstance(value, dict):
        usage("--payload must be a JSON object")
    with target(ctx).client() as client:
        sent = client.signal(task_id, name, value, signal_id=signal_id)
    if as_json:
        emit_json(
            gateway_pb2.SignalTaskResponse(
                task_id=sent.task_id, signal_id=sent.signal_id, duplicate=sent.duplicate
            )
        )
    else:
        said = "duplicate: already recorded, nothing changed" if sent.duplicate else "recorded"
        out.print(f"{sent.task_id}  signal {name} {sent.signal_id}  {said}", highlight=False)


@tasks_app.command()
def cancel(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    as_json: JSON_OPTION = False,
) -> None:
    """Cancel a task: pending nodes become CANCELLED, running ones finish."""
    with target(ctx).client() as client:
        view = client.cancel(task_id)
    if as_json:
        emit_json(gateway_pb2.CancelTaskResponse(task=view.raw))
    else:
        out.print(f"{view.task_id}  cancel requested ({view.status})", highlight=False)


@tasks_app.command(name="cancel-all")
def cancel_all(
    ctx: typer.Context,
    business: Annotated[str, typer.Option(help="only this business's tasks")] = "",
    status: Annotated[
        list[str] | None,
        typer.Option(help="only tasks in this unfinished status (repeat for several)"),
    ] = None,
    since_: SINCE_OPTION = None,
    before: Annotated[
        str | None, typer.Option(help="created before: a duration back (15m) or an ISO time")
    ] = None,
    key: KEY_OPTION = "",
    label: LABEL_OPTION = None,
    priority: PRIORITIES_OPTION = None,
    rate: Annotated[float, typer.Option(help="at most this many tasks a second", min=0.001)] = 100,
    reason: Annotated[str, typer.Option(help="why (kept in the record)")] = "",
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="count the tasks it would cancel; change nothing")
    ] = False,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="answer once asked; do not follow it")
    ] = False,
    as_json: JSON_OPTION = False,
) -> None:
    """Cancel every unfinished task the filters match (the gateway's CancelByFilter), each as
    `dispo tasks cancel` would, at --rate a second; a bar follows it to the end."""
    statuses = [s.upper().removeprefix("TASK_STATUS_") for s in status or []]
    with target(ctx).client() as client:
        action = client.cancel_by_filter(
            business=business,
            statuses=_known_statuses(statuses),
            created_after=since(since_) if since_ else None,
            created_before=since(before) if before else None,
            idempotency_key=key,
            labels=labels(label),
            priorities=priority or [],
            rate_per_second=rate,
            dry_run=dry_run,
            reason=reason,
        )
        if dry_run or no_wait:
            if as_json:
                reply = gateway_pb2.CancelByFilterResponse(matched=action.matched)
                if action.action_id:
                    reply.action.CopyFrom(action.raw)
                emit_json(reply)
            elif dry_run:
                out.print(f"{action.matched} tasks would be cancelled (dry run)", highlight=False)
            else:
                _print_action(action)
            return
        with progress_bar(action.matched, "cancelling", disable=as_json) as advance:
            taken = 0
            while not action.done:
                time.sleep(0.5)
                action = client.bulk_action(action.action_id)
                advance(action.processed - taken)
                taken = action.processed
    if as_json:
        emit_json(gateway_pb2.GetBulkActionResponse(action=action.raw))
    else:
        _print_action(action)


def _print_action(action: BulkAction) -> None:
    out.print(
        f"{action.action_id}  cancel {action.state}: {action.matched} matched,"
        f" {action.acted} cancelled, {action.skipped} asked already",
        highlight=False,
    )


@tasks_app.command(name="bulk-actions")
def bulk_actions(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(help="at most this many", min=1, max=500)] = 20,
    as_json: JSON_OPTION = False,
) -> None:
    """The newest bulk actions: who asked, when, how far each is (ListBulkActions)."""
    with target(ctx).client() as client:
        actions = client.bulk_actions(page_size=limit)
    if as_json:
        emit_json(gateway_pb2.ListBulkActionsResponse(actions=[a.raw for a in actions]))
        return
    table = Table(box=None, pad_edge=False)
    for column in ("action", "kind", "state", "actor", "asked", "matched", "done", "reason"):
        table.add_column(column)
    for a in actions:
        table.add_row(
            a.action_id,
            a.kind,
            a.state,
            a.actor,
            moment(a.created_at),
            str(a.matched),
            str(a.processed),
            a.reason,
        )
    out.print(table)


@tasks_app.command()
def erase(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(help="the task's id")],
    as_json: JSON_OPTION = False,
) -> None:
    """Erase a finished task's payloads and outputs in every service (docs/retention.md,
    Erasure); ids, statuses and times stay. Erasing again answers the same."""
    with target(ctx).client() as client:
        view = client.erase(task_id)
    if as_json:
        emit_json(gateway_pb2.EraseTaskResponse(task=view.raw, erasure=_erasure(view)))
    else:
        out.print(
            f"{view.task_id}  erased {moment(view.erased_at)} by {view.erased_by} ({view.status})",
            highlight=False,
        )
