"""Schedules (ADR-0104) in the test's process, on the real database and bus, time on a manual
clock: each fire time submits once with its key, whichever replica takes it and after a
PostgreSQL outage inside the catch-up window; the overlap policies; pause and resume."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from dispo.gateway import store
from dispo.gateway.expand import Limits
from dispo.gateway.operations import Gateway
from dispo.gateway.schedules.operations import Schedules
from dispo.gateway.schedules.policy import Due, Overlap, Spec, jitter, plan
from dispo.libs import metrics
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2, schedule_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.catalogue import load_catalogue
from dispo.libs.clock import ManualClock
from dispo.libs.errors import InvalidArgument
from dispo.libs.outbox import OutboxRelay

START = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
async def replica(service_db, bus, catalogue_file, clock):
    """``await replica()``: the schedules of one more gateway (its own connection pool), on
    the test's clock."""
    catalogue = load_catalogue(catalogue_file)

    async def make() -> Schedules:
        db = await service_db("gateway")
        relay = OutboxRelay(db, store.outbox, bus)
        return Schedules(Gateway(db, relay, catalogue, Limits(), clock, 0.5))

    return make


def definition(
    *, interval: int = 60, overlap=schedule_pb2.OVERLAP_POLICY_ALLOW, catchup: int = 0
) -> schedule_pb2.ScheduleDefinition:
    return schedule_pb2.ScheduleDefinition(
        spec=schedule_pb2.ScheduleSpec(interval_seconds=interval),
        template=gateway_pb2.SubmitRequest(
            business="tests", cells=[gateway_pb2.CellRequest(cell="noop")]
        ),
        overlap=overlap,
        catchup_window_seconds=catchup,
    )


async def fired_keys(schedules: Schedules) -> list[str]:
    """The idempotency keys of every task a schedule submitted, with repeats."""
    async with schedules.db.connection() as conn:
        return await conn.scalars(
            "SELECT idempotency_key FROM tasks WHERE idempotency_key LIKE 'schedule:%'"
            " ORDER BY idempotency_key"
        )


async def drain(*replicas: Schedules) -> None:
    """Firing passes, the replicas at once, until none finds work."""
    while any(r is not None for r in await asyncio.gather(*(s.fire_due() for s in replicas))):
        pass


def keys(schedule_id: str, *minutes: int) -> list[str]:
    return [f"schedule:{schedule_id}:2026-01-01T00:{m:02d}:00Z" for m in minutes]


async def finish(schedules: Schedules, task_id: str) -> None:
    """The executor's report that the task succeeded, taken into the gateway's view."""
    await schedules.gateway.apply_status(
        task_pb2.Task(
            task_id=task_id,
            business="tests",
            version=1,
            status=common_pb2.TASK_STATUS_SUCCEEDED,
        )
    )


async def test_each_fire_time_submits_once_with_its_key(replica, clock):
    schedules = await replica()
    made = await schedules.create("every-minute", "tests", definition(), paused=False)
    assert made.next_fire_times[0].ToDatetime(UTC) == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    assert len(made.next_fire_times) == 5

    assert await schedules.fire_due() is None  # not due yet
    clock.advance(30)
    await drain(schedules)
    await drain(schedules)  # nothing twice

    assert await fired_keys(schedules) == keys("every-minute", 1)
    shown = await schedules.get(await schedules.get_row("every-minute"))
    assert [f.fire_time.ToDatetime(UTC) for f in shown.recent_firings] == [
        datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
    ]
    task = await schedules.gateway.get(shown.recent_firings[0].task_id)
    assert task.idempotency_key == keys("every-minute", 1)[0]
    assert shown.next_fire_times[0].ToDatetime(UTC) == datetime(2026, 1, 1, 0, 2, tzinfo=UTC)


async def test_two_replicas_racing_submit_each_fire_time_once(replica, clock):
    first, second = await replica(), await replica()
    for n in range(5):
        await first.create(f"race-{n}", "tests", definition(), paused=False)
    for _ in range(6):
        clock.advance(60)
        await drain(first, second)

    found = await fired_keys(first)
    assert found == sorted(k for n in range(5) for k in keys(f"race-{n}", 1, 2, 3, 4, 5, 6))
    async with first.db.connection() as conn:
        firings = await conn.scalars("SELECT count(*) FROM schedule_firings")
    assert firings == [30]


