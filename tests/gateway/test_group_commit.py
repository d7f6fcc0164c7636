"""Group commit of Submit: concurrent Submits share one transaction per flush, and the
answers are those of one Submit at a time. Colliding idempotency keys inside one flush and
across concurrent flushes give one task per key; a flush cut by a PostgreSQL crash leaves
nothing behind. The gateway's use cases run in the test's process on the real database."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict

from dispo.gateway.expand import CellRequest, Submission
from dispo.gateway.operations import Accepted, Gateway
from dispo.libs.contracts import tasks
from dispo.libs.db import database_unreachable
from dispo.libs.errors import FailedPrecondition


def submission(key: str, variant: str, business: str = "tests") -> Submission:
    return Submission(business, [CellRequest("step", "", {"name": variant})], idempotency_key=key)


async def stored(gateway: Gateway) -> tuple[dict[tuple[str, str], list[str]], list[str]]:
    """Task ids per (business, key), and the task.create message ids in the outbox."""
    async with gateway.db.connection() as conn:  # the pool the Submit flushes write through
        rows = await conn.fetch(
            "SELECT business, coalesce(idempotency_key, ''), task_id FROM tasks"
        )
        by_key: dict[tuple[str, str], list[str]] = defaultdict(list)
        for business, key, task_id in rows:
            by_key[(business, key)].append(task_id)
        creates = await conn.scalars(
            "SELECT msg_id FROM outbox WHERE subject = 'task.create' ORDER BY id"
        )
    return by_key, creates


Winners = dict[tuple[str, str], tuple[str, str]]


def check_answers(
    subs: list[Submission], answers: list[Accepted | BaseException], taken: Winners | None = None
) -> Winners:
    """Every answer is what one Submit at a time would get: per key one task, one
    non-duplicate answer, the same request a duplicate of it, another request refused naming
    it. Returns the task and the request per keyed (business, key); with ``taken`` (keys
    recorded before), no Submit of those keys may be a first one."""
    winners: dict[tuple[str, str], str] = {k: task_id for k, (task_id, _) in (taken or {}).items()}
    requests: dict[tuple[str, str], str] = {k: name for k, (_, name) in (taken or {}).items()}
    for sub, answer in zip(subs, answers, strict=True):
        if sub.idempotency_key and isinstance(answer, Accepted) and not answer.duplicate:
            key = (sub.business, sub.idempotency_key)
            assert key not in winners, f"two tasks for {key}"
            winners[key], requests[key] = answer.task_id, sub.cells[0].payload["name"]
    for sub, answer in zip(subs, answers, strict=True):
        if not sub.idempotency_key:
            assert isinstance(answer, Accepted) and not answer.duplicate, answer
            continue
        key = (sub.business, sub.idempotency_key)
        assert key in winners, f"no Submit of {key} was accepted"
        if sub.cells[0].payload["name"] == requests[key]:
            assert isinstance(answer, Accepted), answer
            assert answer.task_id == winners[key]
        else:
            assert isinstance(answer, FailedPrecondition), answer
            assert winners[key] in str(answer)
    return {key: (task_id, requests[key]) for key, task_id in winners.items()}


async def test_colliding_keys_inside_one_flush_are_answered_as_one_at_a_time(make_gateway):
    gateway = make_gateway(submit_linger=0.2)  # every Submit below waits for the same flush
    subs = (
        [submission("a", "one") for _ in range(5)]
        + [submission("a", "two") for _ in range(3)]
        + [submission("b", "one") for _ in range(4)]
        + [submission("a", "one", business="other") for _ in range(2)]
        + [submission("", "one") for _ in range(3)]
    )
    random.Random(7).shuffle(subs)

    answers = await asyncio.gather(*(gateway.submit(s) for s in subs), return_exceptions=True)

    assert (gateway.submits.flushes, gateway.submits.flushed_items) == (1, len(subs))
    winners = {key: task_id for key, (task_id, _) in check_answers(subs, answers).items()}
    by_key, creates = await stored(gateway)
    keyed = {key: ids for key, ids in by_key.items() if key[1]}
    assert keyed == {key: [task_id] for key, task_id in winners.items()}
    assert len(by_key[("tests", "")]) == 3
    all_ids = [task_id for ids in by_key.values() for task_id in ids]
    assert sorted(creates) == sorted(tasks.create_id(task_id, 0) for task_id in all_ids)
    # The first Submit of a key in the flush is the one recorded.
    for key in winners:
        first = next(i for i, s in enumerate(subs) if (s.business, s.idempotency_key) == key)
        assert answers[first] == Accepted(winners[key], "accepted", False)


async def test_colliding_keys_across_concurrent_flushes_give_one_task_per_key(make_gateway):
    # Small flushes, two at a time: the same keys race between transactions in progress.
    gateway = make_gateway(submit_batch=7, submit_flushes=2)
    subs = [submission(f"k{i % 12}", random.Random(i).choice(["one", "two"])) for i in range(240)]
    random.Random(11).shuffle(subs)

    answers = await asyncio.gather(*(gateway.submit(s) for s in subs), return_exceptions=True)
    # And again, every key taken now: all answered from the stored tasks.
    again = await asyncio.gather(*(gateway.submit(s) for s in subs), return_exceptions=True)

    assert gateway.submits.flushes >= 2 * len(subs) // 7
    first_run = check_answers(subs, answers)
    assert check_answers(subs, again, first_run) == first_run  # no second task for any key
    assert all(a.duplicate for a in again if isinstance(a, Accepted))
    winners = {key: task_id for key, (task_id, _) in first_run.items()}
    by_key, creates = await stored(gateway)
    assert dict(by_key) == {key: [task_id] for key, task_id in winners.items()}
    assert len(winners) == 12
    assert sorted(creates) == sorted(tasks.create_id(task_id, 0) for task_id in winners.values())


async def submit_crashing_postgres(gateway, infra, subs, when: str) -> tuple[list, list[str]]:
    """Submit ``subs`` together while PostgreSQL stops (immediately) ``when`` ("before" or
    "after") the flush's write runs; restarted after. The answers, and the writes seen."""
    written: list[str] = []
    after = when == "after"

    def crash(statement, args) -> None:
        if "INSERT INTO tasks" in statement:
            written.append(statement)
            infra.postgres.stop("immediate")

    gateway.db.watch(crash, after=after)
    try:
        answers = await asyncio.gather(*(gateway.submit(s) for s in subs), return_exceptions=True)
    finally:
        gateway.db.unwatch(crash, after=after)
        infra.postgres.start()
    return answers, written


