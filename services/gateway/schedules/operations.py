"""Schedules' use cases (ADR-0104): create, read, change, pause, resume, delete, trigger, and
the firing pass every gateway runs.

A firing is one transaction: the schedule's row locked (``FOR UPDATE SKIP LOCKED``), its
template submitted through the tasks' own write path (idempotency key
``schedule:<id>:<fire time>``, task.create row in the outbox), the firing recorded and the
next fire time written. Nothing lies between "decided to fire" and "submitted": a crash
before the commit leaves the schedule due, and the next pass, on any replica, makes the same
firing with the same key."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from dispo.gateway import store as tasks_store
from dispo.gateway.convert import submission_from_proto
from dispo.gateway.expand import Submission
from dispo.gateway.operations import Gateway
from dispo.gateway.schedules import store
from dispo.gateway.schedules.convert import (
    catchup_of,
    checked_definition,
    firing_to_proto,
    overlap_of,
    schedule_to_proto,
    spec_of,
)
from dispo.gateway.schedules.policy import Due, Spec, firing_key, jitter, plan
from dispo.libs import metrics
from dispo.libs.api.gateway.v1 import schedule_pb2
from dispo.libs.db.driver import Conn
from dispo.libs.error_text import truncate_error
from dispo.libs.errors import (
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    repeated_differently,
    within,
)
from dispo.libs.logging import get_logger
from dispo.libs.outbox import Staged
from dispo.libs.periodic import Pause

log = get_logger(__name__)

# Firings shown by GetSchedule and by ListSchedules; next fire times shown.
GET_FIRINGS = 20
LIST_FIRINGS = 1
NEXT_TIMES = 5


def _definition(row: store.ScheduleRow) -> schedule_pb2.ScheduleDefinition:
    return schedule_pb2.ScheduleDefinition.FromString(row.definition)


def _encoded(definition: schedule_pb2.ScheduleDefinition) -> bytes:
    return definition.SerializeToString(deterministic=True)


def _next(schedule_id: str, spec: Spec, now: datetime) -> tuple[datetime, datetime]:
    """The first fire time after ``now`` and when it is due."""
    fire = spec.after(now)
    return fire, fire + jitter(schedule_id, fire, spec.jitter_seconds)


def _counted(accepted: list[Submission]) -> None:
    """The firings' new tasks in the gateway's accepted-task metrics, as a Submit's."""
    for sub in accepted:
        metrics.task_accepted(sub.business, (c.cell for c in sub.cells))


