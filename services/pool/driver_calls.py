"""Driver calls the sweeps ask for, run beside them rather than inside their passes.

Creating or removing a cron in the driver can take seconds (an OpenClaw CLI call on a busy
machine, a dozen); a sweep that waited for them would push its next pass back by minutes
and let a silent cron go unnoticed. So a sweep commits its decision to the pool's database
(the authority) and hands the driver work to :class:`DriverCalls`: at most ``concurrency``
calls at once, each within its ``deadline``; a call that fails or overruns is logged and
left to the drift check, which compares the driver with the database and repairs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from dispo.libs.logging import get_logger

log = get_logger(__name__)


class DriverCalls:
    def __init__(self, concurrency: int = 4, deadline: float = 180.0) -> None:
        if concurrency < 1 or deadline <= 0:
            raise ValueError("driver calls need a concurrency >= 1 and a positive deadline")
        self.concurrency = concurrency
        self.deadline = deadline  # seconds one call may take, waiting for its turn excluded
        self._gate = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[BaseException | None]] = set()
        self._last: dict[str, asyncio.Task[BaseException | None]] = {}  # cron id -> newest call

    def submit(
        self, what: str, cron_id: str, call: Callable[[], Awaitable[object]]
    ) -> asyncio.Task[BaseException | None]:
        """Run ``call()`` in its turn, after the calls submitted before for the same cron;
        returns at once, with the task that ends with the call (its result: None, or what
        the call failed with — a ``TimeoutError`` past the deadline)."""
        before = self._last.get(cron_id)
        task = asyncio.create_task(
            self._run(what, cron_id, call, before), name=f"driver {what} {cron_id}"
        )
        self._tasks.add(task)
        self._last[cron_id] = task

        def done(finished: asyncio.Task[BaseException | None]) -> None:
            self._tasks.discard(finished)
            if self._last.get(cron_id) is finished:
                del self._last[cron_id]

        task.add_done_callback(done)
        return task

    @property
    def in_flight(self) -> int:
        """Calls submitted and not finished (running or waiting for their turn)."""
        return len(self._tasks)

    async def drain(self) -> None:
        """Until every call submitted so far (and any they submitted) has finished."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def aclose(self) -> None:
        """Abandon the calls still waiting or running (the service is stopping)."""
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(
        self,
        what: str,
        cron_id: str,
        call: Callable[[], Awaitable[object]],
        before: asyncio.Task[BaseException | None] | None,
    ) -> BaseException | None:
        if before is not None:
            await asyncio.wait([before])
        async with self._gate:
            try:
                async with asyncio.timeout(self.deadline):
                    await call()
            except TimeoutError as error:
                log.warning(
                    "driver call past its deadline; the drift check repairs what it missed",
                    call=what,
                    cron_id=cron_id,
                    deadline_seconds=self.deadline,
                )
                return error
            except Exception as error:
                log.warning("driver call failed", call=what, cron_id=cron_id, error=str(error))
                return error
        return None
