"""Caller notification: POST the finished task to its ``callback_url``.

"Task finished" and "caller notified" are separate recorded facts (``finished_at`` /
``notified_at``): a callback that fails is retried with backoff up to ``max_attempts``,
then given up visibly (``notify_error``), and never changes the task's status.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from dispo.gateway import repository as repo
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.clock import Clock
from dispo.libs.logging import get_logger

log = get_logger(__name__)
ERROR_LIMIT = 500


@dataclass
class NotifyPolicy:
    max_attempts: int = 8
    base_delay: float = 2.0
    max_delay: float = 600.0
    timeout: float = 5.0
    batch: int = 50

    def delay(self, attempts: int) -> float:
        return min(self.max_delay, self.base_delay * 2 ** max(0, attempts - 1))


def callback_body(record: repo.TaskRecord) -> dict:
    return {
        "task_id": record.task_id,
        "business": record.business,
        "status": record.status,
        "finished_at": record.finished_at.isoformat() if record.finished_at else None,
        "nodes": {n.node_id: common_pb2.NodeStatus.Name(n.status).removeprefix("NODE_STATUS_")
                  for n in record.view.nodes},
        "status_reason": record.view.status_reason,
    }


class Notifier:
    def __init__(self, engine: AsyncEngine, clock: Clock, http: httpx.AsyncClient, policy: NotifyPolicy,
                 interval: float = 1.0) -> None:
        self.engine = engine
        self.clock = clock
        self.http = http
        self.policy = policy
        self.interval = interval
        self._stopping = asyncio.Event()

    async def sweep_once(self) -> int:
        """Deliver the callbacks due now (one batch); returns how many were attempted."""
        now = self.clock.now()
        async with self.engine.begin() as conn:
            due = await repo.tasks_due_for_callback(conn, now, self.policy.batch)
            results = await asyncio.gather(*(self._post(record) for record in due))
            for record, error in zip(due, results):
                if error is None:
                    await repo.task_mark_notified_if_pending(conn, record.task_id, self.clock.now())
                    log.info("caller notified", task_id=record.task_id)
                    continue
                attempts = record.notify_attempts + 1
                next_at = (now + timedelta(seconds=self.policy.delay(attempts))
                           if attempts < self.policy.max_attempts else None)
                await repo.task_notify_failed_if_pending(conn, record.task_id, error[:ERROR_LIMIT], next_at)
                log.warning("callback failed", task_id=record.task_id, attempts=attempts, error=error,
                            gave_up=next_at is None)
        return len(due)

    async def _post(self, record: repo.TaskRecord) -> str | None:
        try:
            response = await self.http.post(record.callback_url, json=callback_body(record),
                                            headers={"Idempotency-Key": f"{record.task_id}/callback"},
                                            timeout=self.policy.timeout)
        except (httpx.HTTPError, OSError) as error:
            return f"callback error: {error!r}"
        if 200 <= response.status_code < 300:
            return None
        return f"callback HTTP {response.status_code}: {response.text}"

    async def run(self) -> None:
        while not self._stopping.is_set():
            try:
                attempted = await self.sweep_once()
            except Exception as error:
                log.warning("notifier sweep failed", error=repr(error))
                attempted = 0
            if attempted < self.policy.batch:
                try:
                    await asyncio.wait_for(self._stopping.wait(), self.interval)
                except TimeoutError:
                    pass

    def stop(self) -> None:
        self._stopping.set()
