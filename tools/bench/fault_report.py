"""The fault campaign's figures, from facts gathered elsewhere (no I/O): per fault, what was
accepted, lost, stuck, left UNKNOWN, done twice, and how long the stack took to recover.

    row = fault_row(phase)                 # one fault's figures from its PhaseFacts
    report = build_campaign(rows=[...], machine=..., config=..., ...)
    print("\\n".join(render_campaign(report)))
    exit_code(report)                      # 1 when anything was lost, stuck or done twice

Definitions (the README's table uses the same words):

- **accepted**: Submits the gateway answered with a task id (a Submit answered UNAVAILABLE
  or DEADLINE_EXCEEDED is sent again under the same idempotency key for a while, as a
  careful caller would; **refused** are those never answered with a task);
- **lost**: accepted tasks the gateway does not know at the end;
- **stuck**: tasks of the phase (accepted, or recorded by a Submit whose answer was lost)
  that are not terminal once the recovery window is over;
- **UNKNOWN left**: nodes still ``UNKNOWN`` at the end;
- **duplicate effects**: non-idempotent nodes whose effect the downstream performed more
  than once (it counts every effect and does not deduplicate);
- **second tasks**: tasks recorded for an idempotency key that already had one (a retried
  Submit must return the first);
- **recover s**: from the fault (the kill, or the end of a fault that lasts a while) until
  every task accepted before it is terminal, by the gateway's record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispo.tools.bench.report import TERMINAL, busy_figures, machine_text


@dataclass(frozen=True)
class NodeFacts:
    """One node at the end of a phase: its status, whether it may be repeated, how many
    times the downstream performed its effect, and (to tell why) its idempotency key, the
    calls the executor made for it and its last error."""

    status: str
    idempotent: bool
    effects: int
    key: str = ""
    attempts: int = 0
    last_error: str = ""


@dataclass(frozen=True)
class TaskFacts:
    """A task of a phase at the end, as the gateway records it (``status`` ``None``: the
    gateway does not know it), with the time of its last change (epoch seconds)."""

    task_id: str
    status: str | None
    updated_at: float = 0.0
    nodes: tuple[NodeFacts, ...] = ()
    idempotency_key: str = ""


@dataclass
class PhaseFacts:
    """What happened in one fault's phase. Times are epoch seconds."""

    fault: str
    offered: int
    # Task ids the gateway answered for, each with when the answer came.
    accepted: dict[str, float] = field(default_factory=dict)
    # Submits answered with an error, by gRPC code name.
    refused: Counter[str] = field(default_factory=Counter)
    # Accepted Submits that needed more than one try.
    retried: int = 0
    # Every task of the phase at the end: the accepted ones and any other the gateway holds.
    tasks: list[TaskFacts] = field(default_factory=list)
    # When the fault happened (for a fault that lasts, when it ended).
    fault_at: float = 0.0


def fault_row(phase: PhaseFacts) -> dict[str, Any]:
    """The figures of one phase (JSON-ready)."""
    known = {t.task_id: t for t in phase.tasks if t.status is not None}
    lost = sorted(task_id for task_id in phase.accepted if task_id not in known)
    stuck = sorted(t.task_id for t in known.values() if t.status not in TERMINAL)
    nodes = [n for t in known.values() for n in t.nodes]
    once = [n for n in nodes if not n.idempotent]
    before = [known.get(task_id) for task_id, at in phase.accepted.items() if at <= phase.fault_at]
    recover: float | None = None
    if before and all(t is not None and t.status in TERMINAL for t in before):
        last = max(t.updated_at for t in before if t is not None)
        recover = round(max(0.0, last - phase.fault_at), 3)
    per_key = Counter(t.idempotency_key for t in known.values())
    return {
        "fault": phase.fault,
        "offered": phase.offered,
        "accepted": len(phase.accepted),
        "refused": dict(sorted(phase.refused.items())),
        "retried_submits": phase.retried,
        "second_tasks": sum(n - 1 for n in per_key.values()),
        "lost": len(lost),
        "stuck": len(stuck),
        "unknown_left": sum(1 for n in nodes if n.status == "UNKNOWN"),
        "duplicate_effects": sum(1 for n in once if n.effects > 1),
        "extra_effects": sum(max(0, n.effects - 1) for n in once),
        # A node recorded SUCCEEDED whose effect never reached the downstream.
        "succeeded_without_effect": sum(
            1 for n in nodes if n.status == "SUCCEEDED" and n.effects == 0
        ),
        "statuses": dict(sorted(Counter(t.status for t in known.values()).items())),
        "accepted_before_fault": len(before),
        "recover_seconds": recover,
        "lost_tasks": lost[:20],
        "stuck_tasks": stuck[:20],
        "duplicates": [
            {"key": n.key, "effects": n.effects, "attempts": n.attempts, "last_error": n.last_error}
            for n in once
            if n.effects > 1
        ][:20],
    }


