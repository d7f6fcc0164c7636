"""The gateway's own settings (``DISPO_GATEWAY_*``)."""

from __future__ import annotations

from dispo.libs.settings import service_settings_config
from pydantic_settings import BaseSettings


class GatewaySettings(BaseSettings):
    model_config = service_settings_config("gateway")

    max_cells: int = 50
    max_nodes: int = 200
    max_payload_bytes: int = 64 * 1024
    # Durable consumer of task.status.> (replicas share it).
    status_durable: str = "gateway-status"
    # WatchTask re-reads the task at least this often (changes applied by another replica).
    watch_poll_interval: float = 0.5
    # Largest ListTasks page.
    max_page_size: int = 500
