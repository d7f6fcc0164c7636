"""The cron pool's domain: evaluations, crons, the queue order, scaling and stuck policy.

Plain data and pure functions only; SQL lives in :mod:`dispo.pool.store`. The two
state machines are declared here once; every guarded write in the store checks its
move against them first. The database mirrors the enums with the CHECK constraints in
``CHECKED_COLUMNS`` (``tests/pool/test_domain.py`` compares the migrated schema with them).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dispo.libs.evaluation import Line, Verdict
from dispo.libs.states import EnumCheck, Transitions


class EvaluationStatus(enum.StrEnum):
    # Created, never served yet; waiting for its first cron. Out: a cron's claim.
    QUEUED = "queued"
    # Started; in its window. The queue scan serves it whenever it owes runs.
    # Out: completion (last run recorded), stuck sweep, operator pause / cancel.
    EXECUTING = "executing"
    # Operator paused it; the queue skips it. Out: operator resume / cancel.
    PAUSED = "paused"
    # Its cron went silent; it waits (first in line) for a new cron. Out: a cron's claim.
    STUCK = "stuck"
    # Every run of its window recorded. Terminal.
    COMPLETED = "completed"
    # Operator cancelled it. Terminal.
    CANCELLED = "cancelled"


EVALUATION_TRANSITIONS = Transitions[EvaluationStatus](
    "evaluation",
    {
        EvaluationStatus.QUEUED: frozenset(
            {EvaluationStatus.EXECUTING, EvaluationStatus.PAUSED, EvaluationStatus.CANCELLED}
        ),
        EvaluationStatus.EXECUTING: frozenset(
            {
                EvaluationStatus.STUCK,
                EvaluationStatus.PAUSED,
                EvaluationStatus.COMPLETED,
                EvaluationStatus.CANCELLED,
            }
        ),
        EvaluationStatus.PAUSED: frozenset(
            {EvaluationStatus.QUEUED, EvaluationStatus.EXECUTING, EvaluationStatus.CANCELLED}
        ),
        EvaluationStatus.STUCK: frozenset(
            {EvaluationStatus.EXECUTING, EvaluationStatus.PAUSED, EvaluationStatus.CANCELLED}
        ),
        EvaluationStatus.COMPLETED: frozenset(),
        EvaluationStatus.CANCELLED: frozenset(),
    },
)

# Statuses whose evaluations the queue scan may hand to a cron.
SERVABLE = (EvaluationStatus.QUEUED, EvaluationStatus.EXECUTING, EvaluationStatus.STUCK)
TERMINAL = (EvaluationStatus.COMPLETED, EvaluationStatus.CANCELLED)


class CronStatus(enum.StrEnum):
    # Free; takes the top queue item on its next wake. Out: claim, stuck sweep, scale-down.
    IDLE = "idle"
    # Holds one evaluation. Out: release (no runs owed), force release, stuck sweep.
    BUSY = "busy"
    # Silent for longer than the stuck timeout; removed and replaced by the stuck sweep.
    STUCK = "stuck"


CRON_TRANSITIONS = Transitions[CronStatus](
    "cron",
    {
        CronStatus.IDLE: frozenset({CronStatus.BUSY, CronStatus.STUCK}),
        CronStatus.BUSY: frozenset({CronStatus.IDLE, CronStatus.STUCK}),
        CronStatus.STUCK: frozenset(),
    },
)


# Every enum mirrored by a CHECK constraint (the names PostgreSQL gave the inline CHECKs).
CHECKED_COLUMNS = (
    EnumCheck("evaluations", "status", "evaluations_status_check", EvaluationStatus),
    EnumCheck("evaluations", "line", "evaluations_line_check", Line),
    EnumCheck("runs", "verdict", "runs_verdict_check", Verdict),
    EnumCheck("crons", "status", "crons_status_check", CronStatus),
)


class AssignmentEnd(enum.StrEnum):
    """Why a cron stopped holding an evaluation."""

    DONE = "done"  # no runs owed right now: the cron went back to the pool
    COMPLETED = "completed"  # the evaluation's last run was recorded
    STUCK = "stuck"  # the cron went silent (stuck sweep)
    FORCE_RELEASED = "force_released"  # held too long, or an operator asked
    CANCELLED = "cancelled"  # the evaluation was cancelled or paused
    DRIFT = "drift"  # repaired by the reconciler's drift check


@dataclass(frozen=True)
class Rule:
    """One scoring rule of a test case.

    kind: ``status`` (value = expected HTTP code), ``json_equals`` (path, value = JSON),
    ``json_contains`` (path, value = substring), ``regex`` (value = pattern over the body),
    ``latency_ms`` (value = budget in milliseconds).
    """

    kind: str
    value: str
    path: str = ""


RULE_KINDS = ("status", "json_equals", "json_contains", "regex", "latency_ms")


@dataclass(frozen=True)
class TestCase:
    __test__ = False  # not a pytest class

    id: str
    method: str = "GET"
    path: str = "/"
    body: str = ""
    rules: tuple[Rule, ...] = ()


@dataclass(frozen=True)
class Schedule:
    """An evaluation's window divided into slots; ``runs_per_slot`` runs fall due as each slot starts."""

    window_start: datetime
    window_seconds: int
    slot_count: int
    runs_per_slot: int

    @property
    def runs_total(self) -> int:
        return self.slot_count * self.runs_per_slot

    def current_slot(self, now: datetime) -> int:
        """Index of the latest slot that has started (-1 before the window)."""
        elapsed = (now - self.window_start).total_seconds()
        if elapsed < 0:
            return -1
        # Same arithmetic as the queue's SQL (store.SLOT_SQL): elapsed × slots / window.
        return min(self.slot_count - 1, math.floor(elapsed * self.slot_count / self.window_seconds))

    def runs_due(self, now: datetime) -> int:
        return self.runs_per_slot * (self.current_slot(now) + 1)

    def debt(self, now: datetime, runs_done: int) -> int:
        """Runs due so far minus runs done (never negative)."""
        return max(0, self.runs_due(now) - runs_done)

    def slot_due(self, now: datetime, runs_done: int) -> bool:
        """The slot now running has started and none of its own runs is done yet."""
        return self.debt(
            now, runs_done
        ) > 0 and runs_done <= self.runs_per_slot * self.current_slot(now)


