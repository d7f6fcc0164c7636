"""Runs service processes: starts them, waits until SERVING, restarts crashes, stops in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from dispo.libs.health import wait_until_serving
from dispo.libs.logging import get_logger

log = get_logger(__name__)


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    env: dict[str, str]
    # Where its gRPC health answers; None for a process without gRPC.
    address: str | None
    log_path: Path
    # An HTTP URL answering 200 once a process without gRPC is ready (None: ready when started).
    http_health: str | None = None


@dataclass
class Supervised:
    spec: ProcessSpec
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    history: list[int] = field(default_factory=list)


async def _wait_http_ok(url: str, timeout: float) -> None:
    async with httpx.AsyncClient(timeout=1.0) as client, asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.2)


def python_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


class Supervisor:
    def __init__(
        self,
        specs: list[ProcessSpec],
        *,
        max_backoff: float = 10.0,
        on_spawn: Callable[[], None] | None = None,
    ) -> None:
        self.children = {spec.name: Supervised(spec) for spec in specs}
        self.max_backoff = max_backoff
        # Called after a restart, e.g. to record the new pid.
        self.on_spawn = on_spawn
        self._stopping = False

    async def start_all(self, timeout: float = 120.0) -> None:
        for child in self.children.values():
            await self._spawn(child)
        await asyncio.gather(*(self._ready(c, timeout) for c in self.children.values()))

    async def _spawn(self, child: Supervised) -> None:
        spec = child.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(spec.log_path, "ab") as out:
            child.process = await asyncio.create_subprocess_exec(
                *spec.argv,
                env={**os.environ, **spec.env},
                stdout=out,
                stderr=out,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        log.info("started", service=spec.name, pid=child.process.pid)

    async def _ready(self, child: Supervised, timeout: float) -> None:
        if child.spec.address is not None:
            await wait_until_serving(child.spec.address, timeout)
        elif child.spec.http_health is not None:
            await _wait_http_ok(child.spec.http_health, timeout)

    def pid(self, name: str) -> int | None:
        process = self.children[name].process
        return process.pid if process is not None else None

    async def watch(self) -> None:
        """Restart any child that exits, with growing back-off, until :meth:`stop_all`."""
        await asyncio.gather(*(self._watch_one(c) for c in self.children.values()))

    async def _watch_one(self, child: Supervised) -> None:
        while not self._stopping:
            assert child.process is not None
            code = await child.process.wait()
            if self._stopping:
                return
            child.history.append(code)
            child.restarts += 1
            delay = min(self.max_backoff, 0.5 * 2 ** min(child.restarts - 1, 5))
            log.warning(
                "exited; restarting",
                service=child.spec.name,
                code=code,
                restarts=child.restarts,
                delay=delay,
            )
            await asyncio.sleep(delay)
            if not self._stopping:
                await self._spawn(child)
                if self.on_spawn is not None:
                    self.on_spawn()

    async def stop_all(self, order: list[str], timeout: float = 20.0) -> None:
        """SIGTERM each child in ``order`` (others after), waiting for each to exit."""
        self._stopping = True
        names = [n for n in order if n in self.children] + [
            n for n in self.children if n not in order
        ]
        for name in names:
            process = self.children[name].process
            if process is None or process.returncode is not None:
                continue
            with contextlib.suppress(ProcessLookupError):  # exited on its own meanwhile
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), timeout)
            except TimeoutError:
                log.warning("did not stop in time; killing", service=name)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            log.info("stopped", service=name)
