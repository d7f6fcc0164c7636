"""The web console: a backend-for-frontend over the services' gRPC APIs (docs/console.md).

Starlette serves Jinja2 pages that HTMX keeps fresh over server-sent events; the graph of a
task is drawn by Cytoscape.js. The browser libraries are vendored under ``static/vendor``
(``vendor.sh`` refreshes them from the npm registry); nothing is fetched at run time.

The console keeps no state and no tables: a user signs in with an API token (the same as
the CLI's: a business token sees its business's work, operator actions need an admin token),
kept in an HTTP-only cookie and forwarded on every call it makes for that user.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import grpc
import uvicorn
from dispo.console.backend import (
    COUNTED,
    FAILED_PAGE,
    JOB_COUNT_LIMIT,
    JOBS_PAGE,
    JOBS_PAGE_MAX,
    Backend,
    TaskDetail,
)
from dispo.console.catalogue_views import (
    catalogue_downstream_rows,
    cell_rows,
    version_diff,
    version_rows,
)
from dispo.console.headers import SecurityHeaders
from dispo.console.origin import SameOriginWrites, console_hosts
from dispo.console.schedule_views import schedule_row
from dispo.console.settings import ConsoleSettings
from dispo.console.views import (
    COLOURS,
    EVALUATION_ACTIONS,
    JOB_COLOURS,
    JOB_KINDS,
    JOB_STATUSES,
    MAX_BOOST,
    NO_BASELINE_STATUS,
    PRIORITIES,
    SINCE,
    WORK_KINDS,
    JobFilter,
    ResumeProgress,
    TaskFilter,
    age,
    analysis_figures,
    assignment_rows,
    business_rows,
    completion_facts,
    cron_rows,
    direction,
    downstream_rows,
    failed_groups,
    first_due,
    graph_elements,
    history,
    job_row,
    job_rows,
    may_resume,
    parked,
    pool_figures,
    queue_rows,
    record_rows,
    recovery_state,
    resize_rows,
    resume_progress,
    retention_rows,
    shown_json,
    work_kind,
    worker_queue_rows,
)
from dispo.libs.api.pool.v1 import pool_pb2 as ppb
from dispo.libs.clock import Clock, SystemClock
from dispo.libs.logging import configure_logging, get_logger
from dispo.libs.proto_enums import short_name
from dispo.libs.settings import CommonSettings
from dispo.sdk import DispoError, TaskSummary, TaskView
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

log = get_logger(__name__)
HERE = Path(__file__).resolve().parent
TOKEN_COOKIE = "dispo_token"
# Who the services record as the actor of an operator action taken here.
ACTOR = "console"
# How many tasks a second a bulk resume redrives, unless the form says.
BULK_RATE = 5.0
# How many tasks a second the Failed page's "abandon all" abandons.
BULK_ABANDON_RATE = 100.0
# How many tasks a second a "cancel all" of the Tasks page cancels.
BULK_CANCEL_RATE = 100.0
# The HTTP status a refused call is shown with.
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}

templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals.update(
    colours=COLOURS,
    counted=COUNTED,
    since_choices=SINCE,
    priority_choices=PRIORITIES,
    bulk_cancel_rate=BULK_CANCEL_RATE,
    age=age,
    job_colours=JOB_COLOURS,
    no_baseline=NO_BASELINE_STATUS,
    direction=direction,
    work_kind=work_kind,
    parked=parked,
    shown_json=shown_json,
)


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") if value else ""


templates.env.filters["when"] = _when


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


# The longest token the console forwards (the services' are 49 characters).
MAX_TOKEN = 512


def well_formed(token: str) -> bool:
    """Whether ``token`` may be a token at all: printable ASCII without spaces (what gRPC
    metadata may carry), and not too long. Anything else (a control character, CR LF) is
    no token: never forwarded, it signs the browser out."""
    return 0 < len(token) <= MAX_TOKEN and all("!" <= c <= "~" for c in token)


def _token(request: Request) -> str:
    """The browser's token; empty when it has none, or a cookie that holds no token."""
    token = request.cookies.get(TOKEN_COOKIE, "")
    return token if well_formed(token) else ""