# What makes a campaign fail (its exit code).
FAILING = ("lost", "stuck", "duplicate_effects", "second_tasks")


def verdict(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The failing figures summed over the faults; all zero means the campaign passed."""
    return {name: sum(int(row[name]) for row in rows) for name in FAILING}


def exit_code(report: Mapping[str, Any]) -> int:
    return 1 if any(report["verdict"].values()) else 0


def build_campaign(
    *,
    created: str,
    machine: Mapping[str, Any],
    config: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    machine_busy: tuple[float, float] | None,
) -> dict[str, Any]:
    """The campaign's result, JSON-ready; ``machine_busy`` is (CPU seconds the machine spent
    busy, wall seconds) over the campaign."""
    return {
        "created": created,
        "machine": {**machine, "during_run": busy_figures(machine_busy)},
        "config": dict(config),
        "faults": [dict(row) for row in rows],
        "verdict": verdict(rows),
    }


COLUMNS = (
    ("fault", "fault"),
    ("accepted", "accepted"),
    ("refused", "refused"),
    ("lost", "lost"),
    ("stuck", "stuck"),
    ("unknown_left", "UNKNOWN left"),
    ("duplicate_effects", "duplicate effects"),
    ("recover_seconds", "recover s"),
)


def _cell(row: Mapping[str, Any], key: str) -> str:
    value = row[key]
    if key == "refused":
        return str(sum(value.values()))
    if key == "recover_seconds":
        return f"{value:.1f}" if value is not None else "n/a"
    return str(value)


def table(report: Mapping[str, Any]) -> list[str]:
    """The faults as a Markdown table (the README's)."""
    lines = [
        "| " + " | ".join(title for _, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in report["faults"]:
        lines.append("| " + " | ".join(_cell(row, key) for key, _ in COLUMNS) + " |")
    return lines


def render_campaign(report: Mapping[str, Any]) -> list[str]:
    """The campaign as lines for a terminal: machine, configuration, the table, the verdict."""
    machine, config = report["machine"], report["config"]
    lines = [
        f"machine   {machine_text(machine)}",
        "config    " + " ".join(f"{k}={v}" for k, v in config.items()),
    ]
    if busy := machine.get("during_run"):
        lines.append(f"busy      {busy['busy_cores']} cores on average over the campaign")
    lines += ["", *table(report), ""]
    for row in report["faults"]:
        details = [f"statuses {row['statuses']}"]
        if row["refused"]:
            details.append(f"refused {row['refused']}")
        if row["retried_submits"]:
            details.append(f"{row['retried_submits']} Submits accepted on a retry")
        if row["second_tasks"]:
            details.append(f"{row['second_tasks']} second tasks for one idempotency key")
        if row["extra_effects"]:
            details.append(f"{row['extra_effects']} extra non-idempotent effects")
        if row["succeeded_without_effect"]:
            details.append(f"{row['succeeded_without_effect']} SUCCEEDED without an effect")
        for name in ("lost_tasks", "stuck_tasks"):
            if row[name]:
                details.append(f"{name.replace('_', ' ')} {', '.join(row[name])}")
        lines.append(f"{row['fault']:<20} " + "; ".join(details))
    failing = {k: v for k, v in report["verdict"].items() if v}
    lines.append(
        "verdict   "
        + ("passed: nothing lost, stuck or done twice" if not failing else f"FAILED: {failing}")
    )
    return lines


def campaign_result_name(report: Mapping[str, Any]) -> str:
    """``<date>-faults-<tasks per fault>x<faults>-e<executors>.json``, sortable by date."""
    config = report["config"]
    stamp = report["created"].replace(":", "").replace("-", "")[:15]
    return (
        f"{stamp}-faults-{config['tasks_per_fault']}x{len(report['faults'])}"
        f"-e{config['executors']}.json"
    )
