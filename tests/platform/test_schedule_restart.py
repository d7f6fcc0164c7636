"""Schedule firings across a full `dispo up` stop and start (ADR-0104), counted at a
downstream outside the stack that does not deduplicate: every fire time from the first to
the last, those that passed while the stack was down included, submitted one task and made
one effect."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from dispo.sdk import AsyncClient, cell
from pipeline_fixtures import TEST_CATALOGUE, running_downstream
from support import eventually
from support.stack import RunningStack

pytestmark = pytest.mark.long_file

INTERVAL = 3


async def firing_tasks(client: AsyncClient) -> dict[str, list[str]]:
    """The tasks of business ``tests`` by idempotency key."""
    out: dict[str, list[str]] = {}
    for summary in (await client.list_page(business="tests", page_size=500)).tasks:
        task = await client.get(summary.task_id)
        out.setdefault(task.raw.idempotency_key, []).append(task.task_id)
    return out


@pytest.mark.timeout(600)
async def test_firings_across_a_full_restart_make_one_effect_each(tmp_path):
    async with running_downstream(tmp_path) as downstream:
        await downstream.control(dedupe=False)  # every call that arrives is an effect
        catalogue = tmp_path / "catalogue.yaml"
        catalogue.write_text(TEST_CATALOGUE.format(url=downstream.url))
        stack = RunningStack.fresh(tmp_path)
        stack.env |= {"DISPO_CATALOGUE": str(catalogue), "DISPO_EGRESS_ALLOW": downstream.url}
        try:
            await stack.up()
            async with AsyncClient(stack.address("gateway"), token=stack.token) as client:
                await client.create_schedule(
                    "ticking",
                    "tests",
                    [cell("step_once", name="tick")],
                    interval_seconds=INTERVAL,
                    overlap="allow",
                    catchup_window_seconds=3600,
                )
                await eventually(
                    downstream.effects, lambda e: len(e) >= 2, timeout=60, wanted="two firings"
                )
            await stack.down()
            stopped = datetime.now(UTC)
            await stack.up()
            async with AsyncClient(stack.address("gateway"), token=stack.token) as client:

                async def latest() -> datetime:
                    shown = await client.get_schedule("ticking")
                    return shown.recent_firings[0].fire_time

                # a fire time after the gap: the gap's own fire times are behind it
                gap_end = stopped + timedelta(seconds=INTERVAL)
                await eventually(latest, lambda t: t > gap_end, timeout=120, wanted="firing")
                await client.pause_schedule("ticking")
                found = await firing_tasks(client)
                await eventually(
                    downstream.effects,
                    lambda e: len(e) == len(found),
                    timeout=120,
                    wanted=f"{len(found)} tasks' calls",
                )
                effects = await downstream.effects()
        finally:
            stack.kill()

    times = sorted(datetime.fromisoformat(k.removeprefix("schedule:ticking:")) for k in found)
    assert times[0] < stopped < times[-1]  # firings before and after the stop
    # Never lost: every fire time between the first and the last, the gap's included.
    assert [t - times[0] for t in times] == [
        timedelta(seconds=INTERVAL * n) for n in range(len(times))
    ], times
    # Never doubled: one task per fire time, one effect per task.
    assert all(len(ids) == 1 for ids in found.values()), found
    assert sorted(k.split("/", 1)[0] for k in effects) == sorted(ids[0] for ids in found.values())
    assert set(effects.values()) == {1}, effects
