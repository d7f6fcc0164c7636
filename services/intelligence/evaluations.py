"""Evaluations as the intelligence context sees them (its own read model).

An evaluation here is the pool's evaluation (same id) as this context records it; the
evaluations of one ``series`` are its periods.
The status machine is declared once here, checked by the store's status writes, and
mirrored by ``ck_evaluation_status`` (``store.CHECKED_COLUMNS``).
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispo.libs.errors import FieldViolation, InvalidArgument
from dispo.libs.evaluation import LINE_RULE, MAX_ID_CHARS, VERDICT_RULE, Line, Verdict
from dispo.libs.payload import PayloadError, canonical_json, parse_json_text
from dispo.libs.states import Transitions

MAX_CONFIGURATION_BYTES = 64 * 1024
MAX_FAILURE_REASON_CHARS = 2000
MAX_RUNS_PER_CALL = 1000


class EvaluationRecordStatus(enum.StrEnum):
    """Where intelligence's record of an evaluation stands: runs still coming in, or ended.
    Not the pool's ``EvaluationStatus`` (queued, executing, paused …), which it follows."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


EVALUATION_TRANSITIONS = Transitions[EvaluationRecordStatus](
    "evaluation",
    {
        EvaluationRecordStatus.RUNNING: {
            EvaluationRecordStatus.COMPLETED,
            EvaluationRecordStatus.FAILED,
            EvaluationRecordStatus.CANCELLED,
        },
        EvaluationRecordStatus.COMPLETED: set(),
        EvaluationRecordStatus.FAILED: set(),
        EvaluationRecordStatus.CANCELLED: set(),
    },
)
EVALUATION_TERMINAL = frozenset(
    {
        EvaluationRecordStatus.COMPLETED,
        EvaluationRecordStatus.FAILED,
        EvaluationRecordStatus.CANCELLED,
    }
)


@dataclass(frozen=True)
class Evaluation:
    evaluation_id: str
    series: str
    line: Line
    period: str
    configuration: dict[str, Any]
    status: EvaluationRecordStatus = EvaluationRecordStatus.RUNNING
    analysis_model: str | None = None
    created_at: datetime | None = None
    completed_at: datetime | None = None
    run_count: int = 0

    @property
    def is_terminal(self) -> bool:
        return self.status in EVALUATION_TERMINAL

    @property
    def fingerprint(self) -> str:
        return configuration_fingerprint(self.configuration)

    def differing_field(self, other: Evaluation) -> str | None:
        """The first field (by its CreateEvaluationRequest name) in which ``other`` registers
        something else than this evaluation; None for the same registration (a repeated
        create is a no-op)."""
        for name, mine, theirs in (
            ("series", self.series, other.series),
            ("line", self.line, other.line),
            ("period", self.period, other.period),
            ("configuration_json", self.configuration, other.configuration),
            ("analysis_model", self.analysis_model, other.analysis_model),
        ):
            if mine != theirs:
                return name
        return None


@dataclass(frozen=True)
class RunResult:
    run_id: str
    case_id: str
    verdict: Verdict
    score: float
    latency_ms: int
    failure_reason: str = ""
    recorded_at: datetime | None = None


def configuration_fingerprint(configuration: dict[str, Any]) -> str:
    """Stable digest of a configuration: canonical JSON (sorted keys), SHA-256, 16 hex digits."""
    return hashlib.sha256(canonical_json(configuration)).hexdigest()[:16]


def _check_id(value: str, name: str, violations: list[FieldViolation]) -> None:
    if not value.strip():
        violations.append(FieldViolation(name, "must not be empty"))
    elif len(value) > MAX_ID_CHARS:
        violations.append(FieldViolation(name, f"must be at most {MAX_ID_CHARS} characters"))


def parse_configuration(text: str, field_name: str = "configuration_json") -> dict[str, Any]:
    if len(text.encode()) > MAX_CONFIGURATION_BYTES:
        raise InvalidArgument(field_name, f"must be at most {MAX_CONFIGURATION_BYTES} bytes")
    if not text.strip():
        return {}
    try:
        value = parse_json_text(text)
    except PayloadError as error:
        where = f"{field_name}.{error.path}" if error.path else field_name
        raise InvalidArgument(where, error.reason) from None
    if not isinstance(value, dict):
        raise InvalidArgument(field_name, "must be a JSON object")
    return value


def new_evaluation(
    evaluation_id: str,
    series: str,
    line: str,
    period: str,
    configuration_json: str,
    analysis_model: str = "",
) -> Evaluation:
    """Validate an evaluation registration; raise ``InvalidArgument`` naming every bad field."""
    violations: list[FieldViolation] = []
    _check_id(evaluation_id, "evaluation_id", violations)
    _check_id(series, "series", violations)
    _check_id(period, "period", violations)
    if line not in Line.__members__.values():
        violations.append(FieldViolation("line", LINE_RULE))
    if len(analysis_model) > MAX_ID_CHARS:
        violations.append(
            FieldViolation("analysis_model", f"must be at most {MAX_ID_CHARS} characters")
        )
    try:
        configuration = parse_configuration(configuration_json)
    except InvalidArgument as error:
        violations.extend(error.violations)
        configuration = {}
    if violations:
        raise InvalidArgument(violations=violations)
    return Evaluation(
        evaluation_id=evaluation_id,
        series=series,
        line=Line(line),
        period=period,
        configuration=configuration,
        analysis_model=analysis_model or None,
    )


def new_run_result(
    run_id: str,
    case_id: str,
    verdict: str,
    score: float,
    latency_ms: int,
    failure_reason: str = "",
    recorded_at: datetime | None = None,
    field_prefix: str = "",
) -> RunResult:
    violations: list[FieldViolation] = []
    _check_id(run_id, f"{field_prefix}run_id", violations)
    _check_id(case_id, f"{field_prefix}case_id", violations)
    if verdict not in Verdict.__members__.values():
        violations.append(FieldViolation(f"{field_prefix}verdict", VERDICT_RULE))
    if not math.isfinite(score):
        violations.append(FieldViolation(f"{field_prefix}score", "must be a finite number"))
    if latency_ms < 0:
        violations.append(FieldViolation(f"{field_prefix}latency_ms", "must not be negative"))
    if len(failure_reason) > MAX_FAILURE_REASON_CHARS:
        violations.append(
            FieldViolation(
                f"{field_prefix}failure_reason",
                f"must be at most {MAX_FAILURE_REASON_CHARS} characters",
            )
        )
    if violations:
        raise InvalidArgument(violations=violations)
    return RunResult(
        run_id=run_id,
        case_id=case_id,
        verdict=Verdict(verdict),
        score=float(score),
        latency_ms=int(latency_ms),
        failure_reason=failure_reason,
        recorded_at=recorded_at,
    )
