"""The bench's figures, from facts gathered elsewhere: latency summaries, throughput, CPU
per task per process, and the report (a JSON-ready dict) with its text rendering. No I/O.

    submit = latency([0.004, 0.006, ...])            # seconds in, milliseconds out
    cpu = cpu_per_task(before, after, tasks=3000)    # {name: {"seconds", "ms_per_task"}}
    report = build_report(machine=..., config=..., load=..., outcomes=..., ...)
    print("\\n".join(render(report)))
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dispo.tools.bench.waiting import waiting_text

# Name of the load generator's own process in the CPU accounting.
CLIENT = "bench-client"


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (``nan`` for no values)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


@dataclass(frozen=True)
class Latency:
    n: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    max_ms: float | None


def latency(seconds: Sequence[float]) -> Latency:
    """Summary of durations given in seconds, in milliseconds (``None`` with no values)."""
    if not seconds:
        return Latency(0, None, None, None, None, None)
    ms = sorted(v * 1000 for v in seconds)
    return Latency(
        len(ms),
        percentile(ms, 50),
        percentile(ms, 95),
        percentile(ms, 99),
        statistics.fmean(ms),
        ms[-1],
    )


def per_second(count: int, seconds: float) -> float | None:
    return count / seconds if seconds > 0 else None


@dataclass(frozen=True)
class Submission:
    """One Submit as the load generator saw it: when it was sent (seconds from the start of
    the run, and how late against its schedule in rate mode), how long the answer took and
    how many times it was sent (under the same key) to get it."""

    sent_at: float
    seconds: float
    task_id: str = ""
    error: str = ""
    lag: float = 0.0
    tries: int = 1


@dataclass(frozen=True)
class Outcome:
    """A task as the gateway reports it at the end: its status, when it was accepted and
    when its status last changed (the terminal snapshot for a finished task), both as
    seconds since the epoch."""

    task_id: str
    status: str
    accepted_at: float
    updated_at: float


TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


@dataclass
class LoadFacts:
    """What the load generator did: its submissions, the run's start (epoch seconds), and
    the offered rate in rate mode (``None``: saturation)."""

    started_at: float
    submissions: list[Submission] = field(default_factory=list)
    offered_rate: float | None = None

    @property
    def accepted(self) -> list[Submission]:
        return [s for s in self.submissions if not s.error]


def cpu_per_task(
    before: Mapping[str, float], after: Mapping[str, float], tasks: int
) -> dict[str, Any]:
    """CPU seconds each process used between two samples, and per task in milliseconds;
    ``stack_ms_per_task`` sums every process but the load generator, ``all_ms_per_task``
    includes it. A process present in only one sample counts from zero."""
    used = {
        name: max(0.0, after.get(name, 0.0) - before.get(name, 0.0))
        for name in sorted(set(before) | set(after))
    }
    stack = sum(seconds for name, seconds in used.items() if name != CLIENT)
    everything = sum(used.values())
    return {
        "per_process": {
            name: {
                "seconds": round(seconds, 4),
                "ms_per_task": round(seconds * 1000 / tasks, 4) if tasks else None,
            }
            for name, seconds in used.items()
        },
        "stack_seconds": round(stack, 4),
        "stack_ms_per_task": round(stack * 1000 / tasks, 4) if tasks else None,
        "all_ms_per_task": round(everything * 1000 / tasks, 4) if tasks else None,
    }


def busy_figures(machine_busy: tuple[float, float] | None) -> dict[str, Any] | None:
    """How busy the whole machine was: (CPU seconds it spent busy, wall seconds) as
    figures, with the average number of busy cores."""
    if machine_busy is None:
        return None
    busy_seconds, wall = machine_busy
    return {
        "busy_cpu_seconds": round(busy_seconds, 3),
        "wall_seconds": round(wall, 3),
        "busy_cores": round(busy_seconds / wall, 3) if wall > 0 else None,
    }


def build_report(
    *,
    created: str,
    machine: Mapping[str, Any],
    config: Mapping[str, Any],
    nodes_per_task: int,
    load: LoadFacts,
    outcomes: Sequence[Outcome],
    cpu_before: Mapping[str, float],
    cpu_after: Mapping[str, float],
    machine_busy: tuple[float, float] | None,
    ceiling: Mapping[str, Any] | None,
    status_events: tuple[int, int] | None = None,
    wal_bytes: int | None = None,
    group_commits: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The result of one run, JSON-ready. Throughput counts from the run's start: submitted/s
    to the last Submit answer, completed/s to the last terminal snapshot. ``machine_busy``
    is (CPU seconds the whole machine spent busy, wall seconds) between the CPU samples.
    ``status_events``: (status snapshots, tasks) in the histories of a sample of the run's
    tasks (None: not counted), given per task. ``wal_bytes``: the write-ahead log PostgreSQL
    wrote between the CPU samples (None: not measured), given per completed task (per
    accepted task when none completed). ``group_commits``: each process's group commits
    during the run (:func:`dispo.tools.bench.group_commits.between`; None: not read)."""
    accepted = load.accepted
    submit_end = max((s.sent_at + s.seconds for s in load.submissions), default=0.0)
    finished = [o for o in outcomes if o.status in TERMINAL]
    last_terminal = max((o.updated_at for o in finished), default=load.started_at)
    completed_window = last_terminal - load.started_at
    completed_rate = per_second(len(finished), completed_window)
    # Per completed task; per accepted task when none completes (a Submit-only run).
    cpu = cpu_per_task(cpu_before, cpu_after, len(finished) or len(accepted))
    cpu["per"] = "completed task" if finished else "accepted task"
    measured = sum(p["seconds"] for p in cpu["per_process"].values())
    window = max(submit_end, completed_window)
    busy = busy_figures(machine_busy)
    if busy is not None:
        # CPU the machine spent on processes this run did not start (other work).
        busy["others_cpu_seconds"] = round(max(0.0, busy["busy_cpu_seconds"] - measured), 3)
    return {
        "created": created,
        "machine": {**machine, "during_run": busy},
        "config": dict(config),
        "throughput": {
            "offered_per_s": load.offered_rate,
            "submitted": len(accepted),
            "submit_errors": len(load.submissions) - len(accepted),
            "submit_errors_by_code": dict(
                sorted(Counter(s.error for s in load.submissions if not s.task_id).items())
            ),
            "submitted_per_s": per_second(len(accepted), submit_end),
            "completed": len(finished),
            "completed_per_s": completed_rate,
            "node_runs_per_s": completed_rate * nodes_per_task if completed_rate else None,
            "seconds": round(window, 3),
        },
        "latency": {
            "submit": asdict(latency([s.seconds for s in accepted])),
            "submit_to_terminal": asdict(
                latency([max(0.0, o.updated_at - o.accepted_at) for o in finished])
            ),
            "send_lag": asdict(latency([s.lag for s in load.submissions]))
            if load.offered_rate
            else None,
        },
        "statuses": dict(sorted(Counter(o.status for o in outcomes).items())),
        "status_events_per_task": round(status_events[0] / status_events[1], 2)
        if status_events is not None and status_events[1]
        else None,
        "postgres_wal_bytes_per_task": round(wal_bytes / (len(finished) or len(accepted)))
        if wal_bytes is not None and (finished or accepted)
        else None,
        "cpu": cpu,
        "group_commits": dict(group_commits) if group_commits is not None else None,
        "postgres_commit_ceiling": dict(ceiling) if ceiling is not None else None,
    }


