"""What the console's pages show, from the services' replies: no I/O here.

The DAG as Cytoscape.js elements (a node per DAG node, coloured by status; an edge from each
dependency to the node waiting for it), a task's history as one timeline, its nodes' outputs
and result folded when long, and the Tasks page's filters read from a query string.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from dispo.console.backend import COUNTED, PoolState, TaskDetail
from dispo.libs.api.executor.v1 import executor_pb2 as epb
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as ipb
from dispo.libs.api.pool.v1 import pool_pb2 as ppb
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as rpb
from dispo.libs.api.retention.v1 import retention_pb2 as rtpb
from dispo.libs.contracts.tasks import HIGHEST_PRIORITY, LOWEST_PRIORITY
from dispo.libs.evaluation import NO_BASELINE
from dispo.libs.proto_enums import short_name
from dispo.libs.task_requests import label_pairs
from dispo.sdk import TaskView
from google.protobuf.timestamp_pb2 import Timestamp

# One colour per task and node status, the same on every page (and in the graph).
COLOURS = {
    "ACCEPTED": "#8c8c8c",
    "PENDING": "#8c8c8c",
    "RUNNING": "#1f77b4",
    "SUCCEEDED": "#2ca02c",
    "FAILED": "#d62728",
    "UNKNOWN": "#ff7f0e",
    "DEPENDENCY_FAILED": "#e377c2",
    "DEMOTED": "#9467bd",
    "RETRY_EXHAUSTED": "#8c564b",
    "CANCELLED": "#7f7f7f",
    "WAITING": "#17becf",
}
# How much of an output or a result the Task page shows before it is folded (expandable).
OUTPUT_BRIEF = 200


@dataclass(frozen=True)
class Shown:
    """A JSON value as the Task page shows it: compact, its first ``OUTPUT_BRIEF``
    characters when longer (``folded``), and indented to read whole when unfolded."""

    brief: str
    whole: str
    folded: bool


def shown_json(value: Any) -> Shown:
    compact = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if len(compact) <= OUTPUT_BRIEF:
        return Shown(compact, compact, False)
    return Shown(
        compact[:OUTPUT_BRIEF] + "…", json.dumps(value, ensure_ascii=False, indent=2), True
    )


# The Tasks page's "since" choices, in seconds back from now.
# The statuses no cancel takes.
FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")
SINCE = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400}
# The Tasks page's priority choices, highest first.
PRIORITIES = tuple(str(p) for p in range(HIGHEST_PRIORITY, LOWEST_PRIORITY + 1))


def graph_elements(task: TaskView) -> list[dict[str, Any]]:
    """The task's DAG as Cytoscape.js elements."""
    nodes = [
        {
            "data": {
                "id": n.node_id,
                "label": n.node_id,
                "status": n.status,
                "colour": COLOURS.get(n.status, "#000000"),
            }
        }
        for n in task.nodes
    ]
    edges = [
        {"data": {"id": f"{dep}->{n.node_id}", "source": dep, "target": n.node_id}}
        for n in task.nodes
        for dep in n.depends_on
    ]
    return nodes + edges


@dataclass(frozen=True)
class Moment:
    """One line of a task's history."""

    at: datetime | None
    what: str
    detail: str = ""


def _at(stamp: Timestamp, present: bool = True) -> datetime | None:
    if not present or (stamp.seconds == 0 and stamp.nanos == 0):
        return None
    return stamp.ToDatetime(tzinfo=UTC)


