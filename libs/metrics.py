"""Prometheus metrics: every metric a Dispo service exports, declared here once, and the HTTP
endpoint (prometheus-client) each service serves them on (``DISPO_<SERVICE>_METRICS_PORT``).

Events are counted where they happen, with one call of a recorder below::

    metrics.task_accepted(sub.business, cells)      # the gateway, once the Submit committed

Backlogs and ages are not updated on every write: a service adds a *probe*, an async read of
its own tables (cheap, indexed queries through its repository) run when Prometheus scrapes,
at most once per ``cache_seconds`` however many scrapes arrive, so a scrape storm cannot load
the database::

    rt.metrics.probe(read_backlog)          # async () -> Iterable[Sample]

A service exports the families declared for it and the common ones (:data:`COMMON`), plus
the ``process_*`` metrics of prometheus-client. docs/metrics.md lists every family;
tests/platform/test_metrics.py checks that it and :data:`DECLARED` agree.

Labels stay bounded: names from the catalogue (cell, action, downstream), states, durable
consumer names, and ``business``, which is bounded by the tokens an operator creates — a
business per token (docs/metrics.md says what that costs). Never an id of a task, node, job
or evaluation.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, NamedTuple, TypeVar
from wsgiref.simple_server import WSGIServer

from dispo.libs.logging import get_logger
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = get_logger(__name__)

COMMON = "common"
# Seconds a probe's reading is served again before the next scrape reads the tables anew.
CACHE_SECONDS = 5.0
# Seconds a scrape waits for the probes before it serves the last reading.
PROBE_TIMEOUT_SECONDS = 5.0
# Node calls and jobs: from a few milliseconds to minutes.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, math.inf)
# Items of one group-commit flush: one (each write paid alone) up to the largest batch setting.
FLUSH_ITEM_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, math.inf)


@dataclass(frozen=True)
class Declared:
    """One metric family as exported: its name, type, labels, meaning and exporting service."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str
    service: str


DECLARED: list[Declared] = []
_RECORDED: dict[str, list[Collector]] = {}


def _declare(service: str, name: str, kind: str, labels: tuple[str, ...], help: str) -> None:
    DECLARED.append(Declared(name, kind, labels, help, service))


M = TypeVar("M", Counter, Histogram)


class Labelled(Generic[M]):
    """A labelled metric whose children are kept by their label values: a recorder looks
    one up with a dict lookup rather than prometheus-client's ``labels()``, which validates
    and locks on every call (several microseconds on the hot path). Used from the service's
    event loop only."""

    def __init__(self, metric: M) -> None:
        self.metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            metric = self.metric
            child = self._children[values] = metric.labels(*values) if values else metric
        return child


def _counter(service: str, name: str, help: str, labels: tuple[str, ...]) -> Labelled[Counter]:
    _declare(service, f"{name}_total", "counter", labels, help)
    metric = Counter(name, help, labels, registry=None)
    _RECORDED.setdefault(service, []).append(metric)
    return Labelled(metric)


def _histogram(
    service: str,
    name: str,
    help: str,
    labels: tuple[str, ...],
    buckets: tuple[float, ...] = DURATION_BUCKETS,
) -> Labelled[Histogram]:
    _declare(service, name, "histogram", labels, help)
    metric = Histogram(name, help, labels, registry=None, buckets=buckets)
    _RECORDED.setdefault(service, []).append(metric)
    return Labelled(metric)


@dataclass(frozen=True)
class Gauge:
    """A gauge family whose values a probe reads at scrape time."""

    name: str
    help: str
    labels: tuple[str, ...] = ()

    def sample(self, value: float, *label_values: str) -> Sample:
        return Sample(self, label_values, float(value))


class Sample(NamedTuple):
    gauge: Gauge
    label_values: tuple[str, ...]
    value: float


def age_seconds(now: datetime, since: datetime | None) -> float:
    """An age gauge's value: seconds from ``since`` to ``now``, 0 when there is nothing
    (``since`` None) or it is stamped later than ``now`` (another clock)."""
    return max(0.0, (now - since).total_seconds()) if since is not None else 0.0


def _gauge(service: str, name: str, help: str, labels: tuple[str, ...] = ()) -> Gauge:
    _declare(service, name, "gauge", labels, help)
    return Gauge(name, help, labels)


