"""Settings of the intelligence service (``DISPO_INTELLIGENCE_*``)."""

from __future__ import annotations

from datetime import timedelta

from dispo.intelligence.analysis_models import STATS_MODEL, ChatModelConfig
from dispo.intelligence.retries import RetryPolicy
from dispo.intelligence.runtime import RecoveryPolicy
from dispo.libs.settings import service_settings_config
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings


class IntelligenceSettings(BaseSettings):
    model_config = service_settings_config("intelligence")

    default_analysis_model: str = Field(
        default=STATS_MODEL,
        description="Analysis model of evaluations without an override; empty: none (then only"
        " overrides resolve)",
    )
    models: list[ChatModelConfig] = Field(
        default=[],
        description="OpenAI-compatible chat-completions models, as a JSON list of"
        ' `{"name", "base_url", "model", "api_key", "timeout_seconds", "temperature"}`',
    )
    consume_events: bool = Field(
        default=True,
        description="Consume the cron pool's EVALUATIONS stream into the evaluation read model;"
        " `false` leaves the events in the stream until its byte limit, then the pool's"
        " outbox holds them",
    )
    event_durable: str = Field(
        default="intelligence-evaluations",
        description="Durable consumer of the EVALUATIONS stream. The stream keeps each event"
        " until the declared `intelligence-evaluations` durable has acknowledged it: another"
        " name adds a consumer, it does not replace that one (ADR-0092)",
    )
    unknown_evaluation_retry_seconds: float = Field(
        default=2.0,
        description="Redelivery delay of an event that came before what it depends on (the"
        " evaluation's registration, or the runs its completion reports)",
    )
    unknown_evaluation_max_deliveries: int = Field(
        default=30,
        description="Deliveries after which such an event is given up to the quarantine (from"
        " where it can be replayed)",
    )
    sweep_interval_seconds: float = Field(
        default=60.0, description="Time between the periodic recovery and lost-trigger sweeps"
    )
    queued_idle_seconds: float = Field(
        default=RecoveryPolicy.queued_idle.total_seconds(),
        description="A queued job nobody claimed this long after it was queued is nobody's"
        " and is requeued",
    )
    generating_stale_seconds: float = Field(
        default=RecoveryPolicy.generating_stale.total_seconds(),
        description="A claimed job whose owner has not extended the claim (heartbeat) for"
        " this long lost its worker and is taken over",
    )
    heartbeat_seconds: float = Field(
        default=RecoveryPolicy.heartbeat.total_seconds(),
        gt=0,
        description="How often a replica extends the claim of each job it runs; must be"
        " below GENERATING_STALE_SECONDS",
    )
    sweep_batch: int = Field(default=RecoveryPolicy.batch, description="Rows per sweep")
    model_max_attempts: int = Field(
        default=RetryPolicy.max_attempts,
        ge=1,
        description="Calls to the analysis model per job, the first included: a transient"
        " failure (HTTP 408, 429, 500, 502, 503, 504, connection refused or reset, timeout) is"
        " retried until then",
    )
    model_retry_base_seconds: float = Field(
        default=RetryPolicy.base_seconds,
        gt=0,
        description="Wait after a job's first transient model failure; doubles per failure",
    )
    model_retry_max_seconds: float = Field(
        default=RetryPolicy.max_seconds,
        gt=0,
        description="Longest backoff between two calls to the model within one job",
    )
    model_retry_after_max_seconds: float = Field(
        default=RetryPolicy.retry_after_max_seconds,
        ge=0,
        description="Longest Retry-After a job honours; a model asking for more fails the job"
        " at once (trigger it again later)",
    )
    jobs_shutdown_grace_seconds: float = Field(
        default=10.0,
        description="How long a stopping service lets running jobs finish before handing them back",
    )

    @model_validator(mode="after")
    def _heartbeat_below_stale(self) -> IntelligenceSettings:
        if self.heartbeat_seconds >= self.generating_stale_seconds:
            raise ValueError(
                f"heartbeat_seconds ({self.heartbeat_seconds:g}) must be below "
                f"generating_stale_seconds ({self.generating_stale_seconds:g}), or live jobs"
                " would be taken over"
            )
        return self

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_attempts=self.model_max_attempts,
            base_seconds=self.model_retry_base_seconds,
            max_seconds=self.model_retry_max_seconds,
            retry_after_max_seconds=self.model_retry_after_max_seconds,
        )

    def recovery_policy(self) -> RecoveryPolicy:
        return RecoveryPolicy(
            queued_idle=timedelta(seconds=self.queued_idle_seconds),
            generating_stale=timedelta(seconds=self.generating_stale_seconds),
            batch=self.sweep_batch,
            heartbeat=timedelta(seconds=self.heartbeat_seconds),
        )
