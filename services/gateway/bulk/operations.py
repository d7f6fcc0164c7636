"""Bulk cancels (ADR-0112): CancelByFilter records an action and answers; the bulk pass
takes each RUNNING action's next batch of matching tasks, oldest first, at its rate on the
gateway's clock, and cancels them through CancelTask's path (:meth:`Gateway.cancel_in`), the
batch and the action's advance in one transaction."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from dispo.gateway import store
from dispo.gateway.bulk import store as bulk_store
from dispo.gateway.bulk.store import Advance, BulkActionRow
from dispo.gateway.convert import stored_status
from dispo.gateway.operations import Gateway
from dispo.gateway.store import TaskFilter
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.logging import get_logger

log = get_logger(__name__)

# The statuses a bulk cancel takes: the unfinished ones (stored names).
UNFINISHED = tuple(
    stored_status(v)
    for v in common_pb2.TaskStatus.values()
    if v != common_pb2.TASK_STATUS_UNSPECIFIED and stored_status(v) not in store.TERMINAL
)


def within_cutoff(matching: TaskFilter, now: datetime) -> TaskFilter:
    """``matching`` confined to tasks created before ``now``: a bulk action takes the tasks
    that existed when it was asked, never those submitted while it runs."""
    before = matching.created_before
    return replace(matching, created_before=now if before is None or before > now else before)


def budget(rate: float, started: datetime, now: datetime, processed: int, batch: int) -> int:
    """How many tasks an action may take now: its rate over the time since it was asked
    (plus one second's worth at once), less what it took, at most one batch."""
    elapsed = max(0.0, (now - started).total_seconds())
    return max(0, min(batch, math.floor(rate * (elapsed + 1.0)) - processed))


class BulkCancels:
    def __init__(
        self,
        gateway: Gateway,
        filter_of: Callable[[gateway_pb2.CancelByFilterRequest], TaskFilter],
        *,
        batch: int = 500,
        max_rate: float = 1000.0,
    ) -> None:
        self.gateway = gateway
        self.filter_of = filter_of
        self.batch = batch
        self.max_rate = max_rate

    async def matched(self, matching: TaskFilter, statuses: list[str]) -> int:
        counts = await self.gateway.counts(matching)
        return sum(n for status, n in counts.items() if status in statuses)

    async def start(
        self,
        request: gateway_pb2.CancelByFilterRequest,
        statuses: list[str],
        actor: str,
    ) -> tuple[int, BulkActionRow | None]:
        """Count the tasks ``request`` matches now; unless it is a dry run, record the action
        that will cancel them. ``request`` has its business as the caller may act for."""
        now = self.gateway.clock.now()
        matching = within_cutoff(self.filter_of(request), now)
        matched = await self.matched(matching, statuses)
        if request.dry_run:
            return matched, None
        assert matching.created_before is not None
        row = BulkActionRow(
            action_id=uuid.uuid4().hex,
            kind="cancel",
            business=request.filter.business,
            actor=actor,
            reason=request.reason,
            request=request.SerializeToString(),
            rate=request.rate_per_second,
            cutoff=matching.created_before,
            state="running",
            matched=matched,
            processed=0,
            acted=0,
            skipped=0,
            cursor_created=None,
            cursor_task=None,
            created_at=now,
            updated_at=now,
            finished_at=None,
        )
        async with self.gateway.db.transaction() as conn:
            await bulk_store.bulk_actions_insert_many(conn, [row], now)
            recorded = await bulk_store.bulk_action_get(conn, row.action_id)
        assert recorded is not None
        log.info(
            "bulk cancel asked",
            action_id=row.action_id,
            business=row.business,
            actor=actor,
            matched=matched,
        )
        return matched, recorded

    async def run_once(self) -> int:
        """One pass: every RUNNING action takes what its rate allows now. The tasks
        cancelled."""
        async with self.gateway.db.connection() as conn:
            ids = await bulk_store.bulk_actions_running(conn)
        cancelled = 0
        for action_id in ids:
            while True:
                taken, acted = await self._step(action_id)
                cancelled += acted
                if taken < self.batch:
                    break
        if cancelled:
            self.gateway.relay.kick()
        return cancelled

    async def _step(self, action_id: str) -> tuple[int, int]:
        """Take one batch of the action, in one transaction; (tasks taken, cancelled)."""
        now = self.gateway.clock.now()
        async with self.gateway.db.transaction() as conn:
            action = await bulk_store.bulk_action_lock_running(conn, action_id)
            if action is None:
                return 0, 0
            limit = budget(action.rate, action.created_at, now, action.processed, self.batch)
            if limit == 0:
                return 0, 0
            request = gateway_pb2.CancelByFilterRequest.FromString(action.request)
            matching = replace(self.filter_of(request), created_before=action.cutoff)
            statuses = statuses_of(request)
            batch = await store.task_list(
                conn,
                matching,
                statuses=statuses,
                after=action.cursor,
                limit=limit,
                newest_first=False,
            )
            asked = await self.gateway.cancel_in(conn, [t.task_id for t in batch], now)
            last = batch[-1] if batch else None
            advance = Advance(
                action_id=action_id,
                processed_before=action.processed,
                processed=action.processed + len(batch),
                acted=len(asked),
                skipped=len(batch) - len(asked),
                cursor=(last.created_at, last.task_id) if last else None,
                done=len(batch) < limit,
            )
            await bulk_store.bulk_actions_advance_if_running_many(conn, [advance], now)
        if advance.done:
            log.info("bulk cancel done", action_id=action_id, processed=advance.processed)
        return (len(batch) if not advance.done else 0), len(asked)


def statuses_of(request: gateway_pb2.CancelByFilterRequest) -> list[str]:
    """The stored statuses a bulk cancel takes: those asked (all unfinished ones if none)."""
    asked = [stored_status(s) for s in request.statuses]
    return [s for s in UNFINISHED if not asked or s in asked]
