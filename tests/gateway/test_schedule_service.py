"""ScheduleService through real gateway processes on a file clock (ADR-0104): firings across
a SIGKILL of the gateway and with two gateways racing, counted at a downstream that does not
deduplicate (one effect per firing); business tokens manage only their business's schedules;
bad input refused naming the field, with nothing stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import grpc
import pytest
from dispo.libs.api.gateway.v1 import gateway_pb2, schedule_pb2, schedule_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.sdk import DispoError, cell
from pipeline_fixtures import Pipeline
from support import eventually
from support.auth import business_token

START = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
FAST = {"DISPO_GATEWAY_SCHEDULE_INTERVAL_SECONDS": "0.2"}


async def effects_by_fire_time(downstream, client) -> dict[str, int]:
    """How many effects the downstream performed for each fire time's task (every effect
    it performed is one of theirs)."""
    effects = await downstream.effects()
    out: dict[str, int] = {}
    counted = 0
    for summary in (await client.list_page(business="tests", page_size=500)).tasks:
        task = await client.get(summary.task_id)
        done = sum(n for k, n in effects.items() if k.startswith(f"{task.task_id}/"))
        out[task.raw.idempotency_key] = out.get(task.raw.idempotency_key, 0) + done
        counted += done
    assert counted == sum(effects.values()), effects
    return out


def fire_keys(*minutes: int) -> dict[str, int]:
    return {f"schedule:nightly:2026-01-01T00:{m:02d}:00Z": 1 for m in minutes}


async def schedule_effects(downstream, client, wanted: dict[str, int]) -> None:
    await eventually(
        lambda: effects_by_fire_time(downstream, client),
        lambda found: found == wanted,
        timeout=60,
        interval=0.2,
        wanted=f"one effect per firing: {wanted}",
    )


async def test_firings_survive_a_sigkill_of_the_gateway_and_two_gateways_racing(
    start_service, catalogue_file, egress_allow, downstream, file_clock
):
    file_clock.set(START)
    await downstream.control(dedupe=False)  # every call that arrives is an effect
    gateway_env = {**file_clock.env, **FAST}
    pipeline = Pipeline(start_service, catalogue_file, egress_allow)
    await pipeline.start_executor()
    first = await pipeline.start_gateway(**gateway_env)
    async with pipeline.client() as client:
        made = await client.create_schedule(
            "nightly",
            "tests",
            [cell("step_once", name="sched")],
            interval_seconds=60,
            overlap="allow",
            catchup_window_seconds=600,
        )
        assert made.next_fire_times[0] == datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
        file_clock.advance(seconds=30)  # 00:01
        await schedule_effects(downstream, client, fire_keys(1))

    first.kill()  # SIGKILL: no shutdown code runs
    file_clock.advance(seconds=180)  # 00:02 .. 00:04 pass with no gateway
    second = await pipeline.start_gateway(**gateway_env)
    racer = await pipeline.start_gateway(**gateway_env)  # two owners from now on
    async with pipeline.client() as client:
        await schedule_effects(downstream, client, fire_keys(1, 2, 3, 4))
        for _ in range(3):
            file_clock.advance(seconds=60)
        await schedule_effects(downstream, client, fire_keys(1, 2, 3, 4, 5, 6, 7))
        shown = await client.get_schedule("nightly")
        assert len(shown.recent_firings) == 7
        assert {f.task_id for f in shown.recent_firings} == {
            s.task_id for s in (await client.list_page(business="tests", page_size=500)).tasks
        }
    assert second.running() and racer.running()


def template(business: str = "shop") -> gateway_pb2.SubmitRequest:
    return gateway_pb2.SubmitRequest(
        business=business, cells=[gateway_pb2.CellRequest(cell="noop")]
    )


def create(schedule_id: str, business: str = "shop", **spec) -> schedule_pb2.CreateScheduleRequest:
    return schedule_pb2.CreateScheduleRequest(
        schedule_id=schedule_id,
        definition=schedule_pb2.ScheduleDefinition(
            spec=schedule_pb2.ScheduleSpec(**(spec or {"cron": "0 2 * * *"})),
            template=template(business),
        ),
    )


async def test_a_business_token_manages_only_its_own_schedules(gateway_only, database_url):
    _, shop = await business_token(database_url, "shop")
    _, other = await business_token(database_url, "other")
    address = gateway_only.gateway.address
    async with open_channel(address, shop) as mine, open_channel(address, other) as theirs:
        stub, foreign = (schedule_pb2_grpc.ScheduleServiceStub(c) for c in (mine, theirs))
        made = (await stub.CreateSchedule(create("shop-nightly"))).schedule
        assert made.business == "shop"
        await foreign.CreateSchedule(create("other-nightly", business=""))  # its own

        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await foreign.CreateSchedule(create("sneaky", business="shop"))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        ident = {"schedule_id": "shop-nightly"}
        for method, request in (
            (foreign.GetSchedule, schedule_pb2.GetScheduleRequest(**ident)),
            (foreign.PauseSchedule, schedule_pb2.PauseScheduleRequest(**ident)),
            (foreign.ResumeSchedule, schedule_pb2.ResumeScheduleRequest(**ident)),
            (foreign.TriggerSchedule, schedule_pb2.TriggerScheduleRequest(**ident)),
            (foreign.DeleteSchedule, schedule_pb2.DeleteScheduleRequest(**ident)),
            (
                foreign.UpdateSchedule,
                schedule_pb2.UpdateScheduleRequest(
                    schedule_id="shop-nightly", definition=create("x").definition
                ),
            ),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as hidden:
                await method(request)
            assert hidden.value.code() == grpc.StatusCode.NOT_FOUND, method
        listed = await foreign.ListSchedules(schedule_pb2.ListSchedulesRequest())
        assert [s.schedule_id for s in listed.schedules] == ["other-nightly"]
        with pytest.raises(grpc.aio.AioRpcError) as denied:
            await foreign.ListSchedules(schedule_pb2.ListSchedulesRequest(business="shop"))
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED

        # Its own: shown, paused, fired and deleted.
        paused = await stub.PauseSchedule(schedule_pb2.PauseScheduleRequest(**ident))
        assert paused.schedule.paused
        fired = await stub.TriggerSchedule(schedule_pb2.TriggerScheduleRequest(**ident))
        assert fired.firing.task_id
        await stub.DeleteSchedule(schedule_pb2.DeleteScheduleRequest(**ident))
        with pytest.raises(grpc.aio.AioRpcError) as gone:
            await stub.GetSchedule(schedule_pb2.GetScheduleRequest(**ident))
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (create("bad cron", cron="0 2 * *"), "schedule_id"),
        (create("bad-cron", cron="0 25 * * *"), "definition.spec.cron"),
        (
            create("bad-zone", cron="0 2 * * *", time_zone="Europe/Nowhere"),
            "definition.spec.time_zone",
        ),
        (create("bad-interval", interval_seconds=0), "definition.spec"),
        (
            create("bad-jitter", interval_seconds=60, jitter_seconds=-1),
            "definition.spec.jitter_seconds",
        ),
        (create("no-cell", cron="0 2 * * *"), "definition.template.cells[0].cell"),
        (create("keyed", cron="0 2 * * *"), "definition.template.idempotency_key"),
        (schedule_pb2.CreateScheduleRequest(schedule_id="empty"), "definition"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_stores_nothing(
    gateway_client, request_, field
):
    if request_.schedule_id == "no-cell":
        request_.definition.template.cells[0].cell = "no-such-cell"
    if request_.schedule_id == "keyed":
        request_.definition.template.idempotency_key = "mine"
    stub = schedule_pb2_grpc.ScheduleServiceStub(gateway_client._channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.CreateSchedule(request_)
    error = DispoError.from_rpc(refused.value)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error
    assert list(error.violations) == [field], error
    assert (await stub.ListSchedules(schedule_pb2.ListSchedulesRequest())).schedules == []


async def test_a_schedule_in_a_time_zone_shows_its_next_firings(gateway_client):
    made = await gateway_client.create_schedule(
        "berlin", "tests", [cell("noop")], cron="0 2 * * *", time_zone="Europe/Berlin"
    )
    local = [t.astimezone(made_zone()) for t in made.next_fire_times]
    assert [(t.hour, t.minute) for t in local] == [(2, 0)] * 5
    assert all(b - a == timedelta(days=1) for a, b in zip(local, local[1:], strict=False))


def made_zone():
    from zoneinfo import ZoneInfo

    return ZoneInfo("Europe/Berlin")
