"""Runs service processes: starts them, waits until SERVING, restarts crashes, stops in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from dispo.libs.logging import get_logger
from dispo.libs.stack.process import ManagedProcess, ProcessSpec, python_module

__all__ = ["ProcessSpec", "Supervised", "Supervisor", "python_module"]

log = get_logger(__name__)


@dataclass
class Supervised:
    spec: ProcessSpec
    process: ManagedProcess = field(init=False)
    restarts: int = 0
    history: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.process = ManagedProcess(self.spec)


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
            self._spawn(child)
        await asyncio.gather(*(c.process.wait_ready(timeout) for c in self.children.values()))

    def _spawn(self, child: Supervised) -> None:
        child.process.spawn()
        log.info("started", service=child.spec.name, pid=child.process.pid)

    def pid(self, name: str) -> int | None:
        return self.children[name].process.pid

    async def watch(self) -> None:
        """Restart any child that exits, with growing back-off, until :meth:`stop_all`."""
        await asyncio.gather(*(self._watch_one(c) for c in self.children.values()))

    async def _watch_one(self, child: Supervised) -> None:
        while not self._stopping:
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
                self._spawn(child)
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
            if not process.running():
                continue
            await process.stop(timeout)
            log.info("stopped", service=name)