class SignIn(Exception):
    """The request carries no token, or a cookie that holds none: to the sign-in page."""


# Why the browser was sent to the sign-in page, as its address says (``/login?why=…``) and
# the page tells the user; nothing of the request is echoed.
SIGNED_OUT = {
    "refused": "The services refused that token: mistyped, revoked or expired."
    " Sign in with another.",
    "malformed": "The browser held something that is no token. Sign in with a token.",
}


def _signed_in(request: Request) -> str:
    token = _token(request)
    if not token:
        raise SignIn
    return token


async def _refused(request: Request, error: Exception) -> Response:
    assert isinstance(error, DispoError)
    if error.code == grpc.StatusCode.UNAUTHENTICATED:
        return await _to_sign_in(request, error)
    return templates.TemplateResponse(
        request,
        "error.html",
        {"error": error, "violations": error.violations, **_messages(request)},
        status_code=HTTP_STATUS.get(error.code, 502),
    )


async def _to_sign_in(request: Request, error: Exception) -> Response:
    """To the sign-in page, the browser's token dropped, saying why when it had one: the
    services refused it, or the cookie held no token."""
    why = ""
    if isinstance(error, DispoError):
        why = "refused"
    elif TOKEN_COOKIE in request.cookies:
        why = "malformed"
    response = RedirectResponse(f"/login?why={why}" if why else "/login", status_code=303)
    response.delete_cookie(TOKEN_COOKIE)
    return response


async def login_page(request: Request) -> Response:
    message = SIGNED_OUT.get(request.query_params.get("why", ""), "")
    return templates.TemplateResponse(request, "login.html", {"message": message})


async def login(request: Request) -> Response:
    form = await request.form()
    token = str(form.get("token", "")).strip()
    if not token:
        return templates.TemplateResponse(
            request, "login.html", {"message": "a token is required"}, status_code=400
        )
    if not well_formed(token):
        return templates.TemplateResponse(
            request,
            "login.html",
            {"message": "that is not a token: a token is printable ASCII, without spaces"},
            status_code=400,
        )
    response = RedirectResponse("/tasks", status_code=303)
    response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return response


async def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(TOKEN_COOKIE)
    return response


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


def _filter(request: Request) -> TaskFilter:
    params = request.query_params
    return TaskFilter.parse(params, params.getlist("status"), params.getlist("priority"))


def _labels_of(found: TaskFilter) -> dict[str, str]:
    """The labels a search names (INVALID_ARGUMENT naming ``labels`` for a malformed one)."""
    try:
        return found.label_map
    except ValueError as error:
        raise DispoError(
            grpc.StatusCode.INVALID_ARGUMENT, str(error), {"labels": str(error)}
        ) from None


async def _tasks_context(request: Request, token: str) -> dict[str, Any]:
    found = _filter(request)
    backend = _backend(request)
    after = found.created_after(datetime.now(UTC))
    rows: list[TaskSummary | TaskView]
    counts: dict[str, int] = {}
    if found.task_id:
        detail = await backend.task(token, found.task_id)
        rows = [detail.task]
        counts = {detail.task.status: 1}  # the one task the search matches
    else:
        business, key = found.business, found.key
        labels = _labels_of(found)
        page, counts = await asyncio.gather(
            backend.tasks(
                token,
                business=business,
                statuses=found.statuses,
                created_after=after,
                idempotency_key=key,
                scheduled=found.scheduled,
                labels=labels,
                priorities=found.priorities,
            ),
            backend.counts(
                token,
                business=business,
                created_after=after,
                idempotency_key=key,
                labels=labels,
                priorities=found.priorities,
            ),
        )
        rows = list(page.tasks)
    return {"filter": found, "rows": rows, "counts": counts, "now": datetime.now(UTC)}


async def tasks_page(request: Request) -> Response:
    token = _signed_in(request)
    context = {**await _tasks_context(request, token), **_messages(request)}
    context["stream"] = f"/tasks/stream?{request.url.query}"
    return templates.TemplateResponse(request, "tasks.html", context)


