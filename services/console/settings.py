"""The web console's settings (``DISPO_CONSOLE_*``)."""

from __future__ import annotations

from dispo.libs.settings import DEFAULT_CONSOLE_PORT, local_address, service_settings_config
from pydantic import Field
from pydantic_settings import BaseSettings


class ConsoleSettings(BaseSettings):
    """The web console (``dispo.console``, ``DISPO_CONSOLE_*``): where it listens, where the
    services it calls are."""

    model_config = service_settings_config("console")

    host: str = Field(
        default="127.0.0.1", description="Address the web console's HTTP server binds"
    )
    port: int = Field(
        default=DEFAULT_CONSOLE_PORT,
        ge=0,
        description="Port of the web console (`dispo up` starts it there; `--console-port 0`:"
        " not at all)",
    )
    gateway_address: str = Field(
        default=local_address("gateway"), description="The gateway's gRPC address, for the console"
    )
    reconciler_address: str = Field(
        default=local_address("reconciler"),
        description="The reconciler's gRPC address, for the console",
    )
    executor_address: str = Field(
        default=local_address("executor"),
        description="The executor's gRPC address, for the console (downstreams' breakers)",
    )
    pool_address: str = Field(
        default=local_address("pool"),
        description="The pool's gRPC address, for the console (the Cron pool page)",
    )
    intelligence_address: str = Field(
        default=local_address("intelligence"),
        description="The intelligence service's gRPC address, for the console (the Intelligence page)",
    )
    refresh_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often the console's pages are sent fresh figures (server-sent events)",
    )
    origin: str = Field(
        default="",
        description="The console's address as browsers reach it (`scheme://host[:port]`, say"
        " behind a reverse proxy); a request naming another `Host` is refused (421). Empty:"
        " the address it binds (a loopback one also as `localhost`)",
    )
