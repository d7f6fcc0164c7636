"""The pool's use cases: operator commands and the cron protocol.

Each command is one transaction on the pool's DB (the authority), on the driver port
(``db.transaction()``; a read alone on ``db.connection()``); driver updates and
wake-ups happen after the commit and are best effort (the drift check repairs the rest).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from dispo.libs.clock import Clock
from dispo.libs.db.driver import Conn, Database
from dispo.libs.egress import AllowList
from dispo.libs.errors import FailedPrecondition, InvalidArgument, NotFound, repeated_differently
from dispo.libs.logging import get_logger
from dispo.libs.metrics import age_seconds
from dispo.pool import events, store
from dispo.pool.analysis_models import AnalysisModels, NoAnalysisModels, require_registered
from dispo.pool.domain import (
    EVALUATION_TRANSITIONS,
    AssignmentEnd,
    Cron,
    CronStatus,
    Evaluation,
    EvaluationStatus,
    PoolPolicy,
    RunResult,
)
from dispo.pool.driver_calls import DriverCalls
from dispo.pool.drivers import Driver
from dispo.pool.validation import DEFAULT_EGRESS, validate_evaluation

log = get_logger(__name__)


@dataclass(frozen=True)
class WakeResult:
    evaluation: Evaluation | None
    next_run_index: int = 0
    runs_owed: int = 0


@dataclass(frozen=True)
class RecordResult:
    run_id: str
    duplicate: bool
    continue_evaluation: bool
    next_run_index: int
    evaluation_status: EvaluationStatus


@dataclass(frozen=True)
class Load:
    """What the pool carries: its crons by status, the queue's depth and the longest wait
    in it (seconds)."""

    counts: dict[CronStatus, int]
    queue_depth: int
    oldest_wait_seconds: int


async def _load(conn: Conn, now: datetime) -> Load:
    counts = await store.cron_counts(conn)
    depth, oldest = await store.queue_depth(conn, now)
    return Load(counts, depth, int(age_seconds(now, oldest)))


@dataclass(frozen=True)
class Status:
    driver: str
    counts: dict[CronStatus, int]
    min_size: int
    max_size: int
    queue_depth: int
    oldest_wait_seconds: int
    stuck_evaluations: int


def new_cron_id() -> str:
    return f"cron-{uuid.uuid4().hex[:12]}"


class Pool:
    def __init__(
        self,
        db: Database,
        driver: Driver,
        clock: Clock,
        policy: PoolPolicy,
        on_commit: Callable[[], None] = lambda: None,
        egress: AllowList = DEFAULT_EGRESS,
        analysis_models: AnalysisModels | None = None,
        on_schedule_change: Callable[[], None] = lambda: None,
        driver_calls: DriverCalls | None = None,
    ) -> None:
        self.db = db  # the pool's store runs on it (dispo.pool.store)
        self.egress = egress  # where an evaluation's target_url may point
        # which analysis_model an evaluation may name (the intelligence service's)
        self.analysis_models = analysis_models or NoAnalysisModels()
        self.driver = driver
        self.clock = clock
        self.policy = policy
        self.on_commit = on_commit  # kicks the outbox relay
        # Asks for the time of the next due slot to be worked out again (the service's slot
        # wake-ups): an evaluation was created, resumed or boosted, or a cron let one go.
        self.on_schedule_change = on_schedule_change
        # The sweeps' driver calls, run beside them (bounded, each with a deadline).
        self.driver_calls = driver_calls or DriverCalls()

    # --- helpers -----------------------------------------------------------------------

    async def settle(self) -> None:
        """Until the driver calls asked for so far are done: the sweeps' creations and
        removals, then the driver's own state writes and wake-ups."""
        await self.driver_calls.drain()
        await self.driver.drain()

    async def cron_driver_state(self, cron_id: str) -> dict | None:
        """The driver state of a cron as the database has it now (None: no such cron)."""
        async with self.db.connection() as conn:
            cron = await store.cron_get(conn, cron_id)
        return cron.driver_state() if cron is not None else None

    async def write_driver_state(self, cron_id: str) -> None:
        state = await self.cron_driver_state(cron_id)
        if state is None:
            return
        try:
            await self.driver.write_state(cron_id, state)
        except Exception as error:
            log.warning("driver state write failed", cron_id=cron_id, error=str(error))

    async def wake_idle_crons(self) -> int:
        """Wake as many idle crons as there are queue items (event-driven; the tick is the fallback)."""
        now = self.clock.now()
        async with self.db.connection() as conn:
            depth, _ = await store.queue_depth(conn, now)
            crons = await store.crons_idle_to_wake(conn, depth) if depth else []
        for cron_id in crons:
            try:
                await self.driver.trigger(cron_id)
            except Exception as error:
                log.warning("wake-up failed", cron_id=cron_id, error=str(error))
        return len(crons)

    async def bounds(self, conn: Conn) -> tuple[int, int]:
        return await store.bounds_get(conn, (self.policy.min_size, self.policy.max_size))

    # --- evaluations -------------------------------------------------------------------

    async def create_evaluation(self, ev: Evaluation) -> Evaluation:
        if not ev.id:
            ev = replace(ev, id=f"ev-{uuid.uuid4().hex[:16]}")
        validate_evaluation(ev, self.egress, self.policy)
        await require_registered(ev.analysis_model, self.analysis_models)
        now = self.clock.now()
        async with self.db.transaction() as conn:
            created = await store.evaluation_insert(conn, ev, now)
            if created is None:  # a repeat: the same request is answered with what exists
                existing = await store.evaluation_get(conn, ev.id)
                assert existing is not None  # evaluations are never deleted
                differing = existing.differing_field(ev)
                if differing is not None:
                    raise repeated_differently(f"evaluation {ev.id!r}", differing)
                return existing
        log.info("evaluation created", evaluation_id=ev.id)
        self.on_schedule_change()
        await self.wake_idle_crons()
        return created

    async def get_evaluation(self, evaluation_id: str) -> Evaluation:
        async with self.db.connection() as conn:
            ev = await store.evaluation_get(conn, evaluation_id)
        if ev is None:
            raise NotFound(f"evaluation {evaluation_id!r} not found")
        return ev

    async def _locked(self, conn: Conn, evaluation_id: str) -> Evaluation:
        if not evaluation_id:
            raise InvalidArgument("evaluation_id", "required")
        ev = await store.evaluation_get(conn, evaluation_id, lock=True)
        if ev is None:
            raise NotFound(f"evaluation {evaluation_id!r} not found")
        return ev

    async def _stop(self, evaluation_id: str, new: EvaluationStatus) -> Evaluation:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            ev = await self._locked(conn, evaluation_id)
            allowed = EVALUATION_TRANSITIONS.sources(new)
            if ev.status not in allowed:
                raise FailedPrecondition(
                    f"evaluation {ev.id} is {ev.status.value}; cannot become {new.value}"
                )
            freed = ev.assigned_cron_id
            if freed:
                await store.cron_release_if_holding(
                    conn, freed, ev.id, AssignmentEnd.CANCELLED, now, touch=False
                )
            if not await store.evaluation_set_status_if(conn, ev.id, allowed, new, now):
                raise FailedPrecondition(f"evaluation {ev.id} changed concurrently")
            if new is EvaluationStatus.CANCELLED:
                await events.add_completed(
                    conn, ev.id, EvaluationStatus.CANCELLED, ev.runs_done, now
                )
            result = await store.evaluation_get(conn, ev.id)
        self.on_commit()
        if freed:
            await self.write_driver_state(freed)
        assert result is not None
        return result

    async def pause(self, evaluation_id: str) -> Evaluation:
        return await self._stop(evaluation_id, EvaluationStatus.PAUSED)

    async def cancel(self, evaluation_id: str) -> Evaluation:
        return await self._stop(evaluation_id, EvaluationStatus.CANCELLED)

    async def resume(self, evaluation_id: str) -> Evaluation:
        now = self.clock.now()
        async with self.db.transaction() as conn:
            ev = await self._locked(conn, evaluation_id)
            if ev.status is not EvaluationStatus.PAUSED:
                raise FailedPrecondition(f"evaluation {ev.id} is {ev.status.value}, not paused")
            target = EvaluationStatus.EXECUTING if ev.started_at else EvaluationStatus.QUEUED
            await store.evaluation_set_status_if(
                conn, ev.id, (EvaluationStatus.PAUSED,), target, now
            )
            result = await store.evaluation_get(conn, ev.id)
        self.on_schedule_change()
        await self.wake_idle_crons()
        assert result is not None
        return result

    async def boost(self, evaluation_id: str, boost: int) -> Evaluation:
        if not 0 <= boost <= 1000:
            raise InvalidArgument("priority_boost", "must be in 0..1000")
        async with self.db.transaction() as conn:
            await self._locked(conn, evaluation_id)
            if not await store.evaluation_set_boost(conn, evaluation_id, boost):
                raise FailedPrecondition(f"evaluation {evaluation_id} is finished")
            result = await store.evaluation_get(conn, evaluation_id)
        self.on_schedule_change()
        await self.wake_idle_crons()
        assert result is not None
        return result

    # --- cron protocol -----------------------------------------------------------------

    async def wake_cron(self, cron_id: str) -> WakeResult:
        """A cron woke: busy → its evaluation and the runs it owes; idle → take the top item."""
        if not cron_id:
            raise InvalidArgument("cron_id", "required")
        now = self.clock.now()
        changed = let_go = False
        async with self.db.transaction() as conn:
            # Lock order everywhere: evaluation row, then cron row (the claim never waits on
            # an evaluation: SKIP LOCKED), so wakes, recordings, sweeps and operator commands
            # cannot deadlock one another.
            seen = await store.cron_get(conn, cron_id)
            if seen is None:
                raise NotFound(f"cron {cron_id!r} not found")
            held = None
            if seen.status is CronStatus.BUSY and seen.evaluation_id:
                held = await store.evaluation_get(conn, seen.evaluation_id, lock=True)
            cron = await store.cron_touch_if_live(conn, cron_id, now)
            if cron is None:
                raise FailedPrecondition(f"cron {cron_id} is {seen.status.value}")
            result: WakeResult | None = None
            if cron.status is CronStatus.BUSY and cron.evaluation_id:
                ev = held if held and held.id == cron.evaluation_id else None
                owed = self._owed(ev, now) if ev and ev.assigned_cron_id == cron_id else 0
                if owed and ev:
                    result = WakeResult(ev, ev.runs_done, owed)
                elif ev is not None:  # nothing owed now: back to the pool, then take the top item
                    await store.cron_release_if_holding(
                        conn, cron_id, cron.evaluation_id, AssignmentEnd.DONE, now
                    )
                    changed = let_go = True
                else:  # it changed hands while we looked: report, change nothing
                    current = await store.evaluation_get(conn, cron.evaluation_id)
                    return WakeResult(
                        current, current.runs_done if current else 0, self._owed(current, now)
                    )
            if result is None:
                claim = await store.evaluation_claim_top_for_cron(conn, cron_id, now)
                if claim is None:
                    result = WakeResult(None)
                else:
                    changed = True
                    if claim.previous_status is EvaluationStatus.QUEUED:
                        await events.add_started(conn, claim.evaluation, now)
                    ev = claim.evaluation
                    result = WakeResult(ev, ev.runs_done, self._owed(ev, now))
                    log.info(
                        "cron took evaluation",
                        cron_id=cron_id,
                        evaluation_id=ev.id,
                        runs_owed=result.runs_owed,
                    )
        if let_go:  # its next slot is due later: when, is worked out again
            self.on_schedule_change()
        if changed:
            self.on_commit()
            await self.write_driver_state(cron_id)
        return result

    def _owed(self, ev: Evaluation | None, now: datetime) -> int:
        if ev is None or ev.status is not EvaluationStatus.EXECUTING:
            return 0
        return min(ev.schedule.debt(now, ev.runs_done), self.policy.runs_per_wake)

    async def record_run(
        self, cron_id: str, evaluation_id: str, run_index: int, case_id: str, result: RunResult
    ) -> RecordResult:
        if not cron_id:
            raise InvalidArgument("cron_id", "required")
        if run_index < 0:
            raise InvalidArgument("run_index", "must be >= 0")
        now = self.clock.now()
        released = let_go = False
        async with self.db.transaction() as conn:
            ev = await self._locked(conn, evaluation_id)
            if await store.run_exists(conn, ev.id, run_index):
                return self._after(ev, cron_id, now, duplicate=True, run_index=run_index)
            if run_index >= ev.schedule.runs_total:
                raise InvalidArgument(
                    "run_index", f"the evaluation has {ev.schedule.runs_total} runs"
                )
            if case_id != ev.case_for_run(run_index).id:
                raise InvalidArgument(
                    "case_id", f"run {run_index} is case {ev.case_for_run(run_index).id!r}"
                )
            if ev.assigned_cron_id != cron_id:
                raise FailedPrecondition(f"cron {cron_id} does not hold evaluation {ev.id}")
            if ev.runs_done != run_index:
                raise FailedPrecondition(f"next run of {ev.id} is {ev.runs_done}, not {run_index}")
            if not await store.run_record_if_next(
                conn, ev, cron_id, run_index, case_id, result, now
            ):
                raise FailedPrecondition(f"cron {cron_id} lost evaluation {ev.id}")
            await events.add_run_recorded(conn, ev.id, ev.run_id(run_index), case_id, result, now)
            ev = replace(ev, runs_done=run_index + 1)
            if ev.runs_done >= ev.schedule.runs_total:
                await store.cron_release_if_holding(
                    conn, cron_id, ev.id, AssignmentEnd.COMPLETED, now
                )
                await store.evaluation_set_status_if(
                    conn, ev.id, (EvaluationStatus.EXECUTING,), EvaluationStatus.COMPLETED, now
                )
                await events.add_completed(
                    conn, ev.id, EvaluationStatus.COMPLETED, ev.runs_done, now
                )
                released = True
                log.info("evaluation completed", evaluation_id=ev.id, cron_id=cron_id)
            elif ev.schedule.debt(now, ev.runs_done) == 0:
                await store.cron_release_if_holding(conn, cron_id, ev.id, AssignmentEnd.DONE, now)
                released = let_go = True
            final = await store.evaluation_get(conn, ev.id)
        self.on_commit()
        if let_go:  # it waits for its next slot: when that falls due is worked out again
            self.on_schedule_change()
        if released:
            await self.write_driver_state(cron_id)
        assert final is not None
        return self._after(final, cron_id, now, duplicate=False, run_index=run_index)

    def _after(
        self, ev: Evaluation, cron_id: str, now: datetime, *, duplicate: bool, run_index: int
    ) -> RecordResult:
        holds = ev.assigned_cron_id == cron_id and ev.status is EvaluationStatus.EXECUTING
        return RecordResult(
            ev.run_id(run_index),
            duplicate,
            holds and ev.schedule.debt(now, ev.runs_done) > 0,
            ev.runs_done,
            ev.status,
        )

    # --- operator pool commands --------------------------------------------------------

    async def force_release(
        self,
        cron_id: str = "",
        evaluation_id: str = "",
        reason: AssignmentEnd = AssignmentEnd.FORCE_RELEASED,
    ) -> tuple[str, str]:
        if bool(cron_id) == bool(evaluation_id):
            raise InvalidArgument("cron_id", "give exactly one of cron_id and evaluation_id")
        now = self.clock.now()
        async with self.db.transaction() as conn:
            if cron_id:
                cron = await store.cron_get(conn, cron_id)
                if cron is None:
                    raise NotFound(f"cron {cron_id!r} not found")
                evaluation_id = cron.evaluation_id or ""
            else:
                ev = await self._locked(conn, evaluation_id)
                cron_id = ev.assigned_cron_id or ""
            if (
                not cron_id
                or not evaluation_id
                or not await store.cron_release_if_holding(
                    conn, cron_id, evaluation_id, reason, now, touch=False
                )
            ):
                raise FailedPrecondition(
                    "nothing to release: the cron is not holding an evaluation"
                )
        log.info("cron released", cron_id=cron_id, evaluation_id=evaluation_id, reason=reason.value)
        await self.write_driver_state(cron_id)
        await self.wake_idle_crons()
        return cron_id, evaluation_id

    async def set_bounds(self, min_size: int, max_size: int) -> None:
        if not 1 <= min_size <= 100:
            raise InvalidArgument("min_size", "must be in 1..100")
        if not min_size <= max_size <= 100:
            raise InvalidArgument("max_size", "must be in min_size..100")
        async with self.db.transaction() as conn:
            await store.bounds_set(conn, min_size, max_size)

    async def load(self) -> Load:
        """The crons and the queue (two indexed reads; the metrics' scrape-time reading)."""
        async with self.db.connection() as conn:
            return await _load(conn, self.clock.now())

    async def status(self) -> Status:
        """:meth:`load`, the size bounds and the stuck evaluations (GetPoolStatus)."""
        async with self.db.connection() as conn:
            load = await _load(conn, self.clock.now())
            lo, hi = await self.bounds(conn)
            stuck = await store.evaluation_count_by_status(conn, EvaluationStatus.STUCK)
        return Status(
            self.driver.name,
            load.counts,
            lo,
            hi,
            load.queue_depth,
            load.oldest_wait_seconds,
            stuck,
        )

    async def crons(self) -> list[Cron]:
        async with self.db.connection() as conn:
            return await store.crons_list(conn)
