"""Runs the pool-worker as a child of the pool service (local driver, ``DISPO_POOL_SPAWN_WORKER``).

The child is a separate process (killing it is a driver crash the pool recovers from: it is
restarted and its busy crons resume); it is asked to die with its parent, so a killed pool
service leaves no worker behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys

from dispo.libs.logging import get_logger
from dispo.libs.process import parent_death_hook

log = get_logger(__name__)

RESTART_DELAY = 1.0


class WorkerSupervisor:
    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        while not self._stopping.is_set():
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "dispo.pool.worker",
                env={**os.environ, **self.env},
                preexec_fn=parent_death_hook(signal.SIGTERM),
            )
            self.starts += 1
            log.info("pool worker started", pid=self.process.pid, starts=self.starts)
            code = await self.process.wait()
            if self._stopping.is_set():
                break
            log.warning("pool worker exited; restarting", code=code)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), RESTART_DELAY)

    async def stop(self) -> None:
        self._stopping.set()
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