def _event(name: str, html: str) -> str:
    """One server-sent event whose data is ``html`` (HTMX swaps it in)."""
    lines = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
    return f"event: {name}\n{lines}\n"


# With nothing changed for this long, a stream sends a comment, so a proxy between the
# browser and the console does not take the connection for idle.
KEEPALIVE_SECONDS = 15.0
SYSTEM_CLOCK = SystemClock()


def _stream(
    request: Request,
    render: Any,
    interval: float,
    clock: Clock = SYSTEM_CLOCK,
) -> StreamingResponse:
    """Server-sent events: what ``render()`` returns (``[(event, html)]``), looked at every
    ``interval`` seconds (``clock``) until the page is closed; a refused call ends the
    stream (the page reloads). A fragment is sent only when it differs from the one this
    stream sent last: swapping an unchanged fragment in would redraw the page under the
    user's pointer (a click on a button being replaced is lost) for nothing. After
    ``KEEPALIVE_SECONDS`` of the clock with nothing sent, a comment goes instead, however
    long the looks took."""

    async def events() -> AsyncIterator[str]:
        last: dict[str, str] = {}
        sent_at = clock.now()
        while not await request.is_disconnected():
            try:
                rendered = await render()
            except DispoError as error:
                yield _event("refused", error.message)
                return
            changed = [(name, html) for name, html in rendered if last.get(name) != html]
            for name, html in changed:
                last[name] = html
                yield _event(name, html)
            now = clock.now()
            if changed:
                sent_at = now
            elif (now - sent_at).total_seconds() >= KEEPALIVE_SECONDS:
                sent_at = now
                yield ": nothing changed\n\n"
            await clock.sleep(interval)

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"cache-control": "no-store"}
    )


def _fragment(request: Request, name: str, context: dict[str, Any]) -> str:
    return templates.get_template(name).render({"request": request, **context})


async def tasks_stream(request: Request) -> Response:
    token = _signed_in(request)

    async def render() -> list[tuple[str, str]]:
        context = await _tasks_context(request, token)
        return [
            ("counts", _fragment(request, "_counts.html", context)),
            ("rows", _fragment(request, "_task_rows.html", context)),
        ]

    return _stream(request, render, request.app.state.settings.refresh_seconds)


async def _task_context(
    request: Request, token: str, known: TaskDetail | None = None
) -> dict[str, Any]:
    detail = await _backend(request).task(token, request.path_params["task_id"], known)
    return {
        "detail": detail,
        "task": detail.task,
        "elements": graph_elements(detail.task),
        "history": history(detail),
        "facts": completion_facts(detail),
        "recovery_state": recovery_state(detail),
        "resumable": may_resume(detail),
        "choices": detail.choices,
        **_messages(request),
    }


async def task_page(request: Request) -> Response:
    context = await _task_context(request, _signed_in(request))
    return templates.TemplateResponse(request, "task.html", context)


async def task_stream(request: Request) -> Response:
    token = _signed_in(request)

    shown: TaskDetail | None = None  # what the last look found: its history is kept

    async def render() -> list[tuple[str, str]]:
        nonlocal shown
        context = await _task_context(request, token, shown)
        shown = context["detail"]
        return [
            ("detail", _fragment(request, "_task_detail.html", context)),
            ("graph", json.dumps(context["elements"])),
        ]

    return _stream(request, render, request.app.state.settings.refresh_seconds)


def _back(request: Request, page: str, **message: str) -> Response:
    """After an action: back to ``page``, saying what happened (and any other query fields
    the page reads; HTMX goes where ``HX-Redirect`` says, a plain form follows the 303)."""
    where = f"{page}?{urlencode(message)}"
    if request.headers.get("HX-Request"):  # a redirect would be followed inside the request
        return Response(status_code=204, headers={"HX-Redirect": where})
    return RedirectResponse(where, status_code=303)