def history(detail: TaskDetail) -> list[Moment]:
    """The task's events, oldest first: accepted, each status snapshot the status stream
    holds (ListTaskEvents: the task's status and the nodes it changed), and what only the
    reconciler records: each failure it received (parked, failed), each redrive, each
    delivery to the caller."""
    raw = detail.task.raw
    moments = [Moment(_at(raw.created_at), "accepted", f"business {raw.business}")]
    if detail.events is not None:
        for event in detail.events.events:
            changed = [c.describe() for c in event.changes]
            if event.status_reason:
                changed.append(event.status_reason)
            moments.append(
                Moment(
                    event.time,
                    f"{event.status} (version {event.version}, {event.publisher})",
                    "; ".join(changed),
                )
            )
        if detail.events.more:
            moments.append(Moment(None, "later events not shown", "dispo tasks events lists them"))
    if detail.recovery is not None:
        for failure in detail.recovery.history:
            kind = short_name(rpb.RecoveryKind, failure.kind)
            moments.append(
                Moment(
                    _at(failure.received_at),
                    f"reconciler received {kind} (generation {failure.generation})",
                    failure.reason,
                )
            )
        for redrive in detail.recovery.redrives:
            trigger = short_name(rpb.RedriveTrigger, redrive.trigger)
            moments.append(
                Moment(
                    _at(redrive.at) if redrive.HasField("at") else None,
                    f"redriven ({trigger}, generation {redrive.generation})",
                    redrive.actor,
                )
            )
    if detail.completion is not None:
        for delivery in detail.completion.deliveries:
            outcome = "delivered" if delivery.ok else f"delivery failed ({delivery.error})"
            moments.append(Moment(_at(delivery.at), f"caller notified: {outcome}", delivery.target))
    timed = sorted((m for m in moments if m.at is not None), key=lambda m: m.at or datetime.min)
    return timed + [m for m in moments if m.at is None]


@dataclass(frozen=True)
class TaskFilter:
    """The Tasks page's search: a task id or a business, an idempotency key, statuses,
    labels, priorities, and how far back."""

    query: str = ""
    statuses: tuple[str, ...] = ()
    since: str = ""
    # The idempotency key the task was submitted with (with a business, that business's).
    key: str = ""
    # Only tasks whose delayed start is ahead (ListTasks' ``scheduled``).
    scheduled: bool = False
    # Only tasks carrying every one of these labels, as typed: "k=v k2=v2" (ADR-0110).
    labels: str = ""
    # Only tasks of any of these priorities (1 highest … 5); none: any.
    priorities: tuple[int, ...] = ()

    @classmethod
    def parse(
        cls, params: Mapping[str, Any], statuses: list[str], priorities: Sequence[str] = ()
    ) -> TaskFilter:
        """From the page's query string; unknown statuses, priorities and periods are
        dropped."""
        return cls(
            str(params.get("q", "")).strip(),
            tuple(s for s in statuses if s in COUNTED),
            since if (since := str(params.get("since", ""))) in SINCE else "",
            str(params.get("key", "")).strip(),
            params.get("scheduled") == "1",
            " ".join(str(params.get("labels", "")).split()),
            tuple(sorted({int(p) for p in priorities if p in PRIORITIES})),
        )

    def link(self, status: str) -> str:
        """The Tasks page of this search, in ``status`` only."""
        kept = {
            "q": self.query,
            "key": self.key,
            "since": self.since,
            "scheduled": "1" if self.scheduled else "",
            "labels": self.labels,
        }
        pairs = [(k, v) for k, v in kept.items() if v]
        pairs += [("priority", str(p)) for p in self.priorities]
        return "/tasks?" + urlencode([*pairs, ("status", status)])

    @property
    def task_id(self) -> str:
        """The query when it is a task id (32 hex digits), else empty."""
        q = self.query.lower()
        return q if len(q) == 32 and all(c in "0123456789abcdef" for c in q) else ""

    @property
    def business(self) -> str:
        return "" if self.task_id else self.query

    @property
    def label_map(self) -> dict[str, str]:
        """The labels searched for (a pair without '=' or a key given twice: ValueError)."""
        return label_pairs(self.labels.split())

    def unfinished(self) -> tuple[str, ...]:
        """The statuses of this search a cancel can take (all unfinished ones if none)."""
        return tuple(s for s in self.statuses or COUNTED if s not in FINISHED)

    def cancellable(self, counts: Mapping[str, int]) -> int:
        """How many of the search's tasks a "cancel all" takes, by the page's counts."""
        return sum(counts.get(s, 0) for s in self.unfinished())

    def created_after(self, now: datetime) -> datetime | None:
        return now - timedelta(seconds=SINCE[self.since]) if self.since else None


