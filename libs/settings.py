"""Settings read from ``DISPO_*`` environment variables, with defaults for one machine.

Every process reads :class:`CommonSettings` (where PostgreSQL and NATS are). Each service
adds its own class with the prefix ``DISPO_<SERVICE>_`` built with :func:`service_settings_config`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# Default gRPC ports of the five services on one machine.
DEFAULT_PORTS = {
    "gateway": 50051,
    "executor": 50052,
    "reconciler": 50053,
    "intelligence": 50054,
    "pool": 50055,
}


def service_settings_config(service: str) -> SettingsConfigDict:
    """Config for a service's own settings class: env prefix ``DISPO_<SERVICE>_``."""
    return SettingsConfigDict(env_prefix=f"DISPO_{service.upper()}_", extra="ignore")


class CommonSettings(BaseSettings):
    """What every Dispo process needs to reach the shared infrastructure."""

    model_config = SettingsConfigDict(env_prefix="DISPO_", extra="ignore")

    # SQLAlchemy URL (``postgresql+asyncpg://…``); a plain ``postgresql://`` URL also works.
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    # Comma-separated NATS server URLs (several for a cluster).
    nats_url: str = "nats://127.0.0.1:4222"
    # JetStream stream replicas: 1 on one machine, 3 on a three-node cluster.
    stream_replicas: int = 1
    # ``json`` for services, ``console`` for people at a terminal.
    log_format: Literal["json", "console"] = "json"
    log_level: str = "INFO"
    # ``system`` or ``file:<path>`` (a clock driven by a file, for tests of real processes).
    clock: str = "system"
    # Seconds a sent outbox row is kept before the service's outbox relay deletes it (the
    # stream keeps the event); a day by default.
    outbox_retention_seconds: float = Field(default=86400.0, gt=0)

    @property
    def outbox_retention(self) -> timedelta:
        return timedelta(seconds=self.outbox_retention_seconds)

    @property
    def nats_servers(self) -> list[str]:
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]


class ServerSettings(BaseSettings):
    """Where a service's gRPC server listens; subclass per service with its own prefix."""

    host: str = "127.0.0.1"
    port: int = 0
    # Seconds a stopping server lets in-flight calls finish.
    shutdown_grace: float = 5.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def server_settings(service: str) -> ServerSettings:
    """The listen settings of ``service`` (``DISPO_<SERVICE>_HOST`` / ``_PORT`` / ``_SHUTDOWN_GRACE``)."""

    class _Settings(ServerSettings):
        model_config = service_settings_config(service)

    defaults = _Settings()
    if defaults.port == 0:
        defaults.port = DEFAULT_PORTS[service]
    return defaults