@dataclass(frozen=True)
class Done:
    """What an action did, in words, and the query fields the page it returns to shows
    more of it with."""

    message: str
    query: Mapping[str, str]


Action = Callable[[Backend, str, Mapping[str, str]], Awaitable[Any]]


def _action(name: str, page: Callable[[Request], str], act: Action) -> Callable[..., Any]:
    """A POST route: ``act(backend, token, form and path fields)``, then back to ``page``
    with what happened (a refusal said there; an unaccepted token signs the user out)."""

    async def route(request: Request) -> Response:
        token = _signed_in(request)
        form = await request.form()
        fields = {**{k: str(v) for k, v in form.items()}, **request.path_params}
        try:
            done = await act(_backend(request), token, fields)
        except DispoError as error:
            if error.code == grpc.StatusCode.UNAUTHENTICATED:
                raise
            return _back(
                request, page(request), error=f"{name}: {error.code.name}: {error.message}"
            )
        if isinstance(done, Done):
            return _back(request, page(request), notice=f"{name}: {done.message}", **done.query)
        return _back(request, page(request), notice=f"{name}: {done or 'done'}")

    return route


def _task(request: Request) -> str:
    return f"/tasks/{request.path_params['task_id']}"


def _page(path: str) -> Callable[[Request], str]:
    return lambda _: path


async def _resumed(backend: Backend, token: str, f: Mapping[str, str]) -> Done:
    try:
        rate = float(f.get("rate") or BULK_RATE)
    except ValueError:
        what = "a number of redrives a second"
        raise DispoError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"rate_per_second: {what}, not {f.get('rate')!r}",
            {"rate_per_second": what},
        ) from None
    downstream, business = f.get("downstream", ""), f.get("business", "")
    reply = await backend.resume_matching(token, downstream, business, rate, ACTOR)
    # The page follows the resume from the first redrive's due time on (the reconciler's
    # clock; no later than this one's now, should the two differ).
    since = datetime.now(UTC)
    if reply.HasField("last_due_at"):
        since = min(since, first_due(reply.last_due_at.ToDatetime(UTC), reply.scheduled, rate))
    progress = {
        "resumed": str(reply.scheduled),
        "resumed_since": since.isoformat(),
        "resumed_downstream": downstream,
        "resumed_business": business,
    }
    return Done(f"{reply.scheduled} task(s) scheduled, {rate:g} a second", progress)


async def _cancelled_matching(backend: Backend, token: str, f: Mapping[str, str]) -> Done:
    found = TaskFilter.parse(
        f, f.get("statuses", "").split(","), f.get("priorities", "").split(",")
    )
    reply = await backend.cancel_matching(
        token,
        business=found.business,
        statuses=list(found.unfinished()),
        created_after=found.created_after(datetime.now(UTC)),
        idempotency_key=found.key,
        labels=_labels_of(found),
        priorities=found.priorities,
        rate=BULK_CANCEL_RATE,
        actor=ACTOR,
    )
    return Done(
        f"{reply.matched} task(s) being cancelled, {BULK_CANCEL_RATE:g} a second"
        f" (bulk action {reply.action.action_id})",
        {},
    )


def _tasks(request: Request) -> str:
    return "/tasks"


cancel_matching = _action("cancel all", _tasks, _cancelled_matching)
cancel = _action("cancel", _task, lambda b, t, f: b.cancel(t, f["task_id"]))
erase = _action("erase", _task, lambda b, t, f: b.erase(t, f["task_id"]))
resume = _action("resume", _task, lambda b, t, f: b.resume(t, f["task_id"], ACTOR))
signal = _action(
    "signal",
    _task,
    lambda b, t, f: b.signal(t, f["task_id"], f.get("node_id", ""), f.get("choice", "")),
)
resolve = _action(
    "resolve",
    _task,
    lambda b, t, f: b.resolve(t, f["task_id"], f["node_id"], f["resolution"] == "done", ACTOR),
)
failed_resume = _action(
    "resume", _page("/failed"), lambda b, t, f: b.resume(t, f["task_id"], ACTOR)
)
failed_abandon = _action(
    "abandon", _page("/failed"), lambda b, t, f: b.abandon(t, f["task_id"], ACTOR)
)
failed_resume_matching = _action("resume matching", _page("/failed"), _resumed)