def completion_facts(detail: TaskDetail) -> list[tuple[str, str]]:
    """The three completion facts: finished (the gateway's), caller notified and external
    state reconciled (the reconciler's); empty while the task runs."""
    facts = []
    finished = detail.task.completion.finished_at if detail.task.completion else None
    if finished is not None:
        facts.append(("finished", f"{finished:%Y-%m-%d %H:%M:%S} UTC"))
    if detail.completion is not None:
        c = detail.completion.completion
        notified = short_name(rpb.NotifyState, c.notify_state)
        if c.HasField("notified_at"):
            notified += f" at {_at(c.notified_at):%Y-%m-%d %H:%M:%S} UTC"
        if c.notify_last_error:
            notified += f" (last error: {c.notify_last_error})"
        facts.append(("caller notified", notified))
        reconciled = short_name(rpb.ReconcileState, c.reconcile_state)
        if c.HasField("reconciled_at"):
            reconciled += f" at {_at(c.reconciled_at):%Y-%m-%d %H:%M:%S} UTC"
        facts.append(("reconciled", reconciled))
    return facts


def recovery_state(detail: TaskDetail) -> str:
    """The reconciler's state of the task (PARKED_FAILED, AWAITING_DECISION…), empty when
    it holds none."""
    if detail.recovery is None:
        return ""
    return short_name(rpb.RecoveryState, detail.recovery.task.state)


def may_resume(detail: TaskDetail) -> bool:
    """A resume from failure is on offer: the reconciler holds the task failed or parked
    (it takes the resume; until the failure reached it, it would refuse one), and the task
    was not erased (nothing to run it on)."""
    return detail.task.erased_at is None and recovery_state(detail) in {
        "FAILED",
        "PARKED_FAILED",
        "DEMOTED",
    }


# The reconciler's queues by the names the Failed page's filter uses.
WORK_KINDS = {
    "failed": rpb.WORK_KIND_FAILED,
    "awaiting_redrive": rpb.WORK_KIND_AWAITING_REDRIVE,
    "demoted": rpb.WORK_KIND_DEMOTED,
    "unknown_outcome": rpb.WORK_KIND_UNKNOWN_OUTCOME,
}


@dataclass(frozen=True)
class Group:
    """The work of one kind waiting on one downstream: how much, and the oldest's age."""

    kind: str
    downstream: str
    count: int
    oldest_age_seconds: int


def work_kind(work: rpb.FailedWork) -> str:
    return short_name(rpb.WorkKind, work.kind)


def parked(work: rpb.FailedWork) -> bool:
    """Parked (waiting for a redrive, a settlement, a decision or a release): it may be
    abandoned. A task held FAILED has ended; it can only be resumed."""
    return work.task.state != rpb.RECOVERY_STATE_FAILED


def failed_groups(work: list[rpb.FailedWork]) -> list[Group]:
    """The queues by kind and downstream (a task with several downstreams counts in each),
    the oldest first."""
    found: dict[tuple[str, str], list[int]] = {}
    for item in work:
        for downstream in item.task.downstreams or [""]:
            found.setdefault((work_kind(item), downstream), []).append(item.age_seconds)
    groups = [Group(k, d, len(ages), max(ages)) for (k, d), ages in found.items()]
    return sorted(groups, key=lambda g: -g.oldest_age_seconds)


def age(seconds: int) -> str:
    """``95`` as ``1m 35s``, ``7300`` as ``2h 1m``."""
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600}h"