def _ms(value: float | None) -> str:
    return f"{value:8.2f}" if value is not None else "     n/a"


def _rate(value: float | None) -> str:
    return f"{value:.1f}/s" if value is not None else "n/a"


def latency_text(name: str, summary: Mapping[str, Any]) -> str:
    return (
        f"{name:<24} n={summary['n']:<7} p50={_ms(summary['p50_ms'])} ms  "
        f"p95={_ms(summary['p95_ms'])} ms  p99={_ms(summary['p99_ms'])} ms  "
        f"mean={_ms(summary['mean_ms'])} ms"
    )


def machine_text(machine: Mapping[str, Any]) -> str:
    return (
        f"{machine['cores']} cores, {machine['memory_bytes'] / 2**30:.1f} GiB,"
        f" {machine['cpu_model']}; load average before {machine['loadavg_before']}"
    )


def submit_label(config: Mapping[str, Any]) -> str:
    """What the Submit latency measures: a Submit, the SDK's submit() of one task (gathered
    with others into SubmitEach calls), or a SubmitMany call of ``batch`` tasks."""
    batch = config.get("batch") or 1
    if batch > 1:
        return f"SubmitMany({batch}) per call"
    if config.get("threads"):
        return "Client.submit() gathered" if config.get("gather") else "Client Submit"
    return "submit() gathered" if config.get("gather") else "Submit"