@dataclass(frozen=True)
class QueueKey:
    """Sort key of a waiting evaluation: boost, then slot due > debt > waiting time."""

    boost: int
    slot_due: bool
    debt: int
    waiting_since: datetime
    evaluation_id: str
    status: str = ""  # not part of the order; reported by ListQueue

    def sort_key(self) -> tuple[int, bool, int, datetime, str]:
        return (-self.boost, not self.slot_due, -self.debt, self.waiting_since, self.evaluation_id)


@dataclass(frozen=True)
class PoolPolicy:
    """Every threshold of the seed, with its defaults."""

    min_size: int = 5
    max_size: int = 20
    scale_up_ratio: float = 0.8  # scale up when busy/total > this
    scale_down_idle_factor: float = 2.0  # scale down when idle > this × min_size
    tick_seconds: float = 60.0  # cron wake interval
    stuck_seconds: float = 600.0  # 10 minutes without activity → stuck
    hold_seconds: float = 7200.0  # 2 hours holding a cron → force release
    runs_per_wake: int = 50  # runs a cron performs per wake at most
    # What one evaluation may ask for: runs in all (slot_count × runs_per_slot), and runs a
    # second over its window.
    max_runs_per_evaluation: int = 100_000
    max_runs_per_second: float = 10.0

    @property
    def stuck_after(self) -> timedelta:
        return timedelta(seconds=self.stuck_seconds)

    @property
    def hold_limit(self) -> timedelta:
        return timedelta(seconds=self.hold_seconds)


@dataclass(frozen=True)
class ResizePlan:
    delta: int  # crons to create (>0) or idle crons to remove (<0)
    reason: str


def plan_resize(live: int, busy: int, idle: int, policy: PoolPolicy) -> ResizePlan:
    """How many crons to add or remove, given the live (idle + busy) crons.

    Up when busy/live > ratio (enough crons that the ratio is back at or under it), down
    when idle > factor × min (back to exactly that many idle); always within [min, max].
    """
    if live < policy.min_size:
        return ResizePlan(policy.min_size - live, "below_min")
    if live > policy.max_size:
        return ResizePlan(-min(idle, live - policy.max_size), "above_max")
    if live and busy / live > policy.scale_up_ratio:
        wanted = math.ceil(busy / policy.scale_up_ratio)
        target = min(policy.max_size, max(wanted, live + 1))
        return ResizePlan(target - live, "busy_ratio") if target > live else ResizePlan(0, "at_max")
    idle_limit = policy.scale_down_idle_factor * policy.min_size
    if idle > idle_limit:
        remove = min(idle - math.floor(idle_limit), live - policy.min_size)
        return ResizePlan(-remove, "idle_surplus") if remove > 0 else ResizePlan(0, "at_min")
    return ResizePlan(0, "steady")


@dataclass(frozen=True)
class Evaluation:
    id: str
    series: str
    line: Line
    period: str
    configuration_json: str
    analysis_model: str
    target_url: str
    cases: tuple[TestCase, ...]
    schedule: Schedule
    status: EvaluationStatus
    priority_boost: int = 0
    runs_done: int = 0
    assigned_cron_id: str | None = None
    assigned_at: datetime | None = None
    waiting_since: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None

    def differing_field(self, other: Evaluation) -> str | None:
        """The first field (by its CreateEvaluationRequest name) in which ``other`` asks for
        something else than this evaluation was created with; None for the same request."""
        for name, mine, theirs in (
            ("series", self.series, other.series),
            ("line", self.line, other.line),
            ("period", self.period, other.period),
            ("configuration_json", self.configuration_json, other.configuration_json),
            ("analysis_model", self.analysis_model, other.analysis_model),
            ("target_url", self.target_url, other.target_url),
            ("cases", self.cases, other.cases),
            ("window_seconds", self.schedule.window_seconds, other.schedule.window_seconds),
            ("slot_count", self.schedule.slot_count, other.schedule.slot_count),
            ("runs_per_slot", self.schedule.runs_per_slot, other.schedule.runs_per_slot),
        ):
            if mine != theirs:
                return name
        return None

    def case_for_run(self, run_index: int) -> TestCase:
        return self.cases[run_index % len(self.cases)]

    def run_id(self, run_index: int) -> str:
        return f"{self.id}-r{run_index}"


@dataclass(frozen=True)
class Cron:
    id: str
    status: CronStatus
    evaluation_id: str | None
    last_activity: datetime
    created_at: datetime

    def driver_state(self) -> dict[str, Any]:
        """The small JSON state the driver keeps for this cron (seed: status + eval_id)."""
        return {"status": self.status.value, "eval_id": self.evaluation_id or ""}


@dataclass(frozen=True)
class RunResult:
    verdict: Verdict
    score: float
    latency_ms: int
    failure_reason: str = ""


@dataclass(frozen=True)
class Assignment:
    id: int
    cron_id: str
    evaluation_id: str
    started_at: datetime
    ended_at: datetime | None
    end_reason: str | None


@dataclass(frozen=True)
class DriverCron:
    """A cron as the driver (local registry or OpenClaw) reports it."""

    id: str
    state: dict[str, Any] = field(default_factory=dict)