async def test_missed_firings_inside_the_catch_up_window_fire_once_after_a_postgres_outage(
    replica, clock, infra
):
    schedules = await replica()
    await schedules.create("outage", "tests", definition(catchup=600), paused=False)
    await schedules.create("short", "tests", definition(catchup=90), paused=False)
    infra.postgres.stop("immediate")
    try:
        for _ in range(4):  # 00:01 .. 00:04 pass while PostgreSQL is down
            clock.advance(60)
            with pytest.raises(Exception):  # noqa: B017 - whatever the pool raises
                await schedules.fire_due()
    finally:
        infra.postgres.start()
    for _ in range(100):  # the pool reconnects once the server is back
        try:
            await drain(schedules)
            break
        except Exception:
            await asyncio.sleep(0.1)
    await drain(schedules)

    found = await fired_keys(schedules)
    assert [k for k in found if ":outage:" in k] == keys("outage", 1, 2, 3, 4)
    # Due at 00:04:30, the window reaches back to 00:03:00: 00:01 and 00:02 are skipped.
    assert [k for k in found if ":short:" in k] == keys("short", 3, 4)
    short = await schedules.get(await schedules.get_row("short"))
    assert short.skipped_catchup == 2


async def test_skip_submits_nothing_while_the_previous_task_runs(replica, clock):
    schedules = await replica()
    await schedules.create(
        "skip", "tests", definition(overlap=schedule_pb2.OVERLAP_POLICY_SKIP), paused=False
    )
    clock.advance(30)
    await drain(schedules)
    [first] = (await schedules.get(await schedules.get_row("skip"))).recent_firings
    clock.advance(60)  # 00:02: the first task still runs
    await drain(schedules)
    assert await fired_keys(schedules) == keys("skip", 1)

    await finish(schedules, first.task_id)
    clock.advance(60)  # 00:03
    await drain(schedules)
    assert await fired_keys(schedules) == keys("skip", 1, 3)
    assert (await schedules.get(await schedules.get_row("skip"))).skipped_overlap == 1


async def test_buffer_one_keeps_one_firing_until_the_previous_task_ends(replica, clock):
    schedules = await replica()
    await schedules.create(
        "buffer", "tests", definition(overlap=schedule_pb2.OVERLAP_POLICY_BUFFER_ONE), paused=False
    )
    clock.advance(30)
    await drain(schedules)
    clock.advance(120)  # 00:02 buffered, 00:03 skipped: one waits at most
    await drain(schedules)
    shown = await schedules.get(await schedules.get_row("buffer"))
    assert shown.buffered_fire_time.ToDatetime(UTC) == datetime(2026, 1, 1, 0, 2, tzinfo=UTC)
    assert shown.skipped_overlap == 1
    assert await fired_keys(schedules) == keys("buffer", 1)

    await finish(schedules, shown.recent_firings[0].task_id)
    await drain(schedules)  # no fire time passed: the buffered one goes now
    assert await fired_keys(schedules) == keys("buffer", 1, 2)
    assert not (await schedules.get(await schedules.get_row("buffer"))).HasField(
        "buffered_fire_time"
    )


def accepted_count() -> float:
    """The gateway's accepted-task counter of business ``tests`` in this process."""
    return metrics._TASKS_ACCEPTED("tests")._value.get()


async def test_allow_submits_every_firing_each_counted_as_accepted(replica, clock):
    schedules = await replica()
    await schedules.create("allow", "tests", definition(), paused=False)
    before = accepted_count()
    clock.advance(30 + 120)
    await drain(schedules)
    assert await fired_keys(schedules) == keys("allow", 1, 2, 3)
    assert accepted_count() - before == 3