def errors_text(through: Mapping[str, Any]) -> str:
    """The Submits that failed, by status code; a rate limit's answers say where it is set."""
    codes = through.get("submit_errors_by_code") or {}
    if not through["submit_errors"]:
        return "0 errors"
    text = f"{through['submit_errors']} errors: " + ", ".join(
        f"{code} {n}" for code, n in codes.items()
    )
    if "RESOURCE_EXHAUSTED" in codes:
        text += (
            "; RESOURCE_EXHAUSTED is the stack's Submit rate limit per business"
            " (DISPO_GATEWAY_SUBMIT_RATE_PER_SECOND on its gateways, 0: none)"
        )
    return text


def render(report: Mapping[str, Any]) -> list[str]:
    """The report as lines for a terminal."""
    machine, config, through = report["machine"], report["config"], report["throughput"]
    lines = [
        f"machine                  {machine_text(machine)}",
        "config                   " + " ".join(f"{k}={v}" for k, v in config.items()),
    ]
    if through["offered_per_s"]:
        lines.append(f"offered                  {through['offered_per_s']:.1f}/s")
    lines += [
        f"submitted                {through['submitted']} ({errors_text(through)})"
        f" = {_rate(through['submitted_per_s'])}",
        f"completed                {through['completed']} = {_rate(through['completed_per_s'])}"
        f" ({_rate(through['node_runs_per_s'])} node runs)",
        latency_text(submit_label(config), report["latency"]["submit"]),
        latency_text("submit→terminal", report["latency"]["submit_to_terminal"]),
    ]
    if report["latency"]["send_lag"]:
        lines.append(latency_text("send lag (vs schedule)", report["latency"]["send_lag"]))
    lines.append(f"statuses                 {report['statuses']}")
    if report.get("status_events_per_task") is not None:
        lines.append(
            f"status events            {report['status_events_per_task']:.2f} per task"
            " (histories read back; a running task's progress at most once per interval)"
        )
    if report.get("postgres_wal_bytes_per_task") is not None:
        lines.append(
            f"PostgreSQL WAL           {report['postgres_wal_bytes_per_task']:,} bytes per"
            f" {report['cpu']['per']}"
        )
    cpu = report["cpu"]
    per = ", ".join(
        f"{name} {p['ms_per_task']:.2f}"
        for name, p in cpu["per_process"].items()
        if p["ms_per_task"] is not None
    )
    if cpu["stack_ms_per_task"] is not None:
        lines.append(
            f"CPU ms per task          stack {cpu['stack_ms_per_task']:.2f} (per {cpu['per']}): {per}"
        )
    if groups := report.get("group_commits"):
        lines.append(f"items per flush          {group_commits_text(groups)}")
    if machine["during_run"]:
        busy = machine["during_run"]
        lines.append(
            f"machine busy             {busy['busy_cores']} cores on average;"
            f" {busy['others_cpu_seconds']} CPU s by processes outside this run"
        )
    if parked := report.get("waiting"):
        lines.append(f"waiting                  {waiting_text(parked)}")
    if seen := report.get("downstream"):
        lines.append(
            f"downstream saw           {seen['most_at_once']} calls at once at most,"
            f" {seen['busiest_second']} in its busiest second"
            f" (limits: {config.get('downstream_limits') or 'none'})"
        )
    if ceiling := report["postgres_commit_ceiling"]:
        tps = ", ".join(f"{c} client(s) {v:.0f}/s" for c, v in ceiling["tps_by_clients"].items())
        lines.append(f"PostgreSQL commit ceiling one-row INSERT per transaction: {tps}")
    return lines