# ---- every service -----------------------------------------------------------------------
CONSUMER_PENDING = _gauge(
    COMMON,
    "dispo_consumer_pending_messages",
    "Messages of the stream a durable consumer has not been delivered yet",
    ("consumer",),
)
CONSUMER_ACK_PENDING = _gauge(
    COMMON,
    "dispo_consumer_ack_pending_messages",
    "Messages delivered to a durable consumer and not acknowledged yet",
    ("consumer",),
)
CONSUMER_REDELIVERED = _gauge(
    COMMON,
    "dispo_consumer_redelivered_messages",
    "Messages in hand of a durable consumer that were delivered more than once",
    ("consumer",),
)
QUARANTINED = _gauge(
    COMMON,
    "dispo_quarantine_messages",
    "Messages the service's consumers gave up on, held in its quarantine",
)
OUTBOX_UNSENT = _gauge(
    COMMON,
    "dispo_outbox_unsent_rows",
    "Outbox rows not published yet (quarantined rows not counted)",
    ("outbox",),
)
OUTBOX_OLDEST = _gauge(
    COMMON,
    "dispo_outbox_oldest_unsent_age_seconds",
    "Age of the oldest outbox row not published yet (0 when none)",
    ("outbox",),
)
OUTBOX_QUARANTINED = _gauge(
    COMMON,
    "dispo_outbox_quarantined_rows",
    "Outbox rows set aside after too many failed publications",
    ("outbox",),
)
_GROUP_COMMIT_ITEMS = _histogram(
    COMMON,
    "dispo_group_commit_items",
    "Items written by one flush of a group commit (its count is the flushes, its sum the"
    " items): how well the service's writes are batched",
    ("group",),
    FLUSH_ITEM_BUCKETS,
)
_RETENTION_PURGED = _counter(
    COMMON,
    "dispo_retention_purged_rows",
    "Rows the service's retention deleted, by table: what it kept about finished tasks past"
    " their business's retention (the gateway, the executor and the reconciler purge), and"
    " its records besides them (bulk_actions, outbox, quarantine)",
    ("table",),
)

# ---- gateway -----------------------------------------------------------------------------
_TASKS_ACCEPTED = _counter(
    "gateway",
    "dispo_tasks_accepted",
    "Tasks accepted (a repeated Submit of an idempotency key not counted)",
    ("business",),
)
_CELLS_ACCEPTED = _counter(
    "gateway",
    "dispo_cells_accepted",
    "Tasks accepted, counted once under each cell they contain",
    ("business", "cell"),
)
_TASKS_FINISHED = _counter(
    "gateway",
    "dispo_tasks_finished",
    "Tasks that reached a final status (succeeded, failed, cancelled) in the gateway's view",
    ("business", "status"),
)
_CELLS_FINISHED = _counter(
    "gateway",
    "dispo_cells_finished",
    "Tasks that reached a final status, counted once under each cell they contain",
    ("business", "cell", "status"),
)
_OUTPUT_READS = _counter(
    "gateway",
    "dispo_output_reads",
    "Reads of a task's outputs from the executor (GetOutputs) for a GetTask or WatchTask"
    " answer, by outcome (answered, unavailable); a task without outputs makes none",
    ("outcome",),
)

