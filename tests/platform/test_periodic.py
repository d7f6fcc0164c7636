"""The periodic part: passes on the injectable clock, kicks, pauses chosen by the action,
failures that do not stop it, and a stop that ends it between passes."""

from __future__ import annotations

import asyncio

import pytest
from dispo.libs.periodic import Pause, Periodic


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.fixture
async def running():
    started: list[tuple[Periodic, asyncio.Task[None]]] = []

    def start(periodic: Periodic) -> Periodic:
        started.append((periodic, asyncio.create_task(periodic.run())))
        return periodic

    yield start
    for periodic, task in started:
        periodic.stop()
        await asyncio.wait_for(task, 5)


async def test_a_pass_at_once_then_one_per_interval_of_the_clock(manual_clock, running):
    calls: list[object] = []

    async def action() -> None:
        calls.append(manual_clock.now())

    running(Periodic("p", action, 10, manual_clock))
    await settle()
    assert len(calls) == 1
    manual_clock.advance(9)
    await settle()
    assert len(calls) == 1  # not before the interval has passed on the clock
    manual_clock.advance(1)
    await settle()
    assert len(calls) == 2
    manual_clock.advance(10)
    await settle()
    assert len(calls) == 3


async def test_first_after_interval_waits_before_the_first_pass(manual_clock, running):
    calls: list[int] = []

    async def action() -> None:
        calls.append(1)

    running(Periodic("p", action, 5, manual_clock, first_after_interval=True))
    await settle()
    assert calls == []
    manual_clock.advance(5)
    await settle()
    assert calls == [1]


async def test_a_failing_pass_is_logged_and_the_next_one_still_runs(manual_clock, running):
    calls: list[int] = []

    async def action() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database down")

    periodic = running(Periodic("p", action, 1, manual_clock))
    await settle()
    manual_clock.advance(1)
    await settle()
    assert len(calls) == 2 and periodic.passes == 2


async def test_the_action_chooses_the_next_pause_and_other_results_are_ignored(
    manual_clock, running
):
    results: list[object] = [Pause(0), Pause(0), 7, Pause(30)]
    calls: list[int] = []

    async def action() -> object:
        calls.append(1)
        return results.pop(0) if results else None

    running(Periodic("p", action, 10, manual_clock))
    await settle()
    assert len(calls) == 3  # two backlog passes at once, then 7 is not a pause: 10 s
    manual_clock.advance(10)
    await settle()
    assert len(calls) == 4  # returned Pause(30)
    manual_clock.advance(29)
    await settle()
    assert len(calls) == 4
    manual_clock.advance(1)
    await settle()
    assert len(calls) == 5


async def test_a_kick_runs_a_pass_now_and_a_kick_during_a_pass_runs_one_more(manual_clock, running):
    gate = asyncio.Event()
    calls: list[int] = []

    async def action() -> None:
        calls.append(1)
        if len(calls) == 2:
            await gate.wait()

    periodic = running(Periodic("p", action, 60, manual_clock))
    await settle()
    periodic.kick()
    await settle()
    assert len(calls) == 2  # the kick did not wait for the interval
    periodic.kick()  # while the second pass is still running
    gate.set()
    await settle()
    assert len(calls) == 3


async def test_stop_ends_the_part_while_it_waits(manual_clock):
    async def action() -> None:
        return None

    periodic = Periodic("p", action, 3600, manual_clock)
    task = asyncio.create_task(periodic.run())
    await settle()
    periodic.stop()
    await asyncio.wait_for(task, 5)
    assert periodic.passes == 1


def test_an_interval_must_be_positive(manual_clock):
    async def action() -> None:
        return None

    with pytest.raises(ValueError, match="interval"):
        Periodic("p", action, 0, manual_clock)
