"""The evaluation feed: registrations, run results and completions, from gRPC or events.

Completing an evaluation hands it to the automatic trigger (``IntelligenceJobs``).
"""

from __future__ import annotations

from dispo.intelligence import store
from dispo.intelligence.analysis_models import ModelRegistry
from dispo.intelligence.evaluations import Evaluation, EvaluationRecordStatus, RunResult
from dispo.intelligence.runtime import IntelligenceJobs
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    repeated_differently,
)
from dispo.libs.logging import get_logger

log = get_logger(__name__)


class EvaluationFeed:
    def __init__(
        self,
        db: Database,
        models: ModelRegistry,
        clock: Clock,
        jobs: IntelligenceJobs,
    ) -> None:
        self.db = db
        self.models = models
        self.clock = clock
        self.jobs = jobs

    async def get(self, evaluation_id: str) -> Evaluation:
        async with self.db.connection() as conn:
            evaluation = await store.evaluation_get(conn, evaluation_id)
        if evaluation is None:
            raise NotFound(f"evaluation {evaluation_id!r} not found")
        return evaluation

    async def create(self, evaluation: Evaluation) -> tuple[Evaluation, bool]:
        """Register a running evaluation; the same registration again is a no-op."""
        async with self.db.connection() as conn:
            created = await store.evaluation_insert(conn, evaluation, self.clock.now())
        existing = await self.get(evaluation.evaluation_id)
        differing = None if created else existing.differing_field(evaluation)
        if differing is not None:
            raise repeated_differently(f"evaluation {evaluation.evaluation_id!r}", differing)
        if created:
            log.info(
                "evaluation registered",
                evaluation_id=evaluation.evaluation_id,
                series=evaluation.series,
                line=evaluation.line.value,
                period=evaluation.period,
            )
        return existing, created

    async def record_runs(self, evaluation_id: str, runs: list[RunResult]) -> tuple[int, int]:
        """Store run results of a running evaluation; ``(recorded, duplicates)``."""
        evaluation = await self.get(evaluation_id)
        async with self.db.connection() as conn:
            if evaluation.is_terminal:
                if await store.runs_known(conn, [r.run_id for r in runs]) == len(
                    {r.run_id for r in runs}
                ):
                    return 0, len(runs)  # a redelivered batch: all already stored
                raise FailedPrecondition(
                    f"evaluation {evaluation_id!r} is {evaluation.status.value}; run results"
                    " are accepted only while it is running"
                )
            recorded = await store.runs_insert(conn, evaluation_id, runs, self.clock.now())
        return recorded, len(runs) - recorded

    async def complete(self, evaluation_id: str, status: EvaluationRecordStatus) -> Evaluation:
        """running -> ``status``; repeating the same completion is a no-op."""
        async with self.db.connection() as conn:
            completed = await store.evaluation_complete_if_running(
                conn, evaluation_id, status, self.clock.now()
            )
        if completed:
            evaluation = await self.get(evaluation_id)
            log.info(
                "evaluation finished",
                evaluation_id=evaluation_id,
                status=status.value,
                runs=evaluation.run_count,
            )
            self.jobs.on_evaluation_completed(evaluation)
            return evaluation
        evaluation = await self.get(evaluation_id)
        if evaluation.status != status:
            raise FailedPrecondition(
                f"evaluation {evaluation_id!r} is already {evaluation.status.value}"
            )
        return evaluation

    def require_registered_model(self, model: str | None) -> None:
        """``InvalidArgument`` when ``model`` is named but not registered ("" / None: the default)."""
        if model and self.models.get(model) is None:
            raise InvalidArgument(
                "analysis_model",
                f"{model!r} is not registered (registered: {', '.join(self.models.names())})",
            )

    async def assign_analysis_model(self, evaluation_id: str, model: str) -> Evaluation:
        self.require_registered_model(model)
        async with self.db.connection() as conn:
            assigned = await store.evaluation_set_analysis_model(
                conn, evaluation_id, model or None, self.clock.now()
            )
        if not assigned:
            raise NotFound(f"evaluation {evaluation_id!r} not found")
        return await self.get(evaluation_id)
