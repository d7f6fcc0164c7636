"""Each sweep runs as its own periodic part: a sweep blocked in PostgreSQL holds up no other,
and a follower sweep runs right after its leader as one round used to run them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import pytest
from dispo.libs.periodic import Periodic
from dispo.reconciler.completion import facts
from dispo.reconciler.completion import store as cs
from dispo.reconciler.recovery import redrive
from dispo.reconciler.states import ReconcileState, RecoveryState
from dispo.reconciler.sweeps import FOLLOWS, SWEEPS, sweep_parts

from .conftest import creates, row
from .test_completion import finished
from .test_demoted_work import demoted
from .test_failed_work import failing


async def eventually(check, timeout: float = 15.0) -> None:
    """Poll ``check`` (sync, or async) until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.fixture
async def parts(recon) -> AsyncIterator[dict[str, Periodic]]:
    built = sweep_parts(recon, interval=1.0)
    tasks = [asyncio.create_task(p.run(), name=p.name) for p in built.values()]
    yield built
    for p in built.values():
        p.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)


def test_every_sweep_is_a_part_and_followers_follow_sweeps_that_exist(recon):
    built = sweep_parts(recon, interval=1.0)
    assert set(built) == set(SWEEPS)
    assert {p.name for p in built.values()} == {f"sweep {name}" for name in SWEEPS}
    assert set(FOLLOWS) <= set(SWEEPS) and set(FOLLOWS.values()) <= set(SWEEPS)


async def test_a_sweep_blocked_in_the_database_does_not_hold_up_the_redrive(
    recon, manual_clock, database_url, fake_downstream
):
    assert await redrive.intake(recon, demoted("d1"), "demote")  # the health sweep has work
    assert await redrive.intake(recon, failing("t1"), "fail")
    due = (await row(recon, "t1")).next_redrive_at

    blocker = await asyncpg.connect(database_url)
    transaction = blocker.transaction()
    await transaction.start()
    # The health sweep records its probe under this table's row lock: it blocks here.
    await blocker.execute("LOCK TABLE reconciler.downstream_state IN ACCESS EXCLUSIVE MODE")
    built = sweep_parts(recon, interval=1.0)
    tasks = [asyncio.create_task(p.run(), name=p.name) for p in built.values()]
    try:
        await eventually(lambda: fake_downstream.health_checks > 0)
        manual_clock.set(due)
        await eventually(_redriven(recon))
        assert [c.task_id for c in await creates(recon)] == ["t1"]
        assert built["health"].passes == 0  # still blocked on the lock all that time
    finally:
        await transaction.rollback()
        await blocker.close()
    await eventually(lambda: built["health"].passes >= 1)  # the lock gone: it finishes
    for p in built.values():
        p.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)


async def test_the_release_follows_each_health_pass_without_waiting_its_interval(
    recon, manual_clock, fake_downstream, parts
):
    fake_downstream.healthy = False
    assert await redrive.intake(recon, demoted("d1"), "demote")
    await eventually(_all_asleep(parts, manual_clock, health_passes=1))
    manual_clock.advance(seconds=1)  # a round: health finds the downstream down
    await eventually(_all_asleep(parts, manual_clock, health_passes=2))
    assert (await row(recon, "d1")).state is RecoveryState.DEMOTED

    fake_downstream.healthy = True
    releases = parts["release"].passes
    manual_clock.advance(seconds=1)  # one more round, and the clock stays there
    await eventually(_released(recon))
    # Released within that one round: by the pass the health sweep kicked, as the round
    # used to run health before release.
    assert parts["release"].passes <= releases + 2


async def test_a_pass_that_took_a_full_batch_runs_again_at_once(recon, manual_clock):
    """The reconcile sweep takes one batch of due rows a pass. Tasks finish faster than one
    batch per interval under load, so a pass that took a full batch is followed by another
    at once: the backlog drains with the clock standing still."""
    recon.settings.batch = 2
    for i in range(5):
        assert await facts.on_status(recon, finished(f"t{i}"))
    manual_clock.advance(seconds=61)  # past the reconcile delay, then the clock stands still
    built = sweep_parts(recon, interval=1.0)
    part = built["reconcile"]
    task = asyncio.create_task(part.run(), name=part.name)
    try:
        await eventually(_reconciled(recon, [f"t{i}" for i in range(5)]))
        assert part.passes >= 3  # 2 + 2 + 1 rows
    finally:
        part.stop()
        await asyncio.wait_for(task, 10)


def _reconciled(recon, task_ids):
    async def check() -> bool:
        async with recon.db.connection() as conn:
            rows = [await cs.completion_get(conn, task_id) for task_id in task_ids]
        return all(r.reconcile_state != ReconcileState.PENDING for r in rows)

    return check


async def test_a_callback_is_sent_when_its_task_finishes_not_at_the_next_interval(
    recon, manual_clock, receiver, ecommerce_secret, parts
):
    """Recording a finished task with a callback kicks the notify sweep: the callback goes
    out with the clock standing still, not a sweep interval later."""
    await receiver.start()
    await eventually(lambda: manual_clock.waiting >= len(parts))  # every part asleep
    passes = parts["notify"].passes
    assert await facts.on_status(recon, finished("now", callback_url=receiver.url))
    await eventually(lambda: len(receiver.received) == 1)
    await eventually(lambda: parts["notify"].passes == passes + 1)  # the kicked pass ends
    assert json.loads(receiver.received[0]["body"])["task_id"] == "now"


def _all_asleep(parts, clock, *, health_passes: int):
    """The health sweep has finished that many passes and every part waits on the clock
    again: only then does advancing the clock start the next round (advanced earlier, a
    part still in its pass would count its interval from the new time and never wake)."""
    return lambda: parts["health"].passes >= health_passes and clock.waiting >= len(parts)


def _redriven(recon):
    async def check() -> bool:
        return bool(await creates(recon))

    return check


def _released(recon):
    async def check() -> bool:
        return (await row(recon, "d1")).state is not RecoveryState.DEMOTED

    return check