# ---- executor ----------------------------------------------------------------------------
_NODE_RUNS = _counter(
    "executor",
    "dispo_node_runs",
    "Downstream calls of nodes, by the state recorded after the call"
    " (succeeded, failed, pending for a short retry, unknown)",
    ("action", "downstream", "status"),
)
_NODE_DURATION = _histogram(
    "executor",
    "dispo_node_run_duration_seconds",
    "Time of one node's downstream call, from sending it to its answer or error",
    ("action", "downstream"),
)
_NODE_RETRIES = _counter(
    "executor",
    "dispo_node_retries",
    "Short retries scheduled for a node after a failed call",
    ("action", "downstream"),
)
_NODE_DEMOTIONS = _counter(
    "executor",
    "dispo_node_demotions",
    "Nodes demoted (parked) because their downstream's breaker refused the call",
    ("action", "downstream"),
)
BREAKER_STATE = _gauge(
    "executor",
    "dispo_breaker_state",
    "State of a downstream's circuit breaker in this executor: 0 closed, 1 half-open, 2 open",
    ("downstream",),
)
DOWNSTREAM_CALLS = _gauge(
    "executor",
    "dispo_downstream_calls_in_flight",
    "Nodes of a downstream claimed and calling in this executor (at most its share of the"
    " downstream's max_concurrency)",
    ("downstream",),
)
DOWNSTREAM_WAITING = _gauge(
    "executor",
    "dispo_downstream_calls_waiting",
    "Nodes ready to call a downstream that wait in this executor for one of its call slots",
    ("downstream",),
)
DOWNSTREAM_SLOTS_SHARE = _gauge(
    "executor",
    "dispo_downstream_slots_share",
    "Call slots of a downstream this executor may hold now: its share of the downstream's"
    " cluster-wide max_concurrency (ADR-0108)",
    ("downstream",),
)
DOWNSTREAM_PACE_SHARE = _gauge(
    "executor",
    "dispo_downstream_pace_share",
    "Calls a second to a downstream this executor may start now: its share of the"
    " downstream's cluster-wide max_calls_per_second (ADR-0108)",
    ("downstream",),
)
DOWNSTREAM_PACE_WAITING = _gauge(
    "executor",
    "dispo_downstream_pace_waiting",
    "Calls to a downstream waiting in this executor for their turn in a second",
    ("downstream",),
)


# ---- reconciler --------------------------------------------------------------------------
_REDRIVES = _counter(
    "reconciler",
    "dispo_redrives",
    "Tasks sent back to the executor from where they stopped, by what redrove them"
    " (schedule, manual, release, ...)",
    ("trigger",),
)
RECOVERY_BACKLOG = _gauge(
    "reconciler",
    "dispo_recovery_backlog_tasks",
    "Tasks held by the reconciler, by kind of work: failed (for an operator), awaiting_redrive,"
    " demoted (parked), unknown_outcome (uncertain nodes to settle)",
    ("kind",),
)
RECOVERY_OLDEST = _gauge(
    "reconciler",
    "dispo_recovery_oldest_age_seconds",
    "Time the oldest task of each kind of work has been held (0 when none)",
    ("kind",),
)

# ---- pool --------------------------------------------------------------------------------
POOL_CRONS = _gauge(
    "pool", "dispo_pool_crons", "Crons of the pool by status (busy, idle, stuck)", ("status",)
)
POOL_QUEUE_DEPTH = _gauge(
    "pool", "dispo_pool_queue_depth", "Evaluations waiting in the queue for a cron"
)
POOL_OLDEST_WAIT = _gauge(
    "pool",
    "dispo_pool_queue_oldest_wait_seconds",
    "Time the longest-waiting evaluation of the queue has waited (0 when none)",
)
_CRONS_STUCK = _counter(
    "pool",
    "dispo_pool_crons_stuck",
    "Crons found stuck (silent too long) and replaced; its rate is the stuck rate",
    (),
)

# ---- intelligence ------------------------------------------------------------------------
INTELLIGENCE_JOBS = _gauge(
    "intelligence",
    "dispo_intelligence_jobs",
    "Analysis and comparison jobs not completed, by kind and status (queued, generating, failed)",
    ("kind", "status"),
)
_JOBS_SETTLED = _counter(
    "intelligence",
    "dispo_intelligence_jobs_settled",
    "Jobs executed to an end, by kind and outcome (completed, failed, skipped, lost)",
    ("kind", "outcome"),
)
_JOB_DURATION = _histogram(
    "intelligence",
    "dispo_intelligence_job_duration_seconds",
    "Time of one job's execution, from its claim to its settlement",
    ("kind", "outcome"),
)


# ---- recorders (one call where the event happens; kept cheap for the hot path) -----------
def group_commit_flushes(group: str) -> Callable[[int], None]:
    """What the group commit ``group`` (:class:`dispo.libs.batcher.Batcher`) calls with the
    items of each flush it committed."""
    return _GROUP_COMMIT_ITEMS(group).observe


def retention_purged(table: str, rows: int) -> None:
    _RETENTION_PURGED(table).inc(rows)