async def _abandoned(backend: Backend, token: str, f: Mapping[str, str]) -> str:
    count = f.get("count", "")
    if not count.isdigit() or not 0 < int(count) <= FAILED_PAGE:
        raise DispoError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"limit: a count of parked tasks up to {FAILED_PAGE}, not {count!r}",
            {"limit": "a count of parked tasks"},
        )
    reply = await backend.abandon_matching(
        token, f.get("downstream", ""), int(count), BULK_ABANDON_RATE, ACTOR
    )
    return f"{len(reply.task_ids)} of {reply.matched} task(s) abandoned"


failed_abandon_matching = _action("abandon all", _page("/failed"), _abandoned)
pause = _action("pause", _page("/downstreams"), lambda b, t, f: b.pause(t, f["name"], ACTOR))
unpause = _action("resume", _page("/downstreams"), lambda b, t, f: b.unpause(t, f["name"], ACTOR))
business_pause = _action(
    "pause", _page("/businesses"), lambda b, t, f: b.pause_business(t, f["business"], ACTOR)
)
business_resume = _action(
    "resume", _page("/businesses"), lambda b, t, f: b.resume_business(t, f["business"])
)


def _whole(
    fields: Mapping[str, str], name: str, field: str = "", what: str = "a whole number"
) -> int:
    """The form's field ``name``, a whole number; refused (INVALID_ARGUMENT naming the
    request's ``field``, ``name`` unless given) when it is not."""
    text, field = fields.get(name, "").strip(), field or name
    if not text.isdigit():
        raise DispoError(
            grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {what}, not {text!r}", {field: what}
        )
    return int(text)


async def _boosted(backend: Backend, token: str, f: Mapping[str, str]) -> str:
    value = _whole(f, "boost", "priority_boost", f"a whole number 0..{MAX_BOOST}")
    found = await backend.boost(token, f["evaluation_id"], value)
    return f"{found.id} at priority boost {found.priority_boost}"


boost = _action("boost", _page("/pool"), _boosted)


def _evaluation_action(action: str) -> Callable[..., Any]:
    async def act(backend: Backend, token: str, f: Mapping[str, str]) -> str:
        found = await backend.evaluation_action(token, action, f.get("evaluation_id", "").strip())
        return f"{found.id} {short_name(ppb.EvaluationStatus, found.status)}"

    return _action(action, _page("/pool"), act)


async def _bounded(backend: Backend, token: str, f: Mapping[str, str]) -> str:
    status = await backend.set_bounds(token, _whole(f, "min_size"), _whole(f, "max_size"))
    return f"bounds {status.min_size}..{status.max_size}, size {status.size}"


evaluation_actions = {action: _evaluation_action(action) for action in EVALUATION_ACTIONS}
bounds = _action("bounds", _page("/pool"), _bounded)


def _messages(request: Request) -> dict[str, str]:
    return {
        "notice": request.query_params.get("notice", ""),
        "problem": request.query_params.get("error", ""),
    }


Context = Callable[[Request, str], Awaitable[dict[str, Any]]]


