"""``execute``: the one implementation of job settlement (ADR 0001).

Fixed order: ensure the row (``ensure_queued``; give up silently when it exists in a state
that forbids running) -> claim (conditional update, exactly one contender wins; losers exit
without doing the work) -> validate (after the claim; ``JobValidationError`` fails the row
with its fields) -> ``generating`` -> work -> settle (``completed`` with the result, or
``failed`` with the error truncated in one place). A transient failure of the work is
retried inside the job first (``retries``: backoff on the clock, bounded attempts).
Analysis and comparison each supply three small adapter functions; neither repeats any of
this sequence.

Also here: restart recovery of rows (``recover_jobs``), which reads rows, never the
in-process registry.
"""

from __future__ import annotations

import asyncio
import enum
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from dispo.intelligence import store
from dispo.intelligence.analysis_models import ModelRegistry
from dispo.intelligence.job_rules import (
    MAX_QUEUED_RECOVERY_ATTEMPTS,
    Job,
    JobKind,
    JobStatus,
    JobValidationError,
    WorkResult,
    describe_exception,
    settlement_fields,
)
from dispo.intelligence.retries import GaveUp, RetryPolicy, call_with_retries
from dispo.libs import metrics
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.periodic import Periodic

log = get_logger(__name__)


@dataclass
class JobDeps:
    """What adapters may use: the database the store runs on, the analysis models and the
    clock; and how ``execute`` retries a transient failure of the work (``retries``)."""

    db: Database
    models: ModelRegistry
    clock: Clock
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # How often the owner of a claim extends it (``ClaimHeartbeat``).
    heartbeat_seconds: float = 60.0


@dataclass(frozen=True)
class JobPlan:
    """What ``validate`` hands to ``work_fn``: anything it resolved, plus row fields to set."""

    data: dict[str, Any]
    fields: dict[str, Any]


EnsureQueued = Callable[[JobDeps, str], Awaitable[tuple[Job | None, bool]]]
Validate = Callable[[JobDeps, str], Awaitable[JobPlan]]
WorkFn = Callable[[JobDeps, str, JobPlan], Awaitable[WorkResult]]


@dataclass(frozen=True)
class JobAdapter:
    kind: JobKind
    ensure_queued: EnsureQueued
    validate: Validate
    work_fn: WorkFn