# How the Downstreams page colours a health and a breaker state: ``bad`` (red) a downstream
# that fails its probes or whose breaker is OPEN, ``warn`` (amber) a breaker trying again
# (HALF_OPEN), ``good`` (green) a healthy one with a CLOSED breaker; no tone when not known.
BREAKER_TONES = {"OPEN": "bad", "HALF_OPEN": "warn", "CLOSED": "good"}


@dataclass(frozen=True)
class DownstreamRow:
    """One downstream on the Downstreams page."""

    name: str
    healthy: str
    breaker: str
    paused: bool
    paused_reason: str
    demoted_depth: int
    oldest_demoted: str
    failed_depth: int
    release_rate_per_second: float
    health_tone: str = ""
    breaker_tone: str = ""
    # The executor's view of its limits across the cluster (ADR-0108), "" when unknown.
    limits: str = ""


def limits_text(d: epb.Downstream) -> str:
    """``2/4 at once, 10/20 a second; a business 2 at once, 5 a second``: what every
    executor holds of each limit, of the limit, and what each business may have of it."""
    text = f"{d.cluster_slots}/{d.max_concurrency} at once"
    if d.max_calls_per_second:
        text += f", {d.cluster_per_second}/{d.max_calls_per_second} a second"
    per_business = [
        f"{n} {unit}"
        for n, unit in (
            (d.per_business_max_concurrency, "at once"),
            (d.per_business_max_calls_per_second, "a second"),
        )
        if n
    ]
    if per_business:
        text += "; a business " + ", ".join(per_business)
    return text


@dataclass(frozen=True)
class RetentionRow:
    """A business's retention in one service, as the Retention page shows it."""

    service: str
    enabled: bool
    business: str
    retention_days: int
    cutoff: datetime
    due: int


def retention_rows(replies: Mapping[str, rtpb.GetRetentionResponse]) -> list[RetentionRow]:
    """By business, then service (the three services side by side)."""
    rows = [
        RetentionRow(
            service,
            reply.enabled,
            row.business,
            row.retention_days,
            row.cutoff.ToDatetime(tzinfo=UTC),
            row.due,
        )
        for service, reply in replies.items()
        for row in reply.businesses
    ]
    order = {service: i for i, service in enumerate(replies)}
    return sorted(rows, key=lambda r: (r.business, order[r.service]))


@dataclass(frozen=True)
class RecordRow:
    """A kind of record a service keeps besides its tasks', as the Retention page shows it:
    what the next passes delete and what is held for an operator."""

    service: str
    table: str
    due: int
    held: int
    retention_days: int
    rule: str


def record_rows(replies: Mapping[str, rtpb.GetRetentionResponse]) -> list[RecordRow]:
    """By service, in the order the replies came."""
    return [
        RecordRow(service, r.table, r.due, r.held, r.retention_days, r.rule)
        for service, reply in replies.items()
        for r in reply.records
    ]


def downstream_rows(
    found: list[tuple[rpb.DownstreamState, epb.Downstream | None]],
) -> list[DownstreamRow]:
    rows = []
    for state, breaker in found:
        health = ("healthy" if state.healthy else "unhealthy") if state.probed else "not probed"
        if state.probe_error:
            health += f" ({state.probe_error})"
        breaker_state = short_name(epb.BreakerState, breaker.breaker_state) if breaker else ""
        rows.append(
            DownstreamRow(
                state.name,
                health,
                breaker_state,
                state.paused,
                state.paused_reason,
                state.demoted_depth,
                age(state.oldest_demoted_age_seconds) if state.demoted_depth else "",
                state.failed_depth,
                state.release_rate_per_second,
                ("good" if state.healthy else "bad") if state.probed else "",
                BREAKER_TONES.get(breaker_state, ""),
                limits_text(breaker) if breaker else "",
            )
        )
    return rows