def _live(
    template: str, context: Context, fragments: dict[str, str]
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A page's route and its event stream's: the page renders ``template``; the stream
    sends each of ``fragments`` (event name: template) afresh. Both from ``context``."""

    async def page(request: Request) -> Response:
        token = _signed_in(request)
        found = {**await context(request, token), **_messages(request)}
        found["stream"] = f"{request.url.path}/stream?{request.url.query}"
        return templates.TemplateResponse(request, template, found)

    async def stream(request: Request) -> Response:
        token = _signed_in(request)

        async def render() -> list[tuple[str, str]]:
            found = await context(request, token)
            return [(name, _fragment(request, f, found)) for name, f in fragments.items()]

        return _stream(request, render, request.app.state.settings.refresh_seconds)

    return page, stream


async def _failed_context(request: Request, token: str) -> dict[str, Any]:
    downstream = request.query_params.get("downstream", "")
    kind = request.query_params.get("kind", "")
    kinds = (WORK_KINDS[kind],) if kind in WORK_KINDS else ()
    work, progress = await asyncio.gather(
        _backend(request).failed_work(token, kinds=kinds, downstream=downstream),
        _progress(request, token),
    )
    return {
        "progress": progress,
        "work": work,
        "groups": failed_groups(work),
        "downstream": downstream,
        "kind": kind,
        "kinds": WORK_KINDS,
        "bulk_rate": BULK_RATE,
        # What "Abandon all N" takes: the parked work listed, when no kind narrows it.
        "abandonable": 0 if kind else sum(1 for w in work if parked(w)),
    }


async def _progress(request: Request, token: str) -> ResumeProgress | None:
    """A bulk resume's progress, when the page follows one (the query fields *Resume
    matching* returns with); None otherwise."""
    params = request.query_params
    scheduled, since = params.get("resumed", ""), params.get("resumed_since", "")
    if not scheduled.isdigit() or not since:
        return None
    try:
        started = datetime.fromisoformat(since)
    except ValueError:
        return None
    tasks = await _backend(request).resumed(
        token, params.get("resumed_downstream", ""), params.get("resumed_business", "")
    )
    return resume_progress(int(scheduled), started, tasks)


async def _downstreams_context(request: Request, token: str) -> dict[str, Any]:
    backend = _backend(request)
    downstreams, queues = await asyncio.gather(backend.downstreams(token), backend.queues(token))
    return {"downstreams": downstream_rows(downstreams), "worker_queues": worker_queue_rows(queues)}


async def _businesses_context(request: Request, token: str) -> dict[str, Any]:
    return {"businesses": business_rows(await _backend(request).businesses(token))}


async def _pool_context(request: Request, token: str) -> dict[str, Any]:
    state = await _backend(request).pool_state(token)
    return {
        "status": state.status,
        "crons": cron_rows(state),
        "queue": queue_rows(state),
        "assignments": assignment_rows(state),
        "resizes": resize_rows(state),
        "figures": pool_figures(state.status),
        "max_boost": MAX_BOOST,
        "evaluation_actions": EVALUATION_ACTIONS,
    }


async def _intelligence_context(request: Request, token: str) -> dict[str, Any]:
    found = JobFilter.parse(request.query_params, JOBS_PAGE, JOBS_PAGE_MAX)
    backend = _backend(request)
    page, counts = await asyncio.gather(
        backend.jobs(
            token,
            evaluation_id=found.evaluation_id,
            kind=found.kind_pb,
            status=found.status_pb,
            page_size=found.limit,
            page_token=found.page_token,
        ),
        backend.job_counts(
            token, JOB_STATUSES, evaluation_id=found.evaluation_id, kind=found.kind_pb
        ),
    )
    following = page.page.next_page_token
    return {
        "filter": found,
        "jobs": job_rows(list(page.jobs)),
        "counts": counts,
        "count_limit": JOB_COUNT_LIMIT,
        "job_kinds": JOB_KINDS,
        "next_page": f"/intelligence?{found.query(following)}" if following else "",
        "first_page": f"/intelligence?{found.query()}" if found.page_token else "",
    }


async def _job_context(request: Request, token: str) -> dict[str, Any]:
    kind, evaluation_id = request.path_params["kind"], request.path_params["evaluation_id"]
    if kind not in JOB_KINDS:
        raise DispoError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"kind: one of {', '.join(JOB_KINDS)}, not {kind!r}",
            {"kind": f"one of {', '.join(JOB_KINDS)}"},
        )
    backend = _backend(request)
    if kind == "analysis":
        analysis = await backend.analysis(token, evaluation_id)
        completed = analysis.HasField("stats")
        return {
            "kind": kind,
            "job": job_row(analysis.job),
            "narrative": analysis.narrative,
            "figures": analysis_figures(analysis.stats) if completed else [],
            "clusters": list(analysis.stats.failure_clusters),
            "worst": list(analysis.stats.worst_cases),
            "comparison": None,
        }
    comparison = await backend.comparison(token, evaluation_id)
    return {
        "kind": kind,
        "job": job_row(comparison.job),
        "narrative": comparison.narrative,
        "figures": [],
        "clusters": [],
        "worst": [],
        "comparison": comparison,
    }


failed_page, failed_stream = _live("failed.html", _failed_context, {"work": "_failed_rows.html"})
downstreams_page, downstreams_stream = _live(
    "downstreams.html",
    _downstreams_context,
    {"downstreams": "_downstream_rows.html", "worker_queues": "_worker_queue_rows.html"},
)
businesses_page, businesses_stream = _live(
    "businesses.html", _businesses_context, {"businesses": "_business_rows.html"}
)


async def _schedules_context(request: Request, token: str) -> dict[str, Any]:
    return {"schedules": [schedule_row(s) for s in await _backend(request).schedule_list(token)]}


async def _schedule_context(request: Request, token: str) -> dict[str, Any]:
    found = await _backend(request).schedule(token, request.path_params["schedule_id"])
    return {"schedule": schedule_row(found)}


def _version_param(request: Request, name: str) -> int:
    value = request.query_params.get(name, "")
    if value and not value.isdigit():
        raise DispoError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{name}: a version number, not {value!r}",
            {name: "a version number"},
        )
    return int(value or 0)


async def _catalogue_context(request: Request, token: str) -> dict[str, Any]:
    """A version (``?version=``, the current one by default), the versions, and the
    difference from ``?against=`` to it when asked."""
    backend = _backend(request)
    version, against = _version_param(request, "version"), _version_param(request, "against")
    shown, versions = await asyncio.gather(
        backend.catalogue_version(token, version), backend.catalogue_versions(token)
    )
    diff = None
    if against:
        diff = version_diff(await backend.catalogue_version(token, against), shown)
    return {
        "shown": shown,
        "shown_at": shown.created_at.ToDatetime(tzinfo=UTC),
        "current": versions[0].version if versions else shown.version,
        "cells": cell_rows(shown),
        "downstreams": catalogue_downstream_rows(shown),
        "retired": list(shown.retired),
        "versions": version_rows(versions),
        "against": against,
        "diff": diff,
    }


catalogue_page, catalogue_stream = _live(
    "catalogue.html", _catalogue_context, {"catalogue": "_catalogue.html"}
)
schedules_page, schedules_stream = _live(
    "schedules.html", _schedules_context, {"schedules": "_schedule_rows.html"}
)
schedule_page, schedule_stream = _live(
    "schedule.html", _schedule_context, {"schedule": "_schedule_detail.html"}
)


def _schedule(request: Request) -> str:
    return f"/schedules/{request.path_params['schedule_id']}"


schedule_pause = _action("pause", _schedule, lambda b, t, f: b.pause_schedule(t, f["schedule_id"]))
schedule_resume = _action(
    "resume", _schedule, lambda b, t, f: b.resume_schedule(t, f["schedule_id"])
)
pool_page, pool_stream = _live(
    "pool.html", _pool_context, {"pool": "_pool_rows.html", "figures": "_pool_figures.json"}
)

intelligence_page, intelligence_stream = _live(
    "intelligence.html", _intelligence_context, {"jobs": "_job_rows.html"}
)
job_page, job_stream = _live("job.html", _job_context, {"job": "_job_detail.html"})


async def retention_page(request: Request) -> Response:
    """A dry run of the three purging services, read once (counting is not free on large
    tables: the page is not live; reloading it reads again)."""
    token = _signed_in(request)
    replies = await _backend(request).retention(token)
    context = {
        "rows": retention_rows(replies),
        "records": record_rows(replies),
        "default_days": next(iter(replies.values())).default_retention_days,
        "off": [name for name, reply in replies.items() if not reply.enabled],
        **_messages(request),
    }
    return templates.TemplateResponse(request, "retention.html", context)


async def home(request: Request) -> Response:
    return RedirectResponse("/tasks", status_code=303)


def create_app(settings: ConsoleSettings) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.settings = settings
        app.state.backend = Backend(settings)
        try:
            yield
        finally:
            await app.state.backend.close()

    routes = [
        Route("/", home),
        Route("/healthz", healthz),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/tasks", tasks_page),
        Route("/tasks/stream", tasks_stream),
        Route("/tasks/cancel", cancel_matching, methods=["POST"]),
        Route("/tasks/{task_id}", task_page),
        Route("/tasks/{task_id}/stream", task_stream),
        Route("/tasks/{task_id}/cancel", cancel, methods=["POST"]),
        Route("/tasks/{task_id}/erase", erase, methods=["POST"]),
        Route("/tasks/{task_id}/resume", resume, methods=["POST"]),
        Route("/tasks/{task_id}/resolve", resolve, methods=["POST"]),
        Route("/tasks/{task_id}/signal", signal, methods=["POST"]),
        Route("/failed", failed_page),
        Route("/failed/stream", failed_stream),
        Route("/failed/resume", failed_resume_matching, methods=["POST"]),
        Route("/failed/abandon", failed_abandon_matching, methods=["POST"]),
        Route("/failed/{task_id}/resume", failed_resume, methods=["POST"]),
        Route("/failed/{task_id}/abandon", failed_abandon, methods=["POST"]),
        Route("/downstreams", downstreams_page),
        Route("/downstreams/stream", downstreams_stream),
        Route("/downstreams/{name}/pause", pause, methods=["POST"]),
        Route("/downstreams/{name}/resume", unpause, methods=["POST"]),
        Route("/catalogue", catalogue_page),
        Route("/catalogue/stream", catalogue_stream),
        Route("/businesses", businesses_page),
        Route("/businesses/stream", businesses_stream),
        Route("/businesses/pause", business_pause, methods=["POST"]),  # by name, from the form
        Route("/businesses/{business}/pause", business_pause, methods=["POST"]),
        Route("/businesses/{business}/resume", business_resume, methods=["POST"]),
        Route("/schedules", schedules_page),
        Route("/schedules/stream", schedules_stream),
        Route("/schedules/{schedule_id}", schedule_page),
        Route("/schedules/{schedule_id}/stream", schedule_stream),
        Route("/schedules/{schedule_id}/pause", schedule_pause, methods=["POST"]),
        Route("/schedules/{schedule_id}/resume", schedule_resume, methods=["POST"]),
        Route("/pool", pool_page),
        Route("/pool/stream", pool_stream),
        Route("/pool/bounds", bounds, methods=["POST"]),
        *(
            Route(f"/pool/{action}", route, methods=["POST"])
            for action, route in evaluation_actions.items()
        ),
        Route("/pool/{evaluation_id}/boost", boost, methods=["POST"]),
        Route("/retention", retention_page),
        Route("/intelligence", intelligence_page),
        Route("/intelligence/stream", intelligence_stream),
        Route("/intelligence/{kind}/{evaluation_id}", job_page),
        Route("/intelligence/{kind}/{evaluation_id}/stream", job_stream),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(
        routes=routes,
        # the headers outermost: the refusals of the origin check carry them too
        middleware=[Middleware(SecurityHeaders), Middleware(SameOriginWrites, settings=settings)],
        lifespan=lifespan,
        exception_handlers={DispoError: _refused, SignIn: _to_sign_in},
    )


def main() -> None:
    common = CommonSettings()
    configure_logging(common.log_format, common.log_level, service="console")
    settings = ConsoleSettings()
    if console_hosts(settings) is None:
        log.warning(
            "answering any Host: set DISPO_CONSOLE_ORIGIN to the address browsers use",
            host=settings.host,
        )
    log.info("serving", address=f"http://{settings.host}:{settings.port}")
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        # Open event streams do not hold a stop up.
        timeout_graceful_shutdown=2,
    )
    uvicorn.Server(config).run()