async def test_a_paused_schedule_does_not_fire_and_resumes_from_now(replica, clock):
    schedules = await replica()
    await schedules.create("paused", "tests", definition(), paused=False)
    paused = await schedules.pause("paused")
    assert paused.paused and not paused.next_fire_times
    clock.advance(30 + 170)  # 00:01 .. 00:03 pass while paused
    await drain(schedules)
    assert await fired_keys(schedules) == []

    resumed = await schedules.resume("paused")
    assert resumed.next_fire_times[0].ToDatetime(UTC) == datetime(2026, 1, 1, 0, 4, tzinfo=UTC)
    clock.advance(10)
    await drain(schedules)
    assert await fired_keys(schedules) == keys("paused", 4)


async def test_trigger_fires_now_and_the_same_create_again_is_the_same_schedule(replica, clock):
    schedules = await replica()
    made = await schedules.create("manual", "tests", definition(), paused=True)
    again = await schedules.create("manual", "tests", definition(), paused=True)
    assert again.created_at == made.created_at
    firing = await schedules.trigger("manual")
    assert firing.manual and firing.task_id
    assert await fired_keys(schedules) == ["schedule:manual:2026-01-01T00:00:30Z"]


async def test_a_template_the_catalogue_refuses_is_refused_naming_its_field(replica):
    schedules = await replica()
    bad = definition()
    bad.template.cells[0].cell = "no-such-cell"
    with pytest.raises(InvalidArgument) as refused:
        await schedules.create("bad", "tests", bad, paused=False)
    assert [v.field for v in refused.value.violations] == ["definition.template.cells[0].cell"]
    async with schedules.db.connection() as conn:
        assert await conn.scalars("SELECT count(*) FROM schedules") == [0]


# The pure rules.


def test_a_cron_expression_reads_its_times_in_its_time_zone():
    spec = Spec(cron="0 2 * * *", time_zone="Europe/Berlin")
    # 02:00 in Berlin is 01:00 UTC in winter; on 29 March 2026 02:00 does not exist.
    assert spec.after(datetime(2026, 1, 1, tzinfo=UTC)) == datetime(2026, 1, 1, 1, tzinfo=UTC)
    assert spec.after(datetime(2026, 3, 28, 12, tzinfo=UTC)) == datetime(2026, 3, 29, 1, tzinfo=UTC)
    assert spec.after(datetime(2026, 3, 29, 12, tzinfo=UTC)) == datetime(2026, 3, 30, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (Spec(cron="61 * * * *"), "spec.cron"),
        (Spec(cron="0 0 30 2 *"), "spec.cron"),
        (Spec(cron="0 2 * * *", time_zone="Mars/Olympus"), "spec.time_zone"),
        (Spec(cron="0 2 * * *", time_zone="../etc/passwd"), "spec.time_zone"),
        (Spec(interval_seconds=-5), "spec.interval_seconds"),
        (Spec(), "spec"),
        (Spec(cron="* * * * *", interval_seconds=5), "spec"),
        (Spec(interval_seconds=60, jitter_seconds=86401), "spec.jitter_seconds"),
    ],
)
def test_a_bad_spec_is_refused_naming_its_field(spec, field):
    with pytest.raises(InvalidArgument) as refused:
        spec.check("spec", START)
    assert [v.field for v in refused.value.violations] == [field]


def test_jitter_is_the_same_for_every_replica_and_within_its_bound():
    fire = datetime(2026, 1, 1, 2, tzinfo=UTC)
    delays = {jitter("s", fire + timedelta(minutes=m), 30) for m in range(50)}
    assert all(timedelta(0) <= d <= timedelta(seconds=30) for d in delays)
    assert len(delays) > 1  # spread, not one constant
    assert jitter("s", fire, 30) == jitter("s", fire, 30)
    assert jitter("s", fire, 0) == timedelta(0)


def test_a_gap_longer_than_the_catch_up_window_is_skipped_and_counted():
    due = Due(
        "s",
        Spec(interval_seconds=60),
        Overlap.ALLOW,
        timedelta(minutes=5),
        datetime(2026, 1, 1, 0, 1, tzinfo=UTC),
        None,
        True,
    )
    step = plan(due, datetime(2026, 1, 1, 1, 0, tzinfo=UTC))
    assert step.submit is None
    assert step.next_fire_at == datetime(2026, 1, 1, 0, 55, tzinfo=UTC)
    assert step.skipped_catchup == 54
