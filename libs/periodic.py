"""A periodic part: one action run every ``interval`` seconds of an injectable clock.

Every background loop of a service (sweeps, drift checks, health checks, the pool's
wake-ups) is one :class:`Periodic`, added to the runtime with
:meth:`dispo.libs.service.Runtime.add_periodic`::

    rt.add_periodic("drift checks", checker.check_once, settings.interval_seconds)

A pass that raises is logged and the next pass runs after the usual interval: a database
or bus that is down is tried again later, it never stops the part. The action may return
:class:`Pause` to choose the wait before the next pass (``Pause(0)``: at once, a backlog);
any other return value is ignored. :meth:`Periodic.kick` runs a pass now, or right after
the running one. Time is the clock's, so a test moves a :class:`~dispo.libs.clock.ManualClock`
or a file clock instead of sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from dispo.libs.clock import Clock, sleep_until_stopped
from dispo.libs.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Pause:
    """Returned by an action: wait ``seconds`` of the clock before the next pass."""

    seconds: float


class Periodic:
    """Runs ``action`` once per ``interval`` seconds of ``clock`` until :meth:`stop`.

    The first pass runs at once, or after one interval with ``first_after_interval``.
    """

    def __init__(
        self,
        name: str,
        action: Callable[[], Awaitable[Any]],
        interval: float,
        clock: Clock,
        *,
        first_after_interval: bool = False,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"{name}: interval must be positive, got {interval}")
        self.name = name
        self.action = action
        self.interval = interval
        self.clock = clock
        self.first_after_interval = first_after_interval
        self.passes = 0  # passes finished, failed ones included
        self._wake = asyncio.Event()  # a kick or the stop
        self._stopping = asyncio.Event()

    async def run(self) -> None:
        if self.first_after_interval and await self._pause(self.interval):
            return
        while not self._stopping.is_set():
            self._wake.clear()  # a kick from now on asks for one more pass
            pause = await self.run_once()
            if await self._pause(self.interval if pause is None else pause.seconds):
                return

    async def run_once(self) -> Pause | None:
        """One pass; its failure is logged, not raised."""
        try:
            result = await self.action()
        except Exception:
            log.exception("periodic pass failed; next pass after the interval", part=self.name)
            result = None
        finally:
            self.passes += 1
        return result if isinstance(result, Pause) else None

    def kick(self) -> None:
        """Run a pass now rather than at the end of the interval."""
        self._wake.set()

    def stop(self) -> None:
        """No further pass; a running one finishes (the runtime waits for it, then cancels)."""
        self._stopping.set()
        self._wake.set()

    async def _pause(self, seconds: float) -> bool:
        """Wait ``seconds`` of the clock, less when kicked or stopped; True when stopping."""
        if seconds > 0:
            await sleep_until_stopped(self.clock, seconds, self._wake)
        else:
            await asyncio.sleep(0)
        return self._stopping.is_set()


__all__ = ["Pause", "Periodic"]
