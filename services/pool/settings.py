"""The pool's own settings (``DISPO_POOL_*``), with the seed's thresholds as defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from dispo.libs.settings import service_settings_config
from dispo.pool.domain import PoolPolicy
from pydantic import Field
from pydantic_settings import BaseSettings


def default_registry() -> Path:
    """Beside the stack's data (``$DISPO_DATA_DIR``, else ``.dispo``), shared by pool and worker."""
    return Path(os.environ.get("DISPO_DATA_DIR") or ".dispo") / "pool" / "local-crons.sqlite"


class PoolSettings(BaseSettings):
    model_config = service_settings_config("pool")

    driver: Literal["local", "openclaw"] = "local"
    # local driver: the registry the pool-worker process watches.
    local_registry: Path = Field(default_factory=default_registry)
    # local driver: run the pool-worker as a supervised child process (restarted when it
    # exits, ended when the pool service ends). Off by default: `dispo up` runs the worker
    # as its own supervised process; turn it on to run the pool service alone.
    spawn_worker: bool = False
    # openclaw driver: the CLI to run.
    openclaw_path: str = "openclaw"

    min_size: int = 5
    max_size: int = 20
    scale_up_ratio: float = 0.8
    scale_down_idle_factor: float = 2.0
    tick_seconds: float = 60.0
    stuck_seconds: float = 600.0
    hold_seconds: float = 7200.0
    reconcile_seconds: float = 300.0
    runs_per_wake: int = 50
    # How often (clock seconds) the pool service runs its stuck / hold / scale sweeps.
    sweep_seconds: float = 30.0
    # Rows per sweep pass.
    sweep_batch: int = 100

    def policy(self) -> PoolPolicy:
        return PoolPolicy(
            min_size=self.min_size,
            max_size=self.max_size,
            scale_up_ratio=self.scale_up_ratio,
            scale_down_idle_factor=self.scale_down_idle_factor,
            tick_seconds=self.tick_seconds,
            stuck_seconds=self.stuck_seconds,
            hold_seconds=self.hold_seconds,
            reconcile_seconds=self.reconcile_seconds,
            runs_per_wake=self.runs_per_wake,
        )


class WorkerSettings(BaseSettings):
    """The pool-worker process (``DISPO_POOL_WORKER_*``): local driver crons."""

    model_config = service_settings_config("pool_worker")

    pool_address: str = "127.0.0.1:50055"
    local_registry: Path = Field(default_factory=default_registry)
    tick_seconds: float = 60.0
    # Seconds an HTTP call to an evaluation target may take.
    http_timeout: float = 30.0
