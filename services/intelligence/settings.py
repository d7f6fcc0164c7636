"""Settings of the intelligence service (``DISPO_INTELLIGENCE_*``)."""

from __future__ import annotations

from dispo.intelligence.models import STATS_MODEL, ChatModelConfig
from dispo.libs.settings import service_settings_config
from pydantic_settings import BaseSettings


class IntelligenceSettings(BaseSettings):
    model_config = service_settings_config("intelligence")

    # Analysis model of evaluations without an override; "" = none (then only overrides resolve).
    default_analysis_model: str = STATS_MODEL
    # OpenAI-compatible chat-completions models, as a JSON list:
    # [{"name": "gpt", "base_url": "http://127.0.0.1:8080/v1", "model": "gpt-4o-mini", "api_key": "…"}]
    models: list[ChatModelConfig] = []
    # Consume the cron pool's EVALUATIONS stream into the evaluation read model.
    consume_events: bool = True
    event_durable: str = "intelligence-evaluations"
    # Redelivery delay for an event about an evaluation not registered yet.
    unknown_evaluation_retry_seconds: float = 2.0
    # ... and after this many deliveries it is given up (logged), so it cannot hold up the stream.
    unknown_evaluation_max_deliveries: int = 30
    # Periodic recovery and lost-trigger sweeps.
    sweep_interval_seconds: float = 60.0
    queued_idle_seconds: float = 300.0
    generating_stale_seconds: float = 900.0
    sweep_batch: int = 100
    # How long a stopping service lets running jobs finish before handing them back.
    jobs_shutdown_grace_seconds: float = 10.0
