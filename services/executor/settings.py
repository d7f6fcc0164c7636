"""The executor's own settings (``DISPO_EXECUTOR_*``)."""

from __future__ import annotations

from dispo.libs.settings import service_settings_config
from pydantic_settings import BaseSettings


class ExecutorSettings(BaseSettings):
    model_config = service_settings_config("executor")

    # Durable consumer name shared by all replicas (they split the work).
    durable: str = "executor"
    # Seconds a pass holds a task's lease without a heartbeat; a crashed executor's tasks
    # are taken over after this.
    lease_ttl: float = 10.0
    # JetStream ack wait: an unacknowledged message comes back after this.
    ack_wait: float = 30.0
    batch: int = 64
    max_retries: int = 3
    retry_base_delay: float = 0.5
    retry_max_delay: float = 30.0
    breaker_threshold: int = 5
    breaker_window: float = 30.0
    breaker_cooldown: float = 30.0
    # Seconds between downstream health checks (0 disables them).
    health_interval: float = 5.0
    # host:port to also serve the demo downstream in this process (empty: don't).
    demo_downstream: str = ""
