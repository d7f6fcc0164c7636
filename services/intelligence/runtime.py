"""Starting jobs in this process: triggers, the automatic chain, recovery and sweeps.

The registry only holds task handles; every decision reads the rows.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from dispo.intelligence import analysis, comparison, store
from dispo.intelligence.eligibility import auto_intelligence_eligible
from dispo.intelligence.evaluations import Evaluation, EvaluationRecordStatus
from dispo.intelligence.job_rules import Job, JobKind, JobStatus, JobValidationError
from dispo.intelligence.job_settlement import (
    JobAdapter,
    JobDeps,
    JobOutcome,
    RecoveryReport,
    execute,
    recover_jobs,
)
from dispo.intelligence.registry import TaskRegistry
from dispo.libs.logging import get_logger

log = get_logger(__name__)

ADAPTERS: dict[JobKind, JobAdapter] = {
    JobKind.ANALYSIS: analysis.ANALYSIS,
    JobKind.COMPARISON: comparison.COMPARISON,
}


@dataclass(frozen=True)
class RecoveryPolicy:
    # A queued row nobody claimed this long after it was queued is nobody's.
    queued_idle: timedelta = timedelta(minutes=5)
    # A claimed row whose claim was not extended (heartbeat) this long lost its worker.
    generating_stale: timedelta = timedelta(minutes=15)
    batch: int = 100
    # How often a running job's owner extends its claim; well below ``generating_stale``.
    heartbeat: timedelta = timedelta(minutes=1)


class IntelligenceJobs:
    def __init__(
        self,
        deps: JobDeps,
        registry: TaskRegistry | None = None,
        policy: RecoveryPolicy | None = None,
    ) -> None:
        self.deps = deps
        self.registry = registry or TaskRegistry("intelligence-jobs")
        self.policy = policy or RecoveryPolicy()

    def start(self, kind: JobKind, evaluation_id: str) -> asyncio.Task[JobOutcome] | None:
        return self.registry.start((kind, evaluation_id), lambda: self._run(kind, evaluation_id))

    async def _run(self, kind: JobKind, evaluation_id: str) -> JobOutcome:
        outcome = await execute(kind, evaluation_id, self.deps, ADAPTERS[kind])
        if kind == JobKind.ANALYSIS and outcome == JobOutcome.COMPLETED:
            async with self.deps.db.connection() as conn:
                evaluation = await store.evaluation_get(conn, evaluation_id)
            if (
                evaluation is not None
                and auto_intelligence_eligible(evaluation, self.deps.models)
                and not await self._baseline_to_come(evaluation)
            ):
                self.start(JobKind.COMPARISON, evaluation_id)
        return outcome

    async def _baseline_to_come(self, evaluation: Evaluation) -> bool:
        """An automatic comparison waits while an earlier period that would be its baseline
        is still running (its events may come after this one's, or the pool runs periods
        side by side): the lost-trigger sweep starts it once that period is done. A caller's
        trigger does not wait: it is answered with what is there now."""
        async with self.deps.db.connection() as conn:
            waiting_for = await store.evaluation_baseline_to_come(conn, evaluation)
        if waiting_for is not None:
            log.info(
                "automatic comparison waits for its baseline period",
                evaluation_id=evaluation.evaluation_id,
                baseline_to_come=waiting_for.evaluation_id,
                period=waiting_for.period,
            )
        return waiting_for is not None

    def on_evaluation_completed(self, evaluation: Evaluation) -> bool:
        """Automatic analysis of a completed evaluation; ``True`` when one was started."""
        if evaluation.status != EvaluationRecordStatus.COMPLETED:
            return False
        if not auto_intelligence_eligible(evaluation, self.deps.models):
            log.info(
                "automatic analysis skipped",
                evaluation_id=evaluation.evaluation_id,
                line=evaluation.line.value,
                analysis_model=evaluation.analysis_model or self.deps.models.default,
            )
            return False
        return self.start(JobKind.ANALYSIS, evaluation.evaluation_id) is not None

    async def validate_request(self, kind: JobKind, evaluation_id: str) -> None:
        """The shared validation entry of ``kind``; raises ``JobValidationError``."""
        if kind == JobKind.ANALYSIS:
            async with self.deps.db.connection() as conn:
                evaluation = await store.evaluation_get(conn, evaluation_id)
            analysis.validate_analysis_request(evaluation, evaluation_id, self.deps.models)
        else:
            await comparison.load_and_validate(self.deps, evaluation_id)

    async def trigger(self, kind: JobKind, evaluation_id: str) -> tuple[Job, bool]:
        """A caller's trigger: validate, (re-)queue the row, start it. ``(job, started)``."""
        await self.validate_request(kind, evaluation_id)
        async with self.deps.db.connection() as conn:
            job, changed = await store.job_ensure_queued(
                conn, kind, evaluation_id, self.deps.clock.now(), requeue_failed=True
            )
        if job is None:  # validated a moment ago; evaluations are never deleted
            raise JobValidationError(f"evaluation {evaluation_id!r} not found")
        if job.status == JobStatus.QUEUED:
            self.start(kind, evaluation_id)
        return job, changed

    async def recover(self) -> RecoveryReport:
        """Re-queue and restart abandoned rows (capped); one batch. The same at start as in a
        sweep: other live replicas' rows are theirs (``recover_jobs``)."""
        now = self.deps.clock.now()
        report = await recover_jobs(
            self.deps.db,
            now,
            queued_idle=self.policy.queued_idle,
            generating_stale=self.policy.generating_stale,
            limit=self.policy.batch,
            skip=set(self.registry.running()),
        )
        for kind, evaluation_id in report.requeued:
            self.start(kind, evaluation_id)
        return report

    async def sweep_lost_triggers(self) -> list[tuple[JobKind, str]]:
        """Start automatic jobs whose trigger a crash lost (completed evaluation without analysis,
        completed analysis without comparison), and comparisons that waited for their
        baseline period; one batch of each."""
        started: list[tuple[JobKind, str]] = []
        for kind, prerequisite in (
            (JobKind.ANALYSIS, None),
            (JobKind.COMPARISON, JobKind.ANALYSIS),
        ):
            async with self.deps.db.connection() as conn:
                lost = await store.evaluations_completed_without_job(
                    conn, kind, prerequisite, self.policy.batch
                )
            for evaluation in lost:
                if not auto_intelligence_eligible(evaluation, self.deps.models):
                    continue
                if kind == JobKind.COMPARISON and await self._baseline_to_come(evaluation):
                    continue
                if self.start(kind, evaluation.evaluation_id):
                    started.append((kind, evaluation.evaluation_id))
        return started

    async def sweep_once(self) -> None:
        """One pass of the periodic sweeps: recovery, then lost triggers (the service runs it
        every ``sweep_interval_seconds`` of its clock)."""
        await self.recover()
        await self.sweep_lost_triggers()

    async def wait_idle(self) -> None:
        await self.registry.wait_idle()

    async def close(self, grace: float) -> None:
        await self.registry.close(grace)