def group_commits_text(groups: Mapping[str, Mapping[str, Mapping[str, float]]]) -> str:
    """``executor: task openings 115.5 (52 flushes); gateway: statuses 107.2 (56 flushes), ...``"""
    return "; ".join(
        f"{process}: "
        + ", ".join(
            f"{group} {g['items_per_flush']:.1f} ({g['flushes']} flushes)"
            for group, g in by_group.items()
        )
        for process, by_group in groups.items()
    )


def result_name(report: Mapping[str, Any]) -> str:
    """File name of a result: ``<date>-<shape>-<mode>...json``, sortable by date."""
    config = report["config"]
    stamp = report["created"].replace(":", "").replace("-", "")[:15]
    mode = f"rate{config['rate']:g}" if config.get("rate") else "saturation"
    if config.get("submit_only"):
        mode += "-submit"
    if (config.get("batch") or 1) > 1:
        mode += f"-batch{config['batch']}"
    if config.get("threads"):
        mode += f"-threads{config['threads']}"
    if config.get("gather"):
        mode += "-gathered"
    scale = (
        f"g{config['gateways']}"
        + (f"e{config['executors']}" if config.get("executors") else "")
        + (f"w{config['workers']}" if config.get("workers") else "")
    )
    parts = [stamp, config["shape"], mode, scale]
    if (config.get("nats_nodes") or 1) > 1:
        parts.append(f"nats{config['nats_nodes']}")
    return "-".join(parts) + ".json"


TABLE_HEADER = (
    "| date (commit) | run | machine busy | submitted/s | completed/s | Submit p50 / p99 |"
    " submit→terminal p50 / p99 | CPU ms/task (stack) | PostgreSQL commits/s (1 / 32 clients) |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def table_row(report: Mapping[str, Any]) -> str:
    """The report as a row of the README's results table (:data:`TABLE_HEADER`)."""
    config, through, lat = report["config"], report["throughput"], report["latency"]
    run = f"{config['shape']}, " + (
        f"{config['rate']:g}/s offered"
        if config.get("rate")
        else f"{config['threads']} threads"
        if config.get("threads")
        else f"c={config['concurrency']}"
    )
    run += f", {config['tasks']} tasks" + (", Submit only" if config.get("submit_only") else "")
    if (config.get("batch") or 1) > 1:
        run += f", SubmitMany of {config['batch']}"
    if config.get("gather"):
        run += ", submits gathered into SubmitEach"
    run += f", {config['gateways']} gw"
    if config.get("executors"):
        run += f" / {config['executors']} ex"
    if config.get("workers"):
        run += f" / {config['workers']} workers of {config['worker_concurrency']} runs"
    if (config.get("nats_nodes") or 1) > 1:
        run += f", NATS x{config['nats_nodes']}"
    during = report["machine"].get("during_run") or {}
    busy = during.get("busy_cores")
    if busy is not None and during.get("busy_cpu_seconds"):
        share = during["others_cpu_seconds"] / during["busy_cpu_seconds"]
        busy_text = f"{busy:.2f} cores, {share:.0%} other work"
    else:
        busy_text = f"{busy:.2f} cores" if busy is not None else "n/a"
    ceiling = report["postgres_commit_ceiling"]
    commits = (
        " / ".join(f"{v:.0f}" for v in ceiling["tps_by_clients"].values()) if ceiling else "n/a"
    )

    def pair(summary: Mapping[str, Any]) -> str:
        if summary["p50_ms"] is None:
            return "n/a"
        return f"{summary['p50_ms']:.0f} / {summary['p99_ms']:.0f} ms"

    stack_cpu = report["cpu"]["stack_ms_per_task"]
    cells = [
        report["created"][:16].replace("T", " ")
        + (f" ({config['commit']})" if config.get("commit") else ""),
        run,
        busy_text,
        _rate(through["submitted_per_s"]).removesuffix("/s"),
        _rate(through["completed_per_s"]).removesuffix("/s"),
        pair(lat["submit"]),
        pair(lat["submit_to_terminal"]),
        f"{stack_cpu:.1f}" if stack_cpu is not None else "n/a",
        commits,
    ]
    return "| " + " | ".join(cells) + " |"


# Kept for the benchmarks that print lines directly (the pool's).
def latency_line(name: str, seconds: list[float]) -> str:
    return latency_text(name, asdict(latency(seconds)))