@dataclass(frozen=True)
class WorkerQueueRow:
    """One worker queue on the Downstreams page (the executor's ListQueues): its live
    workers, when one was last seen, runs offered and taken, its limits (0: none) and its
    runs taken in the last whole second."""

    name: str
    live_workers: int
    health: str
    last_seen: datetime | None
    offered: int
    taken: int
    max_concurrency: int
    max_calls_per_second: int = 0
    taken_last_second: int = 0
    # "bad": runs wait on a queue no worker serves (they are demoted once it stays so).
    health_tone: str = ""


def worker_queue_rows(queues: list[epb.Queue]) -> list[WorkerQueueRow]:
    return [
        WorkerQueueRow(
            q.name,
            q.live_workers,
            "live" if q.live else "no live worker",
            _at(q.last_seen, q.HasField("last_seen")),
            q.offered,
            q.taken,
            q.max_concurrency,
            q.max_calls_per_second,
            q.taken_last_second,
            "good" if q.live else ("bad" if q.offered else ""),
        )
        for q in queues
    ]


# The most a priority boost may be (the pool refuses more).
MAX_BOOST = 1000


@dataclass(frozen=True)
class CronRow:
    """One cron on the Cron pool page: IDLE, BUSY or STUCK, and the evaluation it holds."""

    cron_id: str
    status: str
    evaluation_id: str
    last_activity: datetime | None


@dataclass(frozen=True)
class QueueRow:
    """One queued evaluation on the Cron pool page, in the order crons take them."""

    evaluation_id: str
    status: str
    priority_boost: int
    slot_due: bool
    debt: int
    waiting_since: datetime | None


def cron_rows(state: PoolState) -> list[CronRow]:
    """The crons, stuck first, then busy, then idle (each by id)."""
    order = {"STUCK": 0, "BUSY": 1, "IDLE": 2}
    rows = [
        CronRow(
            c.id,
            short_name(ppb.CronStatus, c.status),
            c.evaluation_id,
            _at(c.last_activity, c.HasField("last_activity")),
        )
        for c in state.crons
    ]
    return sorted(rows, key=lambda r: (order.get(r.status, 3), r.cron_id))


def queue_rows(state: PoolState) -> list[QueueRow]:
    return [
        QueueRow(
            i.evaluation_id,
            short_name(ppb.EvaluationStatus, i.status),
            i.priority_boost,
            i.slot_due,
            i.debt,
            _at(i.waiting_since, i.HasField("waiting_since")),
        )
        for i in state.queue
    ]


@dataclass(frozen=True)
class AssignmentRow:
    """One of the pool's latest assignments: which cron held which evaluation, and how it
    ended (empty while held)."""

    cron_id: str
    evaluation_id: str
    started_at: datetime | None
    ended_at: datetime | None
    end_reason: str


def assignment_rows(state: PoolState) -> list[AssignmentRow]:
    """The latest assignments, newest first (as the pool lists them)."""
    return [
        AssignmentRow(
            a.cron_id,
            a.evaluation_id,
            _at(a.started_at, a.HasField("started_at")),
            _at(a.ended_at, a.HasField("ended_at")),
            short_name(ppb.AssignmentEnd, a.end_reason) if a.end_reason else "",
        )
        for a in state.assignments
    ]


# The evaluation actions of the Cron pool page, and what each asks before it acts.
EVALUATION_ACTIONS = {
    "pause": "Pause {id}? It leaves the queue (its cron lets it go) until resumed.",
    "resume": "Resume {id}? It goes back into the queue.",
    "cancel": "Cancel {id}? It ends for good (CANCELLED).",
}


def pool_figures(status: ppb.PoolStatus) -> dict[str, float]:
    """One point of the page's chart: the share of crons busy (0 with no cron), how many
    evaluations wait, and the pool's size (a step in it is a resize)."""
    busy = status.busy / status.size if status.size else 0.0
    return {"utilisation": round(busy, 3), "queue_depth": status.queue_depth, "size": status.size}


