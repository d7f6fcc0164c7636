"""The executor's intake: passes start in the fair order, a flooding business's messages
beyond its hold go back to the stream, a paused business's wait until it resumes."""

import asyncio

from dispo.executor.intake import MAX_COMEBACK, Intake


async def _enter_all(intake: Intake, messages: list[tuple[str, int]]) -> list[asyncio.Task]:
    tasks = [asyncio.create_task(intake.enter(b, p)) for b, p in messages]
    await asyncio.sleep(0)
    return tasks


async def test_passes_start_in_the_fair_order_and_a_flood_beyond_its_hold_goes_back():
    intake = Intake(passes=1, hold=3)
    running = await _enter_all(intake, [("a", 3)])
    assert await running[0] is None  # nothing waited: it runs at once
    waiting = await _enter_all(intake, [("a", 3)] * 5 + [("b", 3)] * 2)
    # a holds three waiting; its fourth and fifth go back to the stream for later.
    assert [t.done() for t in waiting] == [False, False, False, True, True, False, False]
    assert all(0 < waiting[i].result() <= MAX_COMEBACK for i in (3, 4))
    assert intake.depths() == {"a": 3, "b": 2}
    order = []
    for _ in range(5):
        intake.leave("")
        await asyncio.sleep(0)
        started = [i for i, t in enumerate(waiting) if t.done() and i not in (3, 4, *order)]
        order += started
    assert order == [0, 5, 1, 6, 2]  # b's arrive behind a's backlog and take every other pass


async def test_handed_back_messages_come_back_spread_out_not_all_at_once():
    now = [0.0]
    intake = Intake(passes=2, hold=1, now=lambda: now[0])
    first = await _enter_all(intake, [("a", 3)] * 3)  # two run, one waits
    assert [t.done() for t in first] == [True, True, False]
    back = await _enter_all(intake, [("a", 3)] * 4)
    delays = [t.result() for t in back]
    assert delays == sorted(delays) and len(set(delays)) == 4


async def test_a_paused_business_waits_and_starts_on_resume():
    intake = Intake(passes=4, hold=16)  # paused: an eighth of it held, 2
    intake.pause("a")
    waiting = await _enter_all(intake, [("a", 3)] * 3 + [("b", 3)])
    assert [t.done() for t in waiting] == [False, False, True, True]
    assert waiting[2].result() == MAX_COMEBACK  # beyond its hold: back to the stream
    assert waiting[3].result() is None  # b is not paused
    assert intake.depths() == {"a": 2}
    intake.resume("a")
    await asyncio.sleep(0)
    assert all(t.done() and t.result() is None for t in waiting[:2])
    assert intake.running == 3


async def test_priority_orders_a_business_s_waiting_passes():
    intake = Intake(passes=1, hold=10)
    await _enter_all(intake, [("a", 3)])
    waiting = await _enter_all(intake, [("a", 5), ("a", 3), ("a", 1), ("a", 1)])
    order = []
    for _ in range(4):
        intake.leave("a")
        await asyncio.sleep(0)
        order += [i for i, t in enumerate(waiting) if t.done() and i not in order]
    assert order == [2, 3, 1, 0]


async def test_the_intake_holds_at_most_its_capacity_and_hands_all_back_once_closed():
    intake = Intake(passes=1, hold=10, capacity=3)
    await _enter_all(intake, [("a", 3)])
    waiting = await _enter_all(intake, [("a", 3), ("b", 3), ("c", 3), ("d", 3)])
    assert [t.done() for t in waiting] == [False, False, False, True]  # d: no room
    intake.close()
    await asyncio.sleep(0)
    assert all(t.done() and t.result() is not None for t in waiting)
    assert await intake.enter("e", 3) is not None  # closed: every message goes back
    assert intake.depths() == {} and intake.running == 1
