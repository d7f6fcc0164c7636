"""In-process task handles. Holds no job state: the DB row is the authority (ADR 0001).

``start`` is idempotent per key while a task runs; ``close`` refuses new starts, lets
running tasks finish for a grace period, then cancels the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

from dispo.libs.logging import get_logger

log = get_logger(__name__)


class TaskRegistry:
    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: dict[Hashable, asyncio.Task[Any]] = {}
        self._closed = False

    def running(self) -> list[Hashable]:
        return [key for key, task in self._tasks.items() if not task.done()]

    def start(
        self, key: Hashable, factory: Callable[[], Awaitable[Any]]
    ) -> asyncio.Task[Any] | None:
        """Run ``factory()`` as a task unless one for ``key`` is running or the registry is closed."""
        if self._closed:
            log.info("registry closed; not starting", registry=self.name, key=str(key))
            return None
        current = self._tasks.get(key)
        if current is not None and not current.done():
            return current
        task = asyncio.create_task(self._run(key, factory), name=f"{self.name}:{key}")
        self._tasks[key] = task
        return task

    async def _run(self, key: Hashable, factory: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await factory()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("task failed", registry=self.name, key=str(key))
            return None
        finally:
            if self._tasks.get(key) is asyncio.current_task():
                del self._tasks[key]

    async def wait_idle(self) -> None:
        """Wait until no task runs (tasks started meanwhile included)."""
        while tasks := [t for t in self._tasks.values() if not t.done()]:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self, grace: float = 5.0) -> None:
        self._closed = True
        tasks = [t for t in self._tasks.values() if not t.done()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
            log.info("registry cancelled tasks", registry=self.name, count=len(pending))
