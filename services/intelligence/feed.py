"""The campaign feed: registrations, run results and completions, from gRPC or events.

Completing a campaign hands it to the automatic trigger (``IntelligenceJobs``).
"""

from __future__ import annotations

from dispo.intelligence.campaigns import Campaign, CampaignStatus, RunResult
from dispo.intelligence.models import ModelRegistry
from dispo.intelligence.repository import IntelligenceRepository
from dispo.intelligence.runtime import IntelligenceJobs
from dispo.libs.clock import Clock
from dispo.libs.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger

log = get_logger(__name__)


class CampaignFeed:
    def __init__(
        self,
        repo: IntelligenceRepository,
        models: ModelRegistry,
        clock: Clock,
        jobs: IntelligenceJobs,
    ) -> None:
        self.repo = repo
        self.models = models
        self.clock = clock
        self.jobs = jobs

    async def get(self, campaign_id: str) -> Campaign:
        campaign = await self.repo.campaign_get(campaign_id)
        if campaign is None:
            raise NotFound(f"campaign {campaign_id!r} not found")
        return campaign

    async def create(self, campaign: Campaign) -> tuple[Campaign, bool]:
        """Register a running campaign; the same registration again is a no-op."""
        created = await self.repo.campaign_insert(campaign, self.clock.now())
        existing = await self.get(campaign.campaign_id)
        if not created and not existing.same_registration(campaign):
            raise AlreadyExists(
                f"campaign {campaign.campaign_id!r} already exists with a different "
                "series, line, period, configuration or analysis model"
            )
        if created:
            log.info(
                "campaign registered",
                campaign_id=campaign.campaign_id,
                series=campaign.series,
                line=campaign.line.value,
                period=campaign.period,
            )
        return existing, created

    async def record_runs(self, campaign_id: str, runs: list[RunResult]) -> tuple[int, int]:
        """Store run results of a running campaign; ``(recorded, duplicates)``."""
        campaign = await self.get(campaign_id)
        if campaign.is_terminal:
            if await self.repo.runs_known([r.run_id for r in runs]) == len(
                {r.run_id for r in runs}
            ):
                return 0, len(runs)  # a redelivered batch: all already stored
            raise FailedPrecondition(
                f"campaign {campaign_id!r} is {campaign.status.value}; run results are "
                "accepted only while it is running"
            )
        recorded = await self.repo.runs_insert(campaign_id, runs, self.clock.now())
        return recorded, len(runs) - recorded

    async def complete(self, campaign_id: str, status: CampaignStatus) -> Campaign:
        """running -> ``status``; repeating the same completion is a no-op."""
        if await self.repo.campaign_complete_if_running(campaign_id, status, self.clock.now()):
            campaign = await self.get(campaign_id)
            log.info(
                "campaign finished",
                campaign_id=campaign_id,
                status=status.value,
                runs=campaign.run_count,
            )
            self.jobs.on_campaign_completed(campaign)
            return campaign
        campaign = await self.get(campaign_id)
        if campaign.status != status:
            raise FailedPrecondition(f"campaign {campaign_id!r} is already {campaign.status.value}")
        return campaign

    def require_registered_model(self, model: str | None) -> None:
        """``InvalidArgument`` when ``model`` is named but not registered ("" / None: the default)."""
        if model and self.models.get(model) is None:
            raise InvalidArgument(
                "analysis_model",
                f"{model!r} is not registered (registered: {', '.join(self.models.names())})",
            )

    async def assign_analysis_model(self, campaign_id: str, model: str) -> Campaign:
        self.require_registered_model(model)
        if not await self.repo.campaign_set_analysis_model(
            campaign_id, model or None, self.clock.now()
        ):
            raise NotFound(f"campaign {campaign_id!r} not found")
        return await self.get(campaign_id)
