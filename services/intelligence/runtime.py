"""Starting jobs in this process: triggers, the automatic chain, recovery and sweeps.

The registry only holds task handles; every decision reads the rows.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

from dispo.intelligence import analysis, comparison
from dispo.intelligence.campaigns import Campaign, CampaignStatus
from dispo.intelligence.eligibility import auto_intelligence_eligible
from dispo.intelligence.intelligence_jobs import (
    JobAdapter,
    JobDeps,
    Outcome,
    RecoveryReport,
    execute,
    recover_jobs,
)
from dispo.intelligence.jobs import Job, JobKind, JobStatus, JobValidationError
from dispo.intelligence.registry import TaskRegistry
from dispo.libs.logging import get_logger

log = get_logger(__name__)

ADAPTERS: dict[JobKind, JobAdapter] = {
    JobKind.ANALYSIS: analysis.ANALYSIS,
    JobKind.COMPARISON: comparison.COMPARISON,
}


@dataclass(frozen=True)
class RecoveryPolicy:
    # A queued row untouched this long is nobody's (at process start: any queued row).
    queued_idle: timedelta = timedelta(minutes=5)
    # A generating row claimed this long ago lost its worker.
    generating_stale: timedelta = timedelta(minutes=15)
    batch: int = 100


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

    def start(self, kind: JobKind, campaign_id: str) -> asyncio.Task[Outcome] | None:
        return self.registry.start((kind, campaign_id), lambda: self._run(kind, campaign_id))

    async def _run(self, kind: JobKind, campaign_id: str) -> Outcome:
        outcome = await execute(kind, campaign_id, self.deps, ADAPTERS[kind])
        if kind == JobKind.ANALYSIS and outcome == Outcome.COMPLETED:
            campaign = await self.deps.repo.campaign_get(campaign_id)
            if campaign is not None and auto_intelligence_eligible(campaign, self.deps.models):
                self.start(JobKind.COMPARISON, campaign_id)
        return outcome

    def on_campaign_completed(self, campaign: Campaign) -> bool:
        """Automatic analysis of a completed campaign; ``True`` when one was started."""
        if campaign.status != CampaignStatus.COMPLETED:
            return False
        if not auto_intelligence_eligible(campaign, self.deps.models):
            log.info(
                "automatic analysis skipped",
                campaign_id=campaign.campaign_id,
                line=campaign.line.value,
                analysis_model=campaign.analysis_model or self.deps.models.default,
            )
            return False
        return self.start(JobKind.ANALYSIS, campaign.campaign_id) is not None

    async def validate_request(self, kind: JobKind, campaign_id: str) -> None:
        """The shared validation entry of ``kind``; raises ``JobValidationError``."""
        if kind == JobKind.ANALYSIS:
            campaign = await self.deps.repo.campaign_get(campaign_id)
            analysis.validate_analysis_request(campaign, campaign_id, self.deps.models)
        else:
            await comparison.load_and_validate(self.deps, campaign_id)

    async def trigger(self, kind: JobKind, campaign_id: str) -> tuple[Job, bool]:
        """A caller's trigger: validate, (re-)queue the row, start it. ``(job, started)``."""
        await self.validate_request(kind, campaign_id)
        job, changed = await self.deps.repo.job_ensure_queued(
            kind, campaign_id, self.deps.clock.now(), requeue_failed=True
        )
        if job is None:  # validated a moment ago; campaigns are never deleted
            raise JobValidationError(f"campaign {campaign_id!r} not found")
        if job.status == JobStatus.QUEUED:
            self.start(kind, campaign_id)
        return job, changed

    async def recover(self, *, at_start: bool = False) -> RecoveryReport:
        """Re-queue and restart rows nobody works on (capped); one batch."""
        now = self.deps.clock.now()
        queued_idle = timedelta(0) if at_start else self.policy.queued_idle
        report = await recover_jobs(
            self.deps.repo,
            now,
            queued_idle=queued_idle,
            generating_stale=self.policy.generating_stale,
            limit=self.policy.batch,
            skip=set(self.registry.running()),
        )
        for kind, campaign_id in report.requeued:
            self.start(kind, campaign_id)
        return report

    async def sweep_lost_triggers(self) -> list[tuple[JobKind, str]]:
        """Start automatic jobs whose trigger a crash lost (completed campaign without analysis,
        completed analysis without comparison); one batch of each."""
        started: list[tuple[JobKind, str]] = []
        for kind, prerequisite in (
            (JobKind.ANALYSIS, None),
            (JobKind.COMPARISON, JobKind.ANALYSIS),
        ):
            for campaign in await self.deps.repo.campaigns_completed_without_job(
                kind, prerequisite, self.policy.batch
            ):
                if auto_intelligence_eligible(campaign, self.deps.models) and self.start(
                    kind, campaign.campaign_id
                ):
                    started.append((kind, campaign.campaign_id))
        return started

    async def run_sweeps(self, interval: float) -> None:
        """Periodic recovery and lost-trigger sweeps until cancelled."""
        while True:
            await self.deps.clock.sleep(interval)
            try:
                await self.recover()
                await self.sweep_lost_triggers()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("intelligence sweep failed")

    async def wait_idle(self) -> None:
        await self.registry.wait_idle()

    async def close(self, grace: float) -> None:
        await self.registry.close(grace)
