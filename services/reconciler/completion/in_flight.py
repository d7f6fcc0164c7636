"""Callback deliveries under way: each its own task, ending on its own deadline, none
waiting for another. The notify sweep asks :meth:`InFlight.room` how many more it may
claim and :meth:`InFlight.by_business` how many each business holds, so one business's
slow receivers hold at most their share of the slots and the others' callbacks go out
beside them (docs/adr/0073)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from dispo.libs.logging import get_logger

log = get_logger(__name__)


@dataclass
class InFlight:
    # task id -> (business, the delivery's task)
    _running: dict[str, tuple[str, asyncio.Task[None]]] = field(default_factory=dict)
    # The last claim filled every slot it had: more may be due, so a slot freed asks for
    # another pass (``on_free``) rather than waiting for the sweep's interval.
    backlog: bool = False
    on_free: Callable[[], None] = lambda: None

    def __len__(self) -> int:
        return len(self._running)

    def room(self, limit: int) -> int:
        """How many more may start under a limit of ``limit`` at once."""
        return max(0, limit - len(self._running))

    def by_business(self) -> dict[str, int]:
        return dict(Counter(business for business, _ in self._running.values()))

    def start(self, task_id: str, business: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (one delivery, recording its own outcome) as a task of its own."""
        task = asyncio.create_task(self._run(task_id, work), name=f"callback {task_id}")
        self._running[task_id] = (business, task)

    async def _run(self, task_id: str, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception:  # the claim's lease ends and the delivery is tried again
            log.exception("callback delivery failed", task_id=task_id)
        finally:
            # The slot is free before the next pass looks (not in a done-callback, which
            # would run after the pass this wakes).
            self._running.pop(task_id, None)
            if self.backlog:
                self.on_free()

    async def drain(self) -> None:
        """Wait until every delivery under way has ended."""
        while self._running:
            await asyncio.wait([task for _, task in self._running.values()])

    async def run(self) -> None:
        """A part of the service: when it is cancelled (the service stops), the deliveries
        under way stop with it."""
        try:
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop every delivery under way (its claim's lease ends; another pass, here or in a
        replica, sends it again) and wait for them."""
        tasks = [task for _, task in self._running.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
