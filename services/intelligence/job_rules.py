"""Intelligence jobs: kinds, the status machine, and the few rules settlement shares.

One row per (kind, evaluation) is the authority for a job (ADR 0001). The status machine is
declared once here, checked by every guarded status write in the store, and
mirrored by the ``ck_job_status`` CHECK constraint (``store.CHECKED_COLUMNS``);
``tests/intelligence/test_schema.py`` checks that both agree.

Who moves a job out of each status:
- ``queued``: ``execute`` (claim, then ``generating`` or ``failed`` when validation fails);
  recovery (re-queue, or ``failed`` once the recovery cap is reached) of a row nobody
  holds: handed back, or its heartbeat stale.
- ``generating``: ``execute`` (settle ``completed`` / ``failed``; hand back to ``queued``
  when its process stops); recovery re-queues a row whose owner's heartbeat is stale.
- ``failed``: a new trigger re-queues it.
- ``completed``: nothing; it is final.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dispo.libs.states import Transitions

# Restart recovery re-queues a queued row at most this many times, then fails it visibly.
MAX_QUEUED_RECOVERY_ATTEMPTS = 3


class JobKind(enum.StrEnum):
    ANALYSIS = "analysis"
    COMPARISON = "comparison"


class JobStatus(enum.StrEnum):
    QUEUED = "queued"
    GENERATING = "generating"
    COMPLETED = "completed"
    FAILED = "failed"


TRANSITIONS = Transitions[JobStatus](
    "job",
    {
        # queued -> queued: restart recovery re-queues a row no worker claimed (one more
        # recovery attempt, same status).
        JobStatus.QUEUED: {JobStatus.GENERATING, JobStatus.FAILED, JobStatus.QUEUED},
        JobStatus.GENERATING: {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.QUEUED},
        JobStatus.FAILED: {JobStatus.QUEUED},
        JobStatus.COMPLETED: set(),
    },
)

TERMINAL = frozenset({JobStatus.COMPLETED, JobStatus.FAILED})
# A trigger may (re-)queue a job only from these; the others mean "already handled".
REQUEUE_FROM = frozenset({JobStatus.FAILED})


def can_transition(source: JobStatus, target: JobStatus) -> bool:
    return TRANSITIONS.allows(source, target)


def describe_exception(error: BaseException) -> str:
    message = str(error).strip()
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


class ValidationKind(enum.StrEnum):
    """How a validation failure surfaces to a gRPC caller."""

    NOT_FOUND = "not_found"
    FAILED_PRECONDITION = "failed_precondition"
    INVALID_ARGUMENT = "invalid_argument"


class JobValidationError(Exception):
    """A request that must not run. ``fields`` are recorded on the failed row with the message.

    The gRPC handler raises the matching domain error with the same ``message``; ``execute``
    records ``message`` as the failed row's error. One wording, two surfaces.
    """

    def __init__(
        self,
        message: str,
        kind: ValidationKind = ValidationKind.FAILED_PRECONDITION,
        *,
        field: str = "evaluation_id",
        fields: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.field = field
        self.fields = dict(fields or {})


@dataclass(frozen=True)
class Job:
    kind: JobKind
    evaluation_id: str
    status: JobStatus
    error: str | None = None
    attempts: int = 0
    recovery_attempts: int = 0
    analysis_model: str | None = None
    baseline_evaluation_id: str | None = None
    fingerprint: str | None = None
    result: dict[str, Any] | None = None
    claim_token: str | None = None
    # Last sign of life of whoever holds the row (recovery takes over stale ones only).
    heartbeat_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class WorkResult:
    """What a work function returns: the result document plus fields for the completed row."""

    result: dict[str, Any]
    fields: dict[str, Any] = field(default_factory=dict)


# Columns a validation error or a work result may set on the row, besides status and error.
SETTLEMENT_FIELDS = frozenset({"analysis_model", "baseline_evaluation_id", "fingerprint"})


def settlement_fields(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = set(fields) - SETTLEMENT_FIELDS
    if unknown:
        raise ValueError(f"not settlement fields: {sorted(unknown)}")
    return dict(fields)
