"""The pool's own settings (``DISPO_POOL_*``), with the seed's thresholds as defaults (held
once, by :class:`~dispo.pool.domain.PoolPolicy`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from dispo.libs.settings import DEFAULT_PORTS, CommonSettings, service_settings_config
from dispo.pool.domain import PoolPolicy
from dispo.pool.openclaw import VERSION as OPENCLAW_VERSION
from pydantic import Field
from pydantic_settings import BaseSettings


def default_registry() -> Path:
    """Beside the stack's data (``DISPO_DATA_DIR``), shared by pool and worker."""
    return Path(CommonSettings().data_dir) / "pool" / "local-crons.sqlite"


class PoolSettings(BaseSettings):
    model_config = service_settings_config("pool")

    driver: Literal["local", "openclaw"] = Field(
        default="local",
        description="Where crons run: `local` (the pool-worker process) or `openclaw` (its CLI)",
    )
    local_registry: Path = Field(
        default_factory=default_registry,
        description="local driver: the registry the pool-worker process watches (default:"
        " `pool/local-crons.sqlite` under `DISPO_DATA_DIR`)",
    )
    spawn_worker: bool = Field(
        default=False,
        description="local driver: run the pool-worker as a supervised child process (`dispo"
        " up` runs it as its own process; turn this on to run the pool service alone)",
    )
    openclaw_path: str = Field(
        default="",
        description="openclaw driver: the `openclaw` CLI to run (default: OpenClaw "
        f"{OPENCLAW_VERSION} installed on demand under `DISPO_CACHE_DIR`)",
    )
    openclaw_url: str = Field(
        default="", description="openclaw driver: the gateway's WebSocket URL (else the port)"
    )
    openclaw_port: int = Field(
        default=18789, description="openclaw driver: the local gateway's port (without a URL)"
    )
    openclaw_token: str = Field(default="", description="openclaw driver: the gateway's token")
    openclaw_home: Path = Field(
        default_factory=lambda: Path(CommonSettings().data_dir) / "openclaw" / "home",
        description="openclaw driver: `HOME` of the CLI calls (default: `openclaw/home` under"
        " `DISPO_DATA_DIR`)",
    )
    openclaw_namespace: str = Field(
        default="default",
        description="openclaw driver: this pool's part of the automations' declaration keys"
        " (`dispo-pool:<namespace>:<cron>`); pools sharing a gateway need different ones",
    )
    openclaw_wake_address: str = Field(
        default="",
        description="openclaw driver: the pool address an automation's command calls"
        " (default: this service's own)",
    )
    openclaw_payload: Literal["command", "agent"] = Field(
        default="command",
        description="openclaw driver: what an automation runs: `command` (the wake command) or"
        " `agent` (a turn of the OpenClaw agent, on the model below, asked to run it)",
    )
    openclaw_model_base_url: str = Field(
        default="",
        description="openclaw driver, agent payload: the OpenAI-compatible endpoint of the"
        " agent's model (for example `http://127.0.0.1:4000/v1`)",
    )
    openclaw_model_name: str = Field(
        default="", description="openclaw driver, agent payload: the model's name at that endpoint"
    )
    openclaw_model_api_key: str = Field(
        default="", description="openclaw driver, agent payload: the endpoint's API key"
    )
    openclaw_timeout_seconds: float = Field(
        default=90.0, description="openclaw driver: how long one CLI call may take"
    )

    intelligence_address: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['intelligence']}",
        description="The intelligence service's gRPC address: CreateEvaluation asks it which"
        " analysis models an evaluation may name",
    )

    min_size: int = Field(default=PoolPolicy.min_size, description="Fewest crons the pool keeps")
    max_size: int = Field(default=PoolPolicy.max_size, description="Most crons the pool runs")
    scale_up_ratio: float = Field(
        default=PoolPolicy.scale_up_ratio, description="Scale up when busy/total crons exceed this"
    )
    scale_down_idle_factor: float = Field(
        default=PoolPolicy.scale_down_idle_factor,
        description="Scale down when idle crons exceed this × the minimum size",
    )
    tick_seconds: float = Field(default=PoolPolicy.tick_seconds, description="Cron wake interval")
    stuck_seconds: float = Field(
        default=PoolPolicy.stuck_seconds,
        description="A cron without activity this long is stuck and its evaluation reassigned",
    )
    hold_seconds: float = Field(
        default=PoolPolicy.hold_seconds,
        description="An evaluation holding a cron this long is force-released",
    )
    runs_per_wake: int = Field(
        default=PoolPolicy.runs_per_wake, description="Runs a cron performs per wake at most"
    )
    max_runs_per_evaluation: int = Field(
        default=PoolPolicy.max_runs_per_evaluation,
        ge=1,
        description="Most runs one evaluation may ask for (slot_count × runs_per_slot)",
    )
    max_runs_per_second: float = Field(
        default=PoolPolicy.max_runs_per_second,
        gt=0,
        description="Most runs a second one evaluation may ask for over its window"
        " (runs ÷ window_seconds)",
    )
    sweep_seconds: float = Field(
        default=30.0,
        description="How often (clock time) the pool runs its stuck, hold and scale sweeps",
    )
    sweep_batch: int = Field(default=100, description="Rows per sweep pass")
    driver_concurrency: int = Field(
        default=4,
        ge=1,
        description="Driver calls the sweeps' cron creations and removals make at once (they run"
        " beside the sweeps, which never wait for them)",
    )
    driver_call_seconds: float = Field(
        default=180.0,
        gt=0,
        description="How long one such creation or removal may take in all before it is"
        " abandoned (the drift check repairs what it missed)",
    )

    def policy(self) -> PoolPolicy:
        return PoolPolicy(
            min_size=self.min_size,
            max_size=self.max_size,
            scale_up_ratio=self.scale_up_ratio,
            scale_down_idle_factor=self.scale_down_idle_factor,
            tick_seconds=self.tick_seconds,
            stuck_seconds=self.stuck_seconds,
            hold_seconds=self.hold_seconds,
            runs_per_wake=self.runs_per_wake,
            max_runs_per_evaluation=self.max_runs_per_evaluation,
            max_runs_per_second=self.max_runs_per_second,
        )


class WorkerSettings(BaseSettings):
    """The pool-worker process (``DISPO_POOL_WORKER_*``): local driver crons."""

    model_config = service_settings_config("pool_worker")

    pool_address: str = Field(
        default=f"127.0.0.1:{DEFAULT_PORTS['pool']}",
        description="The pool's gRPC address the worker reports to",
    )
    local_registry: Path = Field(
        default_factory=default_registry,
        description="The registry of local crons (the pool's `DISPO_POOL_LOCAL_REGISTRY`)",
    )
    tick_seconds: float = Field(
        default=PoolPolicy.tick_seconds, description="Cron wake interval (the pool's tick)"
    )
    http_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How long one run's HTTP call to an evaluation target may take in all"
        " (connecting, sending, reading the whole answer): its deadline",
    )