async def test_a_flush_cut_by_a_postgres_crash_leaves_nothing_behind(make_gateway, infra):
    gateway = make_gateway(submit_linger=0.1)
    subs = [submission(f"k{i}", "one") for i in range(10)] + [submission("", "one")]
    # The statement is sent to a server going down.
    answers, written = await submit_crashing_postgres(gateway, infra, subs, "before")

    # The tasks and their task.create rows are written by one statement: the flush's write.
    [statement] = written
    assert "INSERT INTO outbox" in statement
    assert gateway.submits.flushes == 0
    for answer in answers:
        # What the gRPC interceptor answers UNAVAILABLE: retry, nothing was written.
        assert isinstance(answer, Exception) and database_unreachable(answer), repr(answer)
    assert await stored(gateway) == ({}, [])
    # Retried, every Submit is a first one.
    retried = await asyncio.gather(*(gateway.submit(s) for s in subs))
    assert [a.duplicate for a in retried] == [False] * len(subs)
    by_key, creates = await stored(gateway)
    assert sum(len(ids) for ids in by_key.values()) == len(subs) == len(creates)


async def test_a_postgres_crash_right_after_the_flush_leaves_every_task_with_its_create(
    make_gateway, infra
):
    gateway = make_gateway(submit_linger=0.1)
    subs = [submission(f"k{i}", "one") for i in range(10)] + [submission("", "one")]

    # The write committed by itself; nothing after it ran.
    answers, _ = await submit_crashing_postgres(gateway, infra, subs, "after")

    # The write committed: every Submit is answered with its task, and each task has the
    # task.create event that takes it to an executor.
    assert [type(a) for a in answers] == [Accepted] * len(subs), answers
    try:
        by_key, creates = await stored(gateway)
    except Exception as error:  # the pool's connections died with the server: one error
        assert database_unreachable(error), repr(error)
        by_key, creates = await stored(gateway)
    ids = sorted(i for found in by_key.values() for i in found)
    assert ids == sorted(a.task_id for a in answers if isinstance(a, Accepted))
    assert sorted(creates) == sorted(tasks.create_id(i, 0) for i in ids)