class Schedules:
    def __init__(self, gateway: Gateway, *, batch: int = 100) -> None:
        self.gateway = gateway
        self.db = gateway.db
        self.clock = gateway.clock
        self.relay = gateway.relay
        self.batch = batch  # schedules per firing transaction

    async def _task(
        self, schedule_id: str, definition: schedule_pb2.ScheduleDefinition, fire: datetime
    ) -> tuple[Submission, tasks_store.NewTask]:
        """The task a firing at ``fire`` submits, validated and expanded as a Submit's."""
        template = definition.template
        sub = submission_from_proto(template, template.business)
        sub.idempotency_key = firing_key(schedule_id, fire)
        return sub, await self.gateway.prepare(sub)

    async def _checked(
        self, schedule_id: str, definition: schedule_pb2.ScheduleDefinition, now: datetime
    ) -> None:
        """The template passes a Submit's checks (each refusal named under
        ``definition.template``)."""
        try:
            await self._task(schedule_id, definition, now)
        except DomainError as error:
            raise within("definition.template", error) from None

    async def _view(
        self, conn: Conn, row: store.ScheduleRow, firings: int
    ) -> schedule_pb2.Schedule:
        found = await store.firings_of(conn, [row.schedule_id], firings)
        return self._proto(row, found[row.schedule_id])

    @staticmethod
    def _proto(row: store.ScheduleRow, firings: list[store.FiringRow]) -> schedule_pb2.Schedule:
        times: list[datetime] = []
        if not row.paused and row.next_fire_at is not None:
            spec = spec_of(_definition(row).spec)
            times = [row.next_fire_at, *spec.upcoming(row.next_fire_at, NEXT_TIMES - 1)]
        return schedule_to_proto(row, firings, times)

    async def get_row(self, schedule_id: str) -> store.ScheduleRow:
        async with self.db.connection() as conn:
            row = await store.schedule_get(conn, schedule_id)
        if row is None:
            raise NotFound(f"no schedule {schedule_id!r}")
        return row

    async def create(
        self,
        schedule_id: str,
        business: str,
        definition: schedule_pb2.ScheduleDefinition,
        *,
        paused: bool,
    ) -> schedule_pb2.Schedule:
        """Record a new schedule. The same request again answers the schedule as it is (a
        repeat changes nothing); another request for a taken id is refused."""
        now = self.clock.now()
        stored, spec = checked_definition(definition, business, now)
        await self._checked(schedule_id, stored, now)
        fire, due = (None, None) if paused else _next(schedule_id, spec, now)
        encoded = _encoded(stored)
        async with self.db.connection() as conn:
            created = await store.schedule_insert_if_absent(
                conn,
                schedule_id,
                business,
                encoded,
                paused=paused,
                next_fire_at=fire,
                due_at=due,
                now=now,
            )
            row = await store.schedule_get(conn, schedule_id)
            if row is None:  # deleted at once by another call
                raise NotFound(f"no schedule {schedule_id!r}")
            if not created:
                if row.business != business:
                    raise AlreadyExists(f"schedule {schedule_id!r} exists already")
                if row.definition != encoded:
                    raise repeated_differently(f"schedule {schedule_id!r}", "definition")
            view = await self._view(conn, row, GET_FIRINGS)
        if created:
            log.info("schedule created", schedule_id=schedule_id, business=business)
        return view

    async def get(self, row: store.ScheduleRow) -> schedule_pb2.Schedule:
        async with self.db.connection() as conn:
            return await self._view(conn, row, GET_FIRINGS)

    async def list_schedules(
        self, business: str, after: str, limit: int
    ) -> list[schedule_pb2.Schedule]:
        async with self.db.connection() as conn:
            rows = await store.schedule_list(conn, business, after, limit)
            firings = await store.firings_of(conn, [r.schedule_id for r in rows], LIST_FIRINGS)
        return [self._proto(r, firings[r.schedule_id]) for r in rows]

    async def _change(
        self,
        schedule_id: str,
        *,
        definition: schedule_pb2.ScheduleDefinition | None = None,
        paused: bool | None = None,
    ) -> schedule_pb2.Schedule:
        """Set a schedule's definition, or its pause, under its row lock; the next fire time
        is the first after now (none while paused)."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await store.schedule_get(conn, schedule_id, lock=True)
            if row is None:
                raise NotFound(f"no schedule {schedule_id!r}")
            stored = _definition(row)
            if definition is not None:
                template_business = definition.template.business
                if template_business and template_business != row.business:
                    raise InvalidArgument(
                        "definition.template.business",
                        f"the schedule's business is {row.business!r}; it cannot change",
                    )
                stored, _ = checked_definition(definition, row.business, now)
                await self._checked(schedule_id, stored, now)
            elif paused == row.paused:
                return await self._view(conn, row, GET_FIRINGS)
            now_paused = row.paused if paused is None else paused
            fire, due = (
                (None, None) if now_paused else _next(schedule_id, spec_of(stored.spec), now)
            )
            await store.schedule_set_if_paused_is(
                conn,
                schedule_id,
                was_paused=row.paused,
                definition=_encoded(stored),
                paused=now_paused,
                next_fire_at=fire,
                due_at=due,
                now=now,
            )
            row = await store.schedule_get(conn, schedule_id)
            assert row is not None
            view = await self._view(conn, row, GET_FIRINGS)
        log.info(
            "schedule changed",
            schedule_id=schedule_id,
            paused=now_paused,
            updated=definition is not None,
        )
        return view

    async def update(
        self, schedule_id: str, definition: schedule_pb2.ScheduleDefinition
    ) -> schedule_pb2.Schedule:
        return await self._change(schedule_id, definition=definition)

    async def pause(self, schedule_id: str) -> schedule_pb2.Schedule:
        return await self._change(schedule_id, paused=True)

    async def resume(self, schedule_id: str) -> schedule_pb2.Schedule:
        return await self._change(schedule_id, paused=False)

    async def delete(self, schedule_id: str) -> None:
        async with self.db.connection() as conn:
            if not await store.schedule_delete(conn, schedule_id):
                raise NotFound(f"no schedule {schedule_id!r}")
        log.info("schedule deleted", schedule_id=schedule_id)

    async def _accept(
        self, conn: Conn, made: list[tuple[Submission, tasks_store.NewTask]]
    ) -> tuple[dict[str, str], Staged, list[Submission]]:
        """Write the firings' tasks in the caller's transaction; each one's task id (the one
        holding its key when it was taken already), and the submissions inserted."""
        news = [new for _, new in made]
        staged = self.relay.staged()
        inserted = await tasks_store.tasks_accept_many(conn, news, staged)
        taken = [(n.business, n.idempotency_key) for n in news if n.task_id not in inserted]
        holders = await tasks_store.tasks_by_keys(conn, taken)
        ids = {}
        for n in news:
            holder = holders.get((n.business, n.idempotency_key))
            ids[n.task_id] = (
                n.task_id if n.task_id in inserted or holder is None else holder.task_id
            )
        return ids, staged, [sub for sub, new in made if new.task_id in inserted]

    async def trigger(self, schedule_id: str) -> schedule_pb2.Firing:
        """Fire now, whatever the spec, the pause and the overlap policy say."""
        now = self.clock.now()
        async with self.db.transaction() as conn:
            row = await store.schedule_get(conn, schedule_id, lock=True)
            if row is None:
                raise NotFound(f"no schedule {schedule_id!r}")
            try:
                made = await self._task(schedule_id, _definition(row), now)
            except DomainError as error:
                refused = within("definition.template", error)
                raise FailedPrecondition(
                    f"the schedule's template is refused now: {error.message}",
                    refused.violations,
                ) from None
            ids, staged, accepted = await self._accept(conn, [made])
            task_id = ids[made[1].task_id]
            firing = store.FiringRow(schedule_id, now, now, "submitted", task_id, "", True)
            step = store.Fired(
                schedule_id,
                row.next_fire_at,
                row.next_fire_at,
                row.due_at,
                row.buffered_fire_at,
                0,
                0,
                firing,
            )
            await store.schedules_fire_if_expected_many(conn, [step], now)
        self.relay.publish_committed(staged)
        _counted(accepted)
        log.info("schedule triggered", schedule_id=schedule_id, task_id=firing.task_id)
        return firing_to_proto(firing, schedule_pb2.Firing())

    async def fire_due(self) -> Pause | None:
        """One firing pass: every schedule with a step to take now (at most ``batch``),
        each one step, in one transaction. Another pass at once while there was work (a
        schedule may have more fire times to catch up), else after the interval."""
        now = self.clock.now()
        staged: Staged | None = None
        async with self.db.transaction() as conn:
            locked = await store.schedules_lock_due(conn, now, self.batch)
            if not locked:
                return None
            steps: list[store.Fired] = []
            made: list[tuple[Submission, tasks_store.NewTask]] = []
            for row, previous_done in locked:
                definition = _definition(row)
                assert row.next_fire_at is not None
                due = Due(
                    row.schedule_id,
                    spec_of(definition.spec),
                    overlap_of(definition),
                    catchup_of(definition),
                    row.next_fire_at,
                    row.buffered_fire_at,
                    previous_done,
                )
                step = plan(due, now)
                firing = None
                if step.submit is not None:
                    try:
                        sub, new = await self._task(row.schedule_id, definition, step.submit)
                    except DomainError as error:
                        reason = truncate_error(error.message)
                        firing = store.FiringRow(
                            row.schedule_id, step.submit, now, "refused", None, reason, False
                        )
                        log.warning(
                            "schedule firing refused",
                            schedule_id=row.schedule_id,
                            fire_time=step.submit.isoformat(),
                            reason=reason,
                        )
                    else:
                        made.append((sub, new))
                        firing = store.FiringRow(
                            row.schedule_id, step.submit, now, "submitted", new.task_id, "", False
                        )
                steps.append(
                    store.Fired(
                        row.schedule_id,
                        row.next_fire_at,
                        step.next_fire_at,
                        due.due_at(step.next_fire_at),
                        step.buffered_fire_at,
                        step.skipped_overlap,
                        step.skipped_catchup,
                        firing,
                    )
                )
            ids, staged, accepted = await self._accept(conn, made)
            steps = [
                replace(s, firing=replace(s.firing, task_id=ids[s.firing.task_id]))
                if s.firing is not None and s.firing.task_id is not None
                else s
                for s in steps
            ]
            await store.schedules_fire_if_expected_many(conn, steps, now)
        self.relay.publish_committed(staged)
        _counted(accepted)
        for s in steps:
            if s.firing is not None and s.firing.task_id is not None:
                log.info(
                    "schedule fired",
                    schedule_id=s.schedule_id,
                    task_id=s.firing.task_id,
                    fire_time=s.firing.fire_time.isoformat(),
                )
        return Pause(0)