@dataclass(frozen=True)
class ResizeRow:
    """A row of the Cron pool page's latest resizes."""

    at: datetime | None
    from_size: int
    to_size: int
    reason: str


def resize_rows(state: PoolState) -> list[ResizeRow]:
    """The scaler's latest resizes, newest first (as the pool lists them)."""
    return [
        ResizeRow(_at(r.at, r.HasField("at")), r.from_size, r.to_size, r.reason)
        for r in state.resizes
    ]


# A job's status in the colour of the task status it is like; the first period of a series
# has nothing to compare with: its comparison is expected to find no baseline, and says so
# in a neutral grey rather than as a failure.
NO_BASELINE_STATUS = "NO BASELINE"
JOB_COLOURS = {
    "QUEUED": COLOURS["PENDING"],
    "GENERATING": COLOURS["RUNNING"],
    "COMPLETED": COLOURS["SUCCEEDED"],
    "FAILED": COLOURS["FAILED"],
    NO_BASELINE_STATUS: COLOURS["CANCELLED"],
}
# The Intelligence page's kinds, as its links and the service name them.
JOB_KINDS = {"analysis": ipb.JOB_KIND_ANALYSIS, "comparison": ipb.JOB_KIND_COMPARISON}


@dataclass(frozen=True)
class JobRow:
    """One analysis or comparison job on the Intelligence page."""

    kind: str
    evaluation_id: str
    status: str
    attempts: int
    analysis_model: str
    baseline_evaluation_id: str
    updated_at: datetime | None
    error: str


def job_status(job: ipb.Job) -> str:
    """The status a job is shown with: the service's, but ``NO BASELINE`` for a comparison
    that failed only because its evaluation is the first period of its series."""
    if (
        job.kind == ipb.JOB_KIND_COMPARISON
        and job.status == ipb.JOB_STATUS_FAILED
        and job.error.startswith(NO_BASELINE)
    ):
        return NO_BASELINE_STATUS
    return short_name(ipb.JobStatus, job.status)


def job_row(job: ipb.Job) -> JobRow:
    return JobRow(
        short_name(ipb.JobKind, job.kind).lower(),
        job.evaluation_id,
        job_status(job),
        job.attempts,
        job.analysis_model,
        job.baseline_evaluation_id,
        _at(job.updated_at, job.HasField("updated_at")),
        job.error,
    )


def job_rows(jobs: list[ipb.Job]) -> list[JobRow]:
    """The jobs, the last changed first."""
    never = datetime.min.replace(tzinfo=UTC)
    rows = [job_row(j) for j in jobs]
    return sorted(rows, key=lambda r: (r.updated_at or never, r.evaluation_id), reverse=True)


# The Intelligence page's status filter, as its query string and the service name them.
JOB_STATUSES = {
    "QUEUED": ipb.JOB_STATUS_QUEUED,
    "GENERATING": ipb.JOB_STATUS_GENERATING,
    "COMPLETED": ipb.JOB_STATUS_COMPLETED,
    "FAILED": ipb.JOB_STATUS_FAILED,
}


@dataclass(frozen=True)
class JobFilter:
    """The Intelligence page's filters (as ``dispo jobs list`` has them) and its page:
    an evaluation id, a kind, a status, the page size and the page token."""

    evaluation_id: str = ""
    kind: str = ""
    status: str = ""
    limit: int = 0
    page_token: str = ""

    @classmethod
    def parse(cls, params: Mapping[str, Any], default_limit: int, max_limit: int) -> JobFilter:
        """From the page's query string; an unknown kind or status is dropped, the page size
        kept within 1..``max_limit``."""
        text = str(params.get("limit", ""))
        limit = min(max(int(text), 1), max_limit) if text.isdigit() else default_limit
        return cls(
            str(params.get("evaluation", "")).strip(),
            kind if (kind := str(params.get("kind", ""))) in JOB_KINDS else "",
            status if (status := str(params.get("status", ""))) in JOB_STATUSES else "",
            limit,
            str(params.get("page", "")),
        )

    @property
    def kind_pb(self) -> ipb.JobKind.ValueType:
        return JOB_KINDS.get(self.kind, ipb.JOB_KIND_UNSPECIFIED)

    @property
    def status_pb(self) -> ipb.JobStatus.ValueType:
        return JOB_STATUSES.get(self.status, ipb.JOB_STATUS_UNSPECIFIED)

    def query(self, page_token: str = "") -> str:
        """The query string of these filters at the page ``page_token`` names."""
        fields = {
            "evaluation": self.evaluation_id,
            "kind": self.kind,
            "status": self.status,
            "limit": str(self.limit),
            "page": page_token,
        }
        return urlencode({k: v for k, v in fields.items() if v})


