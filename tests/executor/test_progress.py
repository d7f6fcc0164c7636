"""A running task's progress is published at most once per progress interval, on the
executor's clock (ADR-0059): here the shared file clock, which moves only when the test
moves it, so what is published before and after the interval is exact."""

from __future__ import annotations

from datetime import UTC, datetime

from dispo.libs.sdk import cell
from pipeline_fixtures import Pipeline, dump, wait_until


async def test_progress_waits_for_the_interval_and_a_settlement_is_published_at_once(
    start_service, catalogue_file, downstream, file_clock
):
    file_clock.set(datetime.now(UTC))
    pipeline = Pipeline(start_service, catalogue_file)
    await pipeline.start_gateway()
    await pipeline.start_executor(**file_clock.env, DISPO_EXECUTOR_PROGRESS_INTERVAL_SECONDS="1")
    async with pipeline.client() as client:
        # Within the interval: two calls, one after the other, and one status event, the
        # settlement's, saying all of it.
        quick = await client.submit("tests", [cell("pair", name="quick")])
        done = await client.wait(quick.task_id, timeout=30)
        assert done.status == "SUCCEEDED", dump(done)
        [event] = await client.events(quick.task_id)
        assert event.status == "SUCCEEDED" and event.previous_status == ""
        assert sorted((c.node_id, c.old_status, c.new_status, c.new_attempts)
                      for c in event.changes) == [
            ("pair.first", "", "SUCCEEDED", 1), ("pair.second", "", "SUCCEEDED", 1)
        ]  # fmt: skip

        # A call under way: its pass has progress (the first call ended, the second is
        # claimed), and nothing of it is published while the clock stands still.
        await downstream.control(hold={"path": "/pair/slow/second", "effect": True})
        slow = await client.submit("tests", [cell("pair", name="slow")])
        await downstream.wait_held(1)
        assert await client.events(slow.task_id) == ()
        assert (await client.get(slow.task_id)).status == "ACCEPTED"

        file_clock.advance(seconds=1)  # the interval has passed: the newest state, once
        view = await wait_until(
            client,
            slow.task_id,
            lambda v: v.status == "RUNNING",
            wanted="the progress published",
        )
        assert [(n.node_id, n.status, n.attempts) for n in view.nodes] == [
            ("pair.first", "SUCCEEDED", 1),
            ("pair.second", "RUNNING", 1),
        ], dump(view)

        await downstream.control(release=True)  # the held call answers: the task settles
        done = await client.wait(slow.task_id, timeout=30)
        assert done.status == "SUCCEEDED", dump(done)
        events = await client.events(slow.task_id)
        assert [e.status for e in events] == ["RUNNING", "SUCCEEDED"]
        assert [(c.node_id, c.new_status) for c in events[1].changes] == [
            ("pair.second", "SUCCEEDED")
        ]
