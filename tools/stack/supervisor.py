"""Runs the stack's processes: starts them, waits until ready, restarts any that dies (with
growing back-off, logged), stops them in order. A child that exits before it was ever ready
is not restarted: the start fails at once, naming it, how it ended and its log's end.

Its children die with it however it ends, a SIGKILL included: each is sent a parent-death
signal (SIGKILL unless its spec names another). The kernel sends it when the spawning
thread ends, so a supervisor runs in the thread of an event loop that lives as long as it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

from dispo.libs.logging import get_logger
from dispo.libs.process import (
    ExitedBeforeReady,
    ManagedProcess,
    ProcessSpec,
    python_module,
)

__all__ = ["ExitedBeforeReady", "ProcessSpec", "Supervised", "Supervisor", "python_module"]

log = get_logger(__name__)

# A child that ran this long before it exited restarts without delay again.
STABLE_SECONDS = 60.0


@dataclass
class Supervised:
    spec: ProcessSpec
    process: ManagedProcess = field(init=False)
    restarts: int = 0
    history: list[int] = field(default_factory=list)
    # Exits in a row, each soon after its start: what the back-off grows with.
    failures: int = 0

    def __post_init__(self) -> None:
        self.process = ManagedProcess(self.spec)


class Supervisor:
    def __init__(
        self,
        specs: list[ProcessSpec],
        *,
        max_backoff: float = 10.0,
        on_spawn: Callable[[], None] | None = None,
        parent_death_signal: int = signal.SIGKILL,
    ) -> None:
        self.children = {
            spec.name: Supervised(
                spec
                if spec.parent_death_signal is not None
                else dataclasses.replace(spec, parent_death_signal=parent_death_signal)
            )
            for spec in specs
        }
        self.max_backoff = max_backoff
        # Called after a restart, e.g. to record the new pid.
        self.on_spawn = on_spawn
        self._stopping = False

    async def start_all(self, timeout: float = 120.0) -> None:
        """Spawn every child and wait until all are ready. The first to fail fails the start
        (the others' waits end; :meth:`stop_all` stops them): one that exits first with
        :class:`ExitedBeforeReady`, one not ready in ``timeout`` with :class:`TimeoutError`."""
        for child in self.children.values():
            self._spawn(child)
        waits = [
            asyncio.ensure_future(c.process.wait_ready(timeout)) for c in self.children.values()
        ]
        if not waits:
            return
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for waiting in waits:
                waiting.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        for waiting in waits:
            if not waiting.cancelled() and (error := waiting.exception()) is not None:
                raise error

    def _spawn(self, child: Supervised) -> None:
        child.process.spawn()
        log.info("started", service=child.spec.name, pid=child.process.pid)

    def pid(self, name: str) -> int | None:
        return self.children[name].process.pid

    async def watch(self) -> None:
        """Restart any child that exits, with growing back-off, until :meth:`stop_all`."""
        await asyncio.gather(*(self._watch_one(c) for c in self.children.values()))

    async def _watch_one(self, child: Supervised) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        while not self._stopping:
            code = await child.process.wait()
            if self._stopping:
                return
            child.history.append(code)
            child.restarts += 1
            child.failures = 1 if loop.time() - started >= STABLE_SECONDS else child.failures + 1
            delay = min(self.max_backoff, 0.5 * 2 ** min(child.failures - 1, 5))
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
                started = loop.time()
                if self.on_spawn is not None:
                    self.on_spawn()

    async def stop_all(self, order: list[str], timeout: float = 20.0) -> list[str]:
        """Stop each child in ``order`` (others after), waiting for each to exit; a child
        that does not stop is killed, and one that fails to stop does not hold up the rest.

        Returns the names of those that failed to stop."""
        self._stopping = True
        names = [n for n in order if n in self.children] + [
            n for n in self.children if n not in order
        ]
        failed = []
        for name in names:
            process = self.children[name].process
            if not process.running():
                continue
            try:
                await process.stop(timeout)
            except Exception:
                log.exception("stop failed", service=name)
                failed.append(name)
                continue
            log.info("stopped", service=name)
        return failed