def _share(value: float) -> str:
    return f"{value * 100:.1f}%"


def analysis_figures(stats: ipb.AnalysisStats) -> list[tuple[str, str]]:
    """A completed analysis's statistics, as the job page lists them."""
    score, latency = stats.score, stats.latency
    return [
        ("runs", str(stats.run_count)),
        ("cases", str(stats.case_count)),
        ("pass rate", _share(stats.pass_rate)),
        ("fail rate", _share(stats.fail_rate)),
        ("error rate", _share(stats.error_rate)),
        ("score", f"mean {score.mean:.3f}, p50 {score.p50:.3f}, min {score.min:.3f}"),
        (
            "latency",
            f"p50 {latency.p50_ms} ms, p90 {latency.p90_ms} ms, p99 {latency.p99_ms} ms",
        ),
    ]


def direction(delta: ipb.MetricDelta) -> str:
    return short_name(ipb.Direction, delta.direction)


@dataclass(frozen=True)
class ResumeProgress:
    """How far a bulk resume (*Resume matching*) has come: of the ``scheduled`` tasks, how
    many the reconciler has redriven and they run again, how many finished (RESOLVED) and
    how many failed again; the rest still wait their turn."""

    scheduled: int
    running: int
    finished: int
    failed: int

    @property
    def waiting(self) -> int:
        return max(self.scheduled - self.running - self.finished - self.failed, 0)

    @property
    def done(self) -> bool:
        return self.waiting == 0 and self.running == 0


def resume_progress(
    scheduled: int, since: datetime, tasks: list[rpb.RecoveryTask]
) -> ResumeProgress:
    """The progress of a bulk resume whose first redrive was due at ``since`` (the
    reconciler's clock): the tasks redriven since then, by where they are now."""
    at = [(t, _at(t.last_redrive_at, t.HasField("last_redrive_at"))) for t in tasks]
    redriven = [t for t, when in at if when is not None and when >= since]
    running = sum(t.state == rpb.RECOVERY_STATE_REDRIVEN for t in redriven)
    finished = sum(t.state == rpb.RECOVERY_STATE_RESOLVED for t in redriven)
    return ResumeProgress(scheduled, running, finished, len(redriven) - running - finished)


def first_due(last_due: datetime, scheduled: int, rate: float) -> datetime:
    """When the first of ``scheduled`` redrives spaced ``1 / rate`` seconds apart is due,
    the last being due at ``last_due``."""
    return last_due - timedelta(seconds=max(scheduled - 1, 0) / rate)


@dataclass(frozen=True)
class BusinessRow:
    """One business on the Businesses page (ADR-0109)."""

    business: str
    weight: int
    paused: bool
    paused_reason: str
    paused_by: str
    # Its ACCEPTED tasks: accepted, not started (the paused depth while it is paused).
    accepted: int
    waiting_here: int


def business_rows(found: list[tuple[epb.BusinessState, int]]) -> list[BusinessRow]:
    return [
        BusinessRow(
            b.business,
            b.weight,
            b.paused,
            b.paused_reason,
            b.paused_by,
            accepted,
            b.waiting_here,
        )
        for b, accepted in found
    ]
