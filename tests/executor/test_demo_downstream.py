"""The demo downstream's counting switches, against the real process: ``dedupe: false``
counts an effect for every call, ``late_ms`` performs the effect and answers too late."""

import asyncio

import httpx


async def test_it_deduplicates_by_key_unless_told_not_to(downstream):
    async with httpx.AsyncClient() as http:
        for _ in range(2):
            await http.post(f"{downstream.url}/once/a", headers={"Idempotency-Key": "k1"})
        await downstream.control(dedupe=False)
        for _ in range(3):
            await http.post(f"{downstream.url}/once/a", headers={"Idempotency-Key": "k2"})
        probe = (await http.get(f"{downstream.url}/effects/k2")).json()
    state = await downstream.state()
    assert state["calls"] == {"k1": 2, "k2": 3}
    assert state["effects"] == {"k1": 1, "k2": 3}  # every call performed it again
    assert probe == {"done": True, "calls": 3}
    await downstream.control(reset=True)  # a reset deduplicates again
    async with httpx.AsyncClient() as http:
        for _ in range(2):
            await http.post(f"{downstream.url}/once/a", headers={"Idempotency-Key": "k3"})
    assert (await downstream.effects()) == {"k3": 1}


async def test_a_late_answer_comes_after_the_effect(downstream):
    await downstream.control(late_ms=5000)
    async with httpx.AsyncClient(timeout=0.3) as http:
        try:
            await http.post(f"{downstream.url}/once/a", headers={"Idempotency-Key": "k"})
        except httpx.TimeoutException:
            timed_out = True
        else:
            timed_out = False
        assert timed_out  # the caller saw a failure...
        probe = (await http.get(f"{downstream.url}/effects/k")).json()
    assert probe["done"] is True  # ...although the effect happened
    assert (await downstream.effects()) == {"k": 1}
    await downstream.control(late_ms=0)
    async with httpx.AsyncClient(timeout=5) as http:
        reply = await http.post(f"{downstream.url}/once/b", headers={"Idempotency-Key": "k4"})
    assert reply.json()["ok"] is True


async def test_it_records_the_most_calls_at_once_and_in_one_second(downstream):
    await downstream.control(reset=True, delay_ms=300)
    async with httpx.AsyncClient(timeout=5) as http:
        await asyncio.gather(
            *(
                http.post(f"{downstream.url}/labels/{i}", headers={"Idempotency-Key": f"c{i}"})
                for i in range(4)
            )
        )
        await http.post(f"{downstream.url}/labels/x", headers={"Idempotency-Key": "x"})
    state = await downstream.state()
    assert state["most_at_once"] == 4  # the four together, not the fifth after them
    assert 2 <= state["busiest_second"] <= 5  # four at once fall in at most two seconds
    await downstream.control(reset=True, delay_ms=0)
    assert (await downstream.state())["most_at_once"] == 0