def task_accepted(business: str, cells: Iterable[str]) -> None:
    _TASKS_ACCEPTED(business).inc()
    for cell in set(cells):
        _CELLS_ACCEPTED(business, cell).inc()


def task_finished(business: str, status: str, cells: Iterable[str]) -> None:
    _TASKS_FINISHED(business, status).inc()
    for cell in set(cells):
        _CELLS_FINISHED(business, cell, status).inc()


def output_read(outcome: str) -> None:
    _OUTPUT_READS(outcome).inc()


def node_ran(action: str, downstream: str, status: str, seconds: float, retry: bool) -> None:
    _NODE_RUNS(action, downstream, status).inc()
    _NODE_DURATION(action, downstream).observe(seconds)
    if retry:
        _NODE_RETRIES(action, downstream).inc()


def node_demoted(action: str, downstream: str) -> None:
    _NODE_DEMOTIONS(action, downstream).inc()


def task_redriven(trigger: str) -> None:
    _REDRIVES(trigger).inc()


def cron_stuck() -> None:
    _CRONS_STUCK().inc()


def job_settled(kind: str, outcome: str, seconds: float) -> None:
    _JOBS_SETTLED(kind, outcome).inc()
    _JOB_DURATION(kind, outcome).observe(seconds)


# ---- scrape-time probes and the endpoint -------------------------------------------------
Probe = Callable[[], Awaitable[Iterable[Sample]]]


class Probes(Collector):
    """The service's probes, read on its event loop when a scrape (on the endpoint's
    thread) finds the last reading older than ``cache_seconds``; one reading at a time."""

    def __init__(
        self, cache_seconds: float = CACHE_SECONDS, timeout: float = PROBE_TIMEOUT_SECONDS
    ) -> None:
        # The service's event loop, where the probes run (set when the endpoint starts).
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self.probes: list[Probe] = []
        self._lock = threading.Lock()
        self._read_at = -math.inf
        self._samples: list[Sample] = []

    def add(self, probe: Probe) -> None:
        self.probes.append(probe)

    async def read(self) -> list[Sample]:
        """Every probe's samples; a probe that fails is logged and left out."""
        results = await asyncio.gather(*(p() for p in self.probes), return_exceptions=True)
        samples: list[Sample] = []
        for probe, result in zip(self.probes, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("metrics probe failed", probe=_name(probe), error=repr(result))
            else:
                samples.extend(result)
        return samples

    def _reading(self) -> list[Sample]:
        with self._lock:
            if self.loop is None:
                return []
            if time.monotonic() - self._read_at >= self.cache_seconds:
                future = asyncio.run_coroutine_threadsafe(self.read(), self.loop)
                try:
                    self._samples = future.result(self.timeout)
                except Exception as error:  # the loop is busy or stopping: the last reading
                    future.cancel()
                    log.warning("metrics probes did not answer", error=repr(error))
                self._read_at = time.monotonic()
            return self._samples

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for gauge, label_values, value in self._reading():
            family = families.get(gauge.name)
            if family is None:
                family = families[gauge.name] = GaugeMetricFamily(
                    gauge.name, gauge.help, labels=gauge.labels
                )
            family.add_metric(list(label_values), value)
        yield from families.values()


def _name(probe: Probe) -> str:
    return getattr(probe, "__qualname__", repr(probe))


class Metrics:
    """One service's metrics: its registry (its families, the common ones, ``process_*``),
    its probes, and the endpoint serving them."""

    def __init__(self, service: str, cache_seconds: float = CACHE_SECONDS) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        for metric in [*_RECORDED.get(COMMON, []), *_RECORDED.get(service, [])]:
            self.registry.register(metric)
        self.registry.register(ProcessCollector(registry=None))
        self.probes = Probes(cache_seconds)
        self.registry.register(self.probes)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def probe(self, probe: Probe) -> None:
        """Read ``probe`` at scrape time (cached, see :class:`Probes`)."""
        self.probes.add(probe)

    def start(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` on a thread, the probes read on the running
        event loop; returns the port bound."""
        self.probes.loop = asyncio.get_running_loop()
        self._server, self._thread = start_http_server(port, host, self.registry)
        return int(self._server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