class JobOutcome(enum.StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    # The row exists in a state that forbids running (generating / completed / failed
    # without a re-trigger), or the evaluation is unknown: nothing was done.
    SKIPPED = "skipped"
    # Another contender claimed the row first, or the claim was taken away: nothing done.
    LOST = "lost"


async def execute(
    kind: JobKind, evaluation_id: str, deps: JobDeps, adapter: JobAdapter
) -> JobOutcome:
    if adapter.kind != kind:
        raise ValueError(f"adapter for {adapter.kind} cannot execute {kind}")
    clock = deps.clock
    bound = log.bind(job_kind=kind.value, evaluation_id=evaluation_id)

    job, _ = await adapter.ensure_queued(deps, evaluation_id)
    if job is None or job.status != JobStatus.QUEUED:
        bound.debug("job not runnable", status=job.status.value if job else None)
        return JobOutcome.SKIPPED

    token = uuid.uuid4().hex
    if not await _alone(
        deps.db, store.job_claim_if_queued, kind, evaluation_id, token, clock.now()
    ):
        bound.debug("claim lost")
        return JobOutcome.LOST
    claimed = time.perf_counter()
    async with ClaimHeartbeat(deps, kind, evaluation_id, token, bound):
        outcome = await _run_claimed(kind, evaluation_id, deps, adapter, token, bound)
    metrics.job_settled(kind.value, outcome.value, time.perf_counter() - claimed)
    return outcome


async def _run_claimed(
    kind: JobKind, evaluation_id: str, deps: JobDeps, adapter: JobAdapter, token: str, bound: Any
) -> JobOutcome:
    """Validate, ``generating``, work, settle: the part of ``execute`` that holds the claim."""
    db, clock = deps.db, deps.clock
    try:
        plan = await adapter.validate(deps, evaluation_id)
    except JobValidationError as error:
        return await _settle_failed(
            deps,
            kind,
            evaluation_id,
            token,
            JobStatus.QUEUED,
            error.message,
            settlement_fields(error.fields),
            bound,
        )
    except Exception as error:
        return await _settle_failed(
            deps, kind, evaluation_id, token, JobStatus.QUEUED, describe_exception(error), {}, bound
        )

    if not await _alone(
        db,
        store.job_set_generating_if_claimed,
        kind,
        evaluation_id,
        token,
        settlement_fields(plan.fields),
        clock.now(),
    ):
        bound.warning("claim taken away before generating")
        return JobOutcome.LOST

    def retrying(attempt: int, delay: float, error: Exception) -> None:
        bound.info(
            "transient failure; retrying",
            attempt=attempt,
            delay_seconds=round(delay, 3),
            error=truncate_error(describe_exception(error)),
        )

    try:
        result = await call_with_retries(
            lambda: adapter.work_fn(deps, evaluation_id, plan),
            deps.retry,
            clock,
            on_retry=retrying,
        )
    except asyncio.CancelledError:
        # Shutting down: hand the row back so recovery runs it again right away.
        await asyncio.shield(
            _alone(db, store.job_requeue_if_generating, kind, evaluation_id, token, clock.now())
        )
        bound.info("job interrupted; re-queued")
        raise
    except Exception as error:
        message = error.message if isinstance(error, GaveUp) else describe_exception(error)
        return await _settle_failed(
            deps, kind, evaluation_id, token, JobStatus.GENERATING, message, {}, bound
        )

    # Settlement writes are shielded: a shutdown arriving now must not leave the row half-settled.
    if await asyncio.shield(
        _alone(
            db,
            store.job_complete_if_generating,
            kind,
            evaluation_id,
            token,
            result.result,
            settlement_fields(result.fields),
            clock.now(),
        )
    ):
        bound.info("job completed")
        return JobOutcome.COMPLETED
    bound.warning("claim taken away before settling; result discarded")
    return JobOutcome.LOST


class ClaimHeartbeat:
    """While the block runs, extend the claim every ``deps.heartbeat_seconds`` of the clock.

    A claim whose heartbeat is fresh is never taken over by recovery, however long the
    job runs (a slow model, retries); one whose process died stops beating and goes stale.
    When the claim turns out to be gone, beating stops (the job's settlement, guarded by
    the token, is refused anyway).
    """

    def __init__(
        self, deps: JobDeps, kind: JobKind, evaluation_id: str, token: str, bound: Any
    ) -> None:
        self.deps, self.kind, self.evaluation_id, self.token = deps, kind, evaluation_id, token
        self.bound = bound
        self._periodic = Periodic(
            f"heartbeat {kind.value}:{evaluation_id}",
            self._beat,
            deps.heartbeat_seconds,
            deps.clock,
            first_after_interval=True,
        )
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        extended = await _alone(
            self.deps.db,
            store.job_heartbeat_if_claimed,
            self.kind,
            self.evaluation_id,
            self.token,
            self.deps.clock.now(),
        )
        if not extended:
            self.bound.warning("claim gone; heartbeat stopped")
            self._periodic.stop()

    async def __aenter__(self) -> ClaimHeartbeat:
        self._task = asyncio.create_task(self._periodic.run(), name=self._periodic.name)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # A beat in flight finishes (one short UPDATE) rather than being cut off mid-query.
        self._periodic.stop()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task.cancel()


async def _settle_failed(
    deps: JobDeps,
    kind: JobKind,
    evaluation_id: str,
    token: str,
    expected: JobStatus,
    message: str,
    fields: dict[str, Any],
    bound: Any,
) -> JobOutcome:
    error = truncate_error(message)
    if await asyncio.shield(
        _alone(
            deps.db,
            store.job_fail_if_claimed,
            kind,
            evaluation_id,
            token,
            expected,
            error,
            fields,
            deps.clock.now(),
        )
    ):
        bound.info("job failed", error=error)
        return JobOutcome.FAILED
    bound.warning("claim taken away before recording failure", error=error)
    return JobOutcome.LOST


async def _alone(db: Database, write: Callable[..., Awaitable[bool]], *args: Any) -> bool:
    """One guarded write of the store on a connection of its own, committed alone (a
    settlement's is shielded by its caller: a shutdown must not cut it off)."""
    async with db.connection() as conn:
        return await write(conn, *args)


# --- Restart recovery -------------------------------------------------------------------

RECOVERY_CAP_REASON = (
    f"gave up after {MAX_QUEUED_RECOVERY_ATTEMPTS} restart recoveries: "
    "the job was re-queued {attempts} times without settling"
)


@dataclass(frozen=True)
class RecoveryReport:
    requeued: list[tuple[JobKind, str]]
    failed: list[tuple[JobKind, str]]


async def recover_jobs(
    db: Database,
    now: datetime,
    *,
    queued_idle: timedelta,
    generating_stale: timedelta,
    limit: int = 100,
    skip: set[Hashable] | None = None,
) -> RecoveryReport:
    """Re-queue rows nobody is working on, at most ``MAX_QUEUED_RECOVERY_ATTEMPTS`` times each.

    Only abandoned rows, whichever replica calls it and whenever (at start or in a sweep):
    a queued row handed back by a stopping replica (no heartbeat) or left unclaimed for
    ``queued_idle`` after it was queued, and a claimed row (queued or generating) whose
    owner has not extended the claim for ``generating_stale``. A live replica's rows — the
    ones it just queued and is about to claim, the ones it runs and beats for — are not
    touched and keep their recovery attempts. Abandoned rows are re-queued with
    ``recovery_attempts + 1``; a row already re-queued the maximum number of times is
    failed with the reason instead. Every write is guarded by the row as read, heartbeat
    included, so a beat that lands meanwhile wins. Returns what the caller should start
    again. ``skip`` lists (kind, evaluation) pairs the calling process is running right now.
    """
    requeued: list[tuple[JobKind, str]] = []
    failed: list[tuple[JobKind, str]] = []
    async with db.connection() as conn:
        jobs = await store.jobs_needing_recovery(
            conn, now - queued_idle, now - generating_stale, limit
        )
    for job in jobs:
        if skip and (job.kind, job.evaluation_id) in skip:
            continue  # running in this very process (a periodic sweep, not a restart)
        if job.recovery_attempts >= MAX_QUEUED_RECOVERY_ATTEMPTS:
            reason = truncate_error(RECOVERY_CAP_REASON.format(attempts=job.recovery_attempts))
            if await _alone(db, store.job_fail_if_unchanged, job, reason, now):
                failed.append((job.kind, job.evaluation_id))
                log.warning(
                    "job recovery cap reached",
                    job_kind=job.kind.value,
                    evaluation_id=job.evaluation_id,
                )
        elif await _alone(db, store.job_requeue_if_unchanged, job, now):
            requeued.append((job.kind, job.evaluation_id))
            log.info(
                "job recovered",
                job_kind=job.kind.value,
                evaluation_id=job.evaluation_id,
                recovery_attempts=job.recovery_attempts + 1,
            )
    return RecoveryReport(requeued, failed)
