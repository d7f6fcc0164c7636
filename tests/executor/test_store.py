"""The executor's store (:mod:`dispo.executor.store`): its guarded, list-shaped writes
against real PostgreSQL, including true races."""

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from dispo.executor import plan
from dispo.executor.breaker import Breaker
from dispo.executor.envelope import overlay_row
from dispo.executor.passes import Opening, Passes, Step, apply_redrives
from dispo.executor.slots import Slots
from dispo.executor.states import CHECKED_COLUMNS, NodeState, TaskState
from dispo.executor.store import node_runs, status_events, task_runs
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import ACK
from dispo.libs.contracts import tasks
from dispo.libs.db.checks import enum_check_drift, enum_checks
from dispo.libs.states import IllegalTransition
from sqlalchemy import text

NOW = datetime(2026, 1, 1, tzinfo=UTC)


async def record_task(conn, env):
    """Record a task and its nodes, RUNNING under a lease that has expired: any owner may
    open it."""
    await task_runs.tasks_insert_many(conn, [(env, "recorder")], NOW - timedelta(minutes=1), 10)


async def task_row(conn, task_id):
    rows, _ = await task_runs.tasks_lock_many(conn, [task_id], lock=False, envelopes=True)
    return rows.get(task_id)


async def claim_node(conn, task_id, node_id, owner, now=NOW) -> bool:
    return bool(await node_runs.nodes_claim_if_pending_many(conn, [(task_id, node_id, owner)], now))


async def move(conn, task_id, node_id, expected, new, owner=None, **fields) -> bool:
    change = plan.NodeChange(task_id, node_id, expected, new, owner, fields)
    [applied] = await node_runs.nodes_set_status_if_many(conn, [change])
    return applied


async def set_status(conn, task_id, new, reason, now, *, expected) -> bool:
    change = plan.TaskStatusChange(task_id, expected, new, reason)
    return task_id in await task_runs.tasks_set_status_if_many(conn, [change], NOW)


async def nodes_of(conn, env):
    return (await node_runs.nodes_get_many(conn, [env]))[env.task_id]


def envelope(task_id="t1"):
    env = task_pb2.Task(task_id=task_id, business="b", status=common_pb2.TASK_STATUS_ACCEPTED)
    env.nodes.add(
        node_id="a.x", status=common_pb2.NODE_STATUS_PENDING, spec=task_pb2.ActionSpec(kind="noop")
    )
    return env


async def test_database_checks_mirror_the_state_machines(service_engine):
    engine = await service_engine("executor")
    async with engine.connect() as conn:
        assert await enum_check_drift(conn, "executor", CHECKED_COLUMNS) == {}
    gateway = await service_engine("gateway")
    async with gateway.connect() as conn:
        live = await enum_checks(conn, "gateway")
    assert live[("tasks", "ck_task_status")] == {s.value for s in TaskState}
    # Stored values are the lower-case member names (ADR 0016).
    assert all(s.value == s.name.lower() for s in (*NodeState, *TaskState))


async def test_exactly_one_of_concurrent_lease_takers_wins(service_db):
    db = await service_db("executor")
    async with db.transaction() as conn:
        await record_task(conn, envelope())

    async def take(owner):
        async with db.transaction() as conn:
            return await task_runs.tasks_open_many(conn, [("t1", owner)], NOW, 10) == {"t1"}

    results = await asyncio.gather(*(take(f"o{i}") for i in range(8)))

    assert sorted(results) == [False] * 7 + [True]


async def test_concurrent_first_recordings_of_a_task_open_it_once_with_its_nodes(service_db):
    db = await service_db("executor")
    two = envelope("t2")
    two.nodes.add(node_id="b.y", status=common_pb2.NODE_STATUS_PENDING)

    async def record(owner):
        async with db.transaction() as conn:
            return await task_runs.tasks_insert_many(
                conn, [(two, owner), (envelope(), owner)], NOW, 10
            )

    results = await asyncio.gather(*(record(f"o{i}") for i in range(6)))

    # One transaction recorded both tasks; the others found them recorded and left them.
    assert sorted(map(sorted, results)) == [[]] * 5 + [["t1", "t2"]]
    winner = f"o{[bool(r) for r in results].index(True)}"
    async with db.connection() as conn:
        tasks = await conn.fetch("SELECT task_id, status, lease_owner, lease_until FROM task_runs")
        nodes = await conn.fetch("SELECT task_id, node_id, status FROM node_runs ORDER BY 1, 2")
    # Recorded opened: RUNNING under the winner's lease, with the envelope's nodes.
    expiry = NOW + timedelta(seconds=10)
    assert sorted(tasks) == [("t1", "running", winner, expiry), ("t2", "running", winner, expiry)]
    assert nodes == [("t1", "a.x", "pending"), ("t2", "a.x", "pending"), ("t2", "b.y", "pending")]


async def test_exactly_one_of_concurrent_node_claims_wins_and_only_the_owner_records(
    service_db,
):
    db = await service_db("executor")
    async with db.transaction() as conn:
        await record_task(conn, envelope())
        await task_runs.tasks_open_many(conn, [("t1", "me")], NOW, 10)

    async def claim():
        async with db.transaction() as conn:
            return await claim_node(conn, "t1", "a.x", "me")

    results = await asyncio.gather(*(claim() for _ in range(8)))
    assert sorted(results) == [False] * 7 + [True]

    async with db.transaction() as conn:
        assert not await claim_node(conn, "t1", "a.x", "other")  # not the lease holder
        assert not await move(
            conn, "t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, owner="other"
        )
        assert await move(conn, "t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, owner="me")
        # A SUCCEEDED node is never claimed again, and a redrive cannot reset it: not by
        # naming it, not by writing PENDING for it in the envelope.
        assert not await claim_node(conn, "t1", "a.x", "me")
        newer = envelope()
        newer.generation = 5
        newer.redrive.reset_nodes.append("a.x")
        assert await apply_redrives(conn, [newer]) == {"t1": []}
        nodes = await nodes_of(conn, newer)
    assert nodes["a.x"].status is NodeState.SUCCEEDED


async def _node_row(conn, task_id="t1", node_id="a.x"):
    return (
        await conn.fetch(
            "SELECT status, attempts, last_error FROM node_runs WHERE task_id = :t AND node_id = :n",
            {"t": task_id, "n": node_id},
        )
    )[0]


async def test_an_undeclared_node_or_task_move_is_refused_and_changes_nothing(service_db):
    db = await service_db("executor")
    async with db.transaction() as conn:
        await record_task(conn, envelope())
        assert await task_runs.tasks_open_many(conn, [("t1", "me")], NOW, 10) == {"t1"}  # RUNNING
        assert await claim_node(conn, "t1", "a.x", "me")
        assert await move(conn, "t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, owner="me")
        assert await set_status(
            conn, "t1", TaskState.SUCCEEDED, "done", NOW, expected=(TaskState.RUNNING,)
        )
    async with db.transaction() as conn:
        before = await _node_row(conn)
        with pytest.raises(
            IllegalTransition, match="node state cannot move from succeeded to pending"
        ):
            await move(
                conn, "t1", "a.x", NodeState.SUCCEEDED, NodeState.PENDING, last_error="again"
            )
        with pytest.raises(
            IllegalTransition, match="task state cannot move from succeeded to running"
        ):
            await set_status(
                conn, "t1", TaskState.RUNNING, "", NOW, expected=(TaskState.SUCCEEDED,)
            )
        # One allowed source does not cover a forbidden one in the same guard.
        with pytest.raises(IllegalTransition, match="from accepted to succeeded"):
            await set_status(
                conn,
                "t1",
                TaskState.SUCCEEDED,
                "",
                NOW,
                expected=(TaskState.RUNNING, TaskState.ACCEPTED),
            )
    async with db.connection() as conn:
        assert await _node_row(conn) == before
        task = await task_row(conn, "t1")
    assert (task.status, task.status_reason) == (TaskState.SUCCEEDED, "done")


async def test_concurrent_results_for_one_running_node_exactly_one_is_recorded(service_db):
    db = await service_db("executor")
    async with db.transaction() as conn:
        await record_task(conn, envelope())
        await task_runs.tasks_open_many(conn, [("t1", "me")], NOW, 10)
        assert await claim_node(conn, "t1", "a.x", "me")

    async def record(new, error):
        async with db.transaction() as conn:
            return await move(
                conn, "t1", "a.x", NodeState.RUNNING, new, owner="me", last_error=error
            )

    outcomes = [(NodeState.SUCCEEDED, ""), (NodeState.FAILED, "boom"), (NodeState.UNKNOWN, "?")]
    results = await asyncio.gather(*(record(new, error) for new, error in outcomes * 3))
    assert sorted(results) == [False] * 8 + [True]
    winner = outcomes[results.index(True) % 3]
    async with db.connection() as conn:
        row = await _node_row(conn)
    assert (row.status, row.last_error) == (winner[0].value, winner[1])


def _two_node_envelope(generation, first, second):
    env = task_pb2.Task(task_id="t2", business="b", generation=generation)
    for node_id, status in (("a.x", first), ("b.x", second)):
        env.nodes.add(node_id=node_id, status=status, spec=task_pb2.ActionSpec(kind="noop"))
    return env


async def test_a_redrive_never_takes_the_node_states_written_in_its_envelope(service_db):
    db = await service_db("executor")
    async with db.transaction() as conn:
        await record_task(
            conn,
            _two_node_envelope(1, common_pb2.NODE_STATUS_DEMOTED, common_pb2.NODE_STATUS_FAILED),
        )
    # States in the envelope, declared moves or not (FAILED -> DEMOTED is not): none taken.
    written = _two_node_envelope(2, common_pb2.NODE_STATUS_PENDING, common_pb2.NODE_STATUS_DEMOTED)
    async with db.transaction() as conn:
        assert await apply_redrives(conn, [written]) == {"t2": []}
    async with db.connection() as conn:
        nodes = await nodes_of(conn, written)
        task = await task_row(conn, "t2")
    assert (nodes["a.x"].status, nodes["b.x"].status) == (NodeState.DEMOTED, NodeState.FAILED)
    assert task.generation == 2

    # Naming the nodes to reset is what moves them, by declared moves only.
    redrive = _two_node_envelope(3, common_pb2.NODE_STATUS_DEMOTED, common_pb2.NODE_STATUS_FAILED)
    redrive.redrive.reset_nodes.extend(["a.x", "b.x"])
    async with db.transaction() as conn:
        assert await apply_redrives(conn, [redrive]) == {"t2": ["a.x", "b.x"]}
        nodes = await nodes_of(conn, redrive)
        task = await task_row(conn, "t2")
    assert (nodes["a.x"].status, nodes["b.x"].status) == (NodeState.PENDING, NodeState.PENDING)
    assert task.generation == 3


@pytest.mark.blank_database  # migrates both schemas from nothing, step by step
async def test_the_casing_migrations_rewrite_stored_states_and_their_checks(database_url):
    from pathlib import Path

    from dispo.libs.db import create_engine, migrate
    from sqlalchemy.exc import IntegrityError

    services = Path(__file__).resolve().parents[2] / "services"
    executor = create_engine(database_url, "executor")
    gateway = create_engine(database_url, "gateway")
    try:
        await migrate(executor, "executor", services / "executor" / "migrations", "0001")
        await migrate(gateway, "gateway", services / "gateway" / "migrations", "0002")
        async with executor.begin() as conn:  # rows as the upper-case releases wrote them
            await conn.execute(
                text(
                    "INSERT INTO task_runs (task_id, status, created_at, updated_at)"
                    " VALUES ('old', 'RETRY_EXHAUSTED', :now, :now)"
                ),
                {"now": NOW},
            )
            await conn.execute(
                text(
                    "INSERT INTO node_runs (task_id, node_id, position, status)"
                    " VALUES ('old', 'a.x', 0, 'DEPENDENCY_FAILED')"
                )
            )
        async with gateway.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO tasks (task_id, business, request_hash, status, node_count, view,"
                    " created_at, updated_at) VALUES ('old', 'b', 'h', 'DEMOTED', 1, '', :now, :now)"
                ),
                {"now": NOW},
            )

        await migrate(executor, "executor", services / "executor" / "migrations")
        await migrate(gateway, "gateway", services / "gateway" / "migrations")

        async with executor.connect() as conn:
            task = (
                await conn.execute(text("SELECT status FROM task_runs WHERE task_id = 'old'"))
            ).one()
            node = (
                await conn.execute(
                    text("SELECT status FROM node_runs WHERE task_id = 'old' AND node_id = 'a.x'")
                )
            ).one()
            assert await enum_check_drift(conn, "executor", CHECKED_COLUMNS) == {}
        assert task.status == TaskState.RETRY_EXHAUSTED.value
        assert node.status == NodeState.DEPENDENCY_FAILED.value == "dependency_failed"
        async with gateway.connect() as conn:
            status = (
                await conn.execute(text("SELECT status FROM tasks WHERE task_id = 'old'"))
            ).scalar_one()
        assert status == "demoted"
        async with executor.begin() as conn:  # the old spelling is refused from now on
            with pytest.raises(IntegrityError, match="ck_node_run_status"):
                await conn.execute(
                    text("UPDATE node_runs SET status = 'PENDING' WHERE task_id = 'old'")
                )
    finally:
        await executor.dispose()
        await gateway.dispose()


def many(task_id: str, states: dict[str, NodeState]) -> task_pb2.Task:
    env = task_pb2.Task(task_id=task_id, business="b", status=common_pb2.TASK_STATUS_ACCEPTED)
    for node_id, state in states.items():
        env.nodes.add(
            node_id=node_id, status=state.to_proto(), spec=task_pb2.ActionSpec(kind="noop")
        )
    return env


async def test_a_redrive_resets_the_named_nodes_under_the_executor_state_table(service_db):
    N = NodeState
    recorded = {
        "failed": N.FAILED,
        "demoted": N.DEMOTED,
        "blocked": N.DEPENDENCY_FAILED,
        "unknown": N.UNKNOWN,
        "probed": N.UNKNOWN,
        "running": N.RUNNING,
        "done": N.SUCCEEDED,
        "cancelled": N.CANCELLED,
        "waiting": N.PENDING,
        "untouched": N.FAILED,
    }
    db = await service_db("executor")
    async with db.transaction() as conn:
        await record_task(conn, many("t2", recorded))
        await conn.fetch(
            "UPDATE node_runs SET round_attempts = 3, retryable = true, not_before = :nb,"
            " finished_at = :nb WHERE task_id = 't2'",
            {"nb": NOW},
        )
    # The envelope's own node states are the publisher's picture: every one says
    # SUCCEEDED here, and none of that is taken.
    redrive = many("t2", dict.fromkeys(recorded, N.SUCCEEDED))
    redrive.generation = 3
    redrive.redrive.reset_nodes.extend(
        ["failed", "demoted", "blocked", "unknown", "running", "done", "cancelled", "gone"]
    )
    redrive.redrive.settled_nodes.extend(["probed", "failed", "untouched"])
    async with db.transaction() as conn:
        [reset] = (await apply_redrives(conn, [redrive])).values()
        nodes = await nodes_of(conn, redrive)
        generation = (await conn.fetch("SELECT generation FROM task_runs WHERE task_id = 't2'"))[0][
            0
        ]

    assert reset == ["failed", "demoted", "blocked", "unknown"]
    assert {n: nodes[n].status for n in recorded} == {
        "failed": N.PENDING,
        "demoted": N.PENDING,
        "blocked": N.PENDING,
        "unknown": N.PENDING,
        "probed": N.SUCCEEDED,
        "running": N.RUNNING,
        "done": N.SUCCEEDED,
        "cancelled": N.CANCELLED,
        "waiting": N.PENDING,
        "untouched": N.FAILED,
    }
    for node_id in reset:  # a fresh short-retry round, runnable now
        n = nodes[node_id]
        assert (n.round_attempts, n.retryable, n.not_before, n.finished_at) == (
            0,
            False,
            None,
            None,
        )
    assert nodes["waiting"].not_before is None and nodes["waiting"].round_attempts == 3
    assert nodes["untouched"].round_attempts == 3 and nodes["untouched"].retryable
    assert generation == 3


async def test_overlapping_batch_openings_run_every_noop_node_once(service_db):
    """Four executors open the same thirty tasks, each as one batch in its own transaction
    and its own order: every task is opened by one of them, every node claimed and
    recorded once, one status event per task."""
    db = await service_db("executor")
    passes = Passes({}, lease_ttl=10)
    envs = []
    for i in range(30):
        env = envelope(f"t{i:02}")
        env.nodes.add(
            node_id="b.x",
            depends_on=["a.x"],
            status=common_pb2.NODE_STATUS_PENDING,
            spec=task_pb2.ActionSpec(kind="noop"),
        )
        envs.append(env)

    async def open_batch(owner: str, order: list[task_pb2.Task]):
        async with db.transaction() as conn:
            return await passes.open_many(conn, [Opening(e, owner) for e in order], NOW)

    orders = [envs, envs[::-1], envs[1::2] + envs[::2], envs[15:] + envs[:15]]
    results = await asyncio.gather(*(open_batch(f"o{k}", o) for k, o in enumerate(orders)))

    for steps in results:
        assert all(isinstance(s, Step) and s.disposition == ACK for s in steps), steps
    async with db.connection() as conn:
        nodes = await conn.fetch("SELECT status, attempts, run_owner FROM node_runs")
        tasks_ = await conn.fetch("SELECT status, lease_owner FROM task_runs")
        events = await conn.fetch("SELECT subject, count(*) AS n FROM outbox GROUP BY subject")
    assert len(nodes) == 60 and {(n.status, n.attempts) for n in nodes} == {("succeeded", 1)}
    assert len(tasks_) == 30 and {(t.status, t.lease_owner) for t in tasks_} == {
        ("succeeded", None)
    }
    # task.status.<id>.succeeded, once for each task
    assert len(events) == 30 and {e.n for e in events} == {1}


async def test_opening_and_running_noop_tasks_updates_their_rows_on_their_own_pages(
    service_db,
):
    """The run tables keep room on each page (ADR-0061): the task and node rows an opening
    inserts and then records are updated on their own pages (HOT updates, no new primary
    key entry), though the opening's writes are one transaction."""
    db = await service_db("executor")
    passes = Passes({}, lease_ttl=10)
    envs = [envelope(f"hot{i:02}") for i in range(40)]
    async with db.transaction() as conn:
        steps = await passes.open_many(conn, [Opening(e, "o1") for e in envs], NOW)
        counts = await conn.fetch(
            "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
            " WHERE relname IN ('task_runs', 'node_runs')"
        )
    assert all(isinstance(s, Step) for s in steps)
    updates = {r.relname: (r.n_tup_upd, r.n_tup_hot_upd) for r in counts}
    for table in ("task_runs", "node_runs"):
        updated, hot = updates[table]
        assert updated >= 40 and hot >= 0.9 * updated, updates


async def test_set_based_node_writes_are_checked_and_guarded_row_by_row(service_db):
    db = await service_db("executor")
    async with db.transaction() as conn:
        for task_id in ("t1", "t2", "t3"):
            await record_task(conn, envelope(task_id))
        await task_runs.tasks_open_many(conn, [("t1", "me"), ("t2", "me"), ("t3", "me")], NOW, 10)
        won = await node_runs.nodes_claim_if_pending_many(
            conn, [("t1", "a.x", "me"), ("t2", "a.x", "other"), ("t3", "a.x", "me")], NOW
        )
        assert set(won) == {("t1", "a.x", "me"), ("t3", "a.x", "me")}  # t2: not its lease
        assert won[("t1", "a.x", "me")] == node_runs.Claimed(1, 1)
        done = {"finished_at": NOW, "last_error": "", "retryable": False}
        applied = await node_runs.nodes_set_status_if_many(
            conn,
            [
                plan.NodeChange("t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, "me", done),
                plan.NodeChange("t3", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, "x", done),
                plan.NodeChange("t2", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, "me", done),
            ],
        )
        assert applied == [True, False, False]  # t3: another owner; t2: not RUNNING
        with pytest.raises(IllegalTransition):
            await node_runs.nodes_set_status_if_many(
                conn,
                [
                    plan.NodeChange("t3", "a.x", NodeState.RUNNING, NodeState.FAILED, "me"),
                    plan.NodeChange("t2", "a.x", NodeState.PENDING, NodeState.SUCCEEDED),
                ],
            )
        assert (await _node_row(conn, "t3")).status == "running"  # nothing was written
        locked, _ = await task_runs.tasks_lock_many(conn, ["t1", "t2", "t3"])
        written = await status_events.tasks_write_many(
            conn,
            [
                plan.TaskWrite("t1", "me", TaskState.SUCCEEDED, emit=True),
                plan.TaskWrite("t2", "other", TaskState.FAILED, "broken", emit=True),
            ],
            locked,
            NOW,
            [("t2", tasks.TASK_FAIL, tasks.fail_id("t2", 0))],
        )
        assert set(written) == {"t1"}  # t2: not other's lease, so neither its events
        t1 = await task_row(conn, "t1")
        assert t1.status is TaskState.SUCCEEDED and t1.lease_owner is None
        assert t1.version == locked["t1"].version + 1 == written["t1"].version
        assert written["t1"].status == common_pb2.TASK_STATUS_SUCCEEDED
        # A row changed since it was read under the lock is not written (nor its events).
        stale = dataclasses.replace(locked["t2"], version=locked["t2"].version - 1)
        assert (
            await status_events.tasks_write_many(
                conn, [plan.TaskWrite("t2", "me")], {"t2": stale}, NOW
            )
            == {}
        )
        # Released without a new status (back before its backoff): with an event, or none.
        released = await status_events.tasks_write_many(
            conn, [plan.TaskWrite("t2", "me", emit=True), plan.TaskWrite("t3", "me")], locked, NOW
        )
        assert released["t3"] is None  # released, no event
        t2, t3 = await task_row(conn, "t2"), await task_row(conn, "t3")
        assert (t2.version, t2.lease_owner, t2.lease_until, t2.status) == (
            locked["t2"].version + 1, None, None, TaskState.RUNNING,
        )  # fmt: skip
        assert released["t2"].version == t2.version
        assert (t3.version, t3.lease_owner) == (locked["t3"].version, None)
        with pytest.raises(IllegalTransition):
            await status_events.tasks_write_many(
                conn, [plan.TaskWrite("t3", "me", TaskState.ACCEPTED)], {"t3": t3}, NOW
            )
        events = await conn.fetch("SELECT subject, msg_id FROM outbox ORDER BY id")
    assert [tuple(e) for e in events] == [
        (tasks.task_status("t1", common_pb2.TASK_STATUS_SUCCEEDED), f"t1:v{t1.version}"),
        (tasks.task_status("t2", common_pb2.TASK_STATUS_RUNNING), f"t2:v{t2.version}"),
    ]


async def test_two_owners_in_one_statement_only_the_lease_holder_is_answered(service_db):
    """Two passes of one task (a stale owner and the lease holder) in one flush: each
    statement updates the row once, and the answer names the owner that won, so the stale
    pass is never told it claimed, wrote or extended anything."""
    db = await service_db("executor")
    async with db.transaction() as conn:
        await record_task(conn, envelope("t1"))
        assert await task_runs.tasks_open_many(conn, [("t1", "holder")], NOW, 10) == {"t1"}
        for pair in (("stale", "holder"), ("holder", "stale")):  # in either order
            await conn.fetch(
                "UPDATE node_runs SET status = 'pending', run_owner = NULL, attempts = 0,"
                " round_attempts = 0"
            )
            won = await node_runs.nodes_claim_if_pending_many(
                conn, [("t1", "a.x", pair[0]), ("t1", "a.x", pair[1])], NOW
            )
            assert won == {("t1", "a.x", "holder"): node_runs.Claimed(1, 1)}
        done = {"finished_at": NOW, "last_error": "", "retryable": False}
        applied = await node_runs.nodes_set_status_if_many(
            conn,
            [
                plan.NodeChange("t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, "stale", done),
                plan.NodeChange(
                    "t1", "a.x", NodeState.RUNNING, NodeState.SUCCEEDED, "holder", done
                ),
            ],
        )
        assert applied == [False, True]
        extended = await task_runs.leases_extend_many(
            conn, [("t1", "stale"), ("t1", "holder")], NOW + timedelta(seconds=5), 10
        )
        assert extended == {("t1", "holder")}
        with pytest.raises(ValueError, match="without an owner"):
            await node_runs.nodes_set_status_if_many(
                conn,
                [
                    plan.NodeChange("t1", "a.x", NodeState.PENDING, NodeState.CANCELLED),
                    plan.NodeChange("t1", "a.x", NodeState.PENDING, NodeState.CANCELLED),
                ],
            )


async def test_lease_heartbeats_extend_only_the_leases_their_owners_hold(service_db):
    db = await service_db("executor")
    later = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
    async with db.transaction() as conn:
        for task_id in ("t1", "t2", "t3"):
            await record_task(conn, envelope(task_id))
        await task_runs.tasks_open_many(conn, [("t1", "a"), ("t2", "b"), ("t3", "a")], NOW, 10)

    # Two heartbeat flushes racing over overlapping tasks, in opposite orders: no deadlock,
    # and only a lease's holder extends it (t2 is b's; "gone" was never recorded).
    async def beat(leases):
        async with db.transaction() as conn:
            return await task_runs.leases_extend_many(conn, leases, later, 10)

    first, second = await asyncio.gather(
        beat([("t1", "a"), ("t2", "a"), ("t3", "a")]),
        beat([("t3", "a"), ("gone", "a"), ("t2", "b"), ("t1", "b")]),
    )
    assert (first, second) == ({("t1", "a"), ("t3", "a")}, {("t3", "a"), ("t2", "b")})
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT task_id, lease_owner, lease_until FROM task_runs")
        leases = {r.task_id: (r.lease_owner, r.lease_until) for r in rows}
    expected = datetime(2026, 1, 1, 0, 0, 40, tzinfo=UTC)
    assert leases == {"t1": ("a", expected), "t2": ("b", expected), "t3": ("a", expected)}


async def test_first_recorded_tasks_publish_the_node_states_their_rows_hold(service_db):
    """The status snapshot of a task settled in the pass that recorded it is built from the
    pass's own node states, not a re-read: it must say what the rows say, field by field,
    for nodes run (noop) and demoted behind an open breaker, beside a task seen before
    (whose nodes are read). A task that goes on running publishes nothing yet: its step
    is progress, for the pass's reporter (ADR-0059)."""
    db = await service_db("executor")

    def with_http(task_id: str, downstream: str) -> task_pb2.Task:
        env = envelope(task_id)
        env.nodes.add(
            node_id="b.y",
            depends_on=["a.x"],
            status=common_pb2.NODE_STATUS_PENDING,
            spec=task_pb2.ActionSpec(kind="http", downstream=downstream, method="POST", path="/"),
        )
        return env

    seen = with_http("seen", "flaky")
    retried = with_http("retried", "down")
    retried.nodes.add(
        node_id="c.z",
        depends_on=["a.x"],
        status=common_pb2.NODE_STATUS_PENDING,
        spec=task_pb2.ActionSpec(kind="http", downstream="up", method="POST", path="/"),
    )
    async with db.transaction() as conn:  # a first pass ran a.x and left b.y to launch
        [first, _] = await Passes({}, lease_ttl=10).open_many(
            conn, [Opening(seen, "first"), Opening(retried, "first")], NOW
        )
        # as a short retry leaves it: its next task.create comes at the new generation
        await conn.fetch(
            "UPDATE task_runs SET status_reason = 'short retry', generation = 1"
            " WHERE task_id = 'retried'"
        )
    assert [n.node_id for n in first.launch] == ["b.y"]
    retried.generation = 1
    later = NOW + timedelta(seconds=30)  # its lease has expired
    breakers = {"down": Breaker(), "flaky": Breaker(), "up": Breaker()}
    breakers["down"].trip(later)
    breakers["flaky"].trip(later)
    batch = [
        envelope("noop"), with_http("demoted", "down"), with_http("launched", "up"), seen, retried
    ]  # fmt: skip
    async with db.transaction() as conn:
        steps = await Passes(breakers, lease_ttl=10).open_many(
            conn, [Opening(e, "me") for e in batch], later
        )
    assert [s.disposition for s in steps] == [ACK, ACK, None, ACK, None]
    assert [n.node_id for n in steps[2].launch] == ["b.y"]
    async with db.connection() as conn:
        events = await conn.fetch(
            "SELECT payload FROM outbox WHERE subject LIKE 'task.status.%' ORDER BY id"
        )
        rows = {
            (r.task_id, r.node_id): r
            for r in await conn.fetch(
                "SELECT *, octet_length(output) AS output_bytes FROM node_runs"
            )
        }
        task_rows = {r.task_id: r for r in await conn.fetch("SELECT * FROM task_runs")}
    snapshots = [task_pb2.Task.FromString(e.payload) for e in events]
    published = {s.task_id: s for s in snapshots if s.updated_at.ToDatetime(UTC) == later}
    assert set(published) == {"noop", "demoted", "seen"}
    assert [s.state.unreported for s in steps] == [False, False, True, False, True]
    for task_id, snapshot in published.items():  # the task's own fields, as its row holds them
        row = task_rows[task_id]
        assert (
            TaskState.from_proto(snapshot.status).value, snapshot.status_reason,
            snapshot.generation, snapshot.version, snapshot.cancel_requested,
        ) == (
            row.status, row.status_reason, row.generation, row.version, row.cancel_requested
        ), task_id  # fmt: skip
    assert (task_rows["retried"].status_reason, task_rows["retried"].generation) == ("", 1)
    for task_id in ("demoted", "seen"):
        node = {n.node_id: n for n in published[task_id].nodes}["b.y"]
        assert node.status == common_pb2.NODE_STATUS_DEMOTED and "circuit open" in node.last_error
    for snapshot in published.values():
        expected = task_pb2.Task()
        expected.CopyFrom(snapshot)
        for node in expected.nodes:
            overlay_row(node, rows[(snapshot.task_id, node.node_id)])
        assert snapshot == expected, snapshot.task_id


async def test_a_step_claims_the_http_nodes_it_launches_while_their_downstream_has_a_slot(
    service_db,
):
    """A ready HTTP node is claimed by the step that launches it when its downstream has a
    call slot free: RUNNING in the same transaction, the slot taken for its call, the
    task's snapshot saying so. With no slot free (or none queued ahead) it stays PENDING
    for the node to claim once it has one."""
    db = await service_db("executor")

    def task(task_id: str, downstream: str, calls: int) -> task_pb2.Task:
        env = envelope(task_id)  # a.x: noop, run in the step; the calls follow it
        for k in range(calls):
            env.nodes.add(
                node_id=f"c{k}.y",
                depends_on=["a.x"],
                status=common_pb2.NODE_STATUS_PENDING,
                spec=task_pb2.ActionSpec(kind="http", downstream=downstream, path="/"),
            )
        return env

    slots = {"up": Slots(2), "full": Slots(1)}
    assert await slots["full"].take_now()  # another node's call holds it
    taken: list[Slots] = []
    async with db.transaction() as conn:
        steps = await Passes({}, lease_ttl=10, slots=slots).open_many(
            conn, [Opening(task("three", "up", 3), "me"), Opening(task("one", "full", 1), "me")], NOW,
            taken=taken,
        )  # fmt: skip
    three, one = steps
    assert [n.node_id for n in three.launch] == ["c0.y", "c1.y", "c2.y"]
    # two slots: the first two claimed (RUNNING, counted), the third still to claim
    assert [(n.status, n.attempts) for n in three.launch] == [
        (NodeState.RUNNING, 1), (NodeState.RUNNING, 1), (NodeState.PENDING, 0)
    ]  # fmt: skip
    assert [n.node_id for n in one.launch] == ["c0.y"]
    assert one.launch[0].status is NodeState.PENDING
    assert taken == [slots["up"], slots["up"]] and slots["up"].held == 2

    async with db.connection() as conn:
        rows = {
            (r.task_id, r.node_id): r
            for r in await conn.fetch(
                "SELECT *, octet_length(output) AS output_bytes FROM node_runs"
            )
        }
        events = (
            await conn.fetch("SELECT count(*) FROM outbox WHERE subject LIKE 'task.status.%'")
        )[0][0]
    claimed_rows = {k for k, r in rows.items() if r.status == "running"}
    assert claimed_rows == {("three", "c0.y"), ("three", "c1.y")}
    assert {rows[k].run_owner for k in claimed_rows} == {"me"}
    assert rows[("three", "c2.y")].status == "pending" and rows[("one", "c0.y")].status == "pending"
    # both go on running: the step is progress, published later by the pass's reporter
    assert events == 0 and three.state.unreported and one.state.unreported


async def test_a_later_step_reads_its_nodes_states_again_into_the_nodes_it_made_before(
    service_db,
):
    """A pass keeps the nodes its last step had (their specs decoded once); the next step
    reads every state column again from the rows into them: what another transaction
    wrote shows, and nothing the pass kept in memory outlives the rows."""
    db = await service_db("executor")
    env = envelope("kept")
    env.nodes.add(
        node_id="b.y",
        depends_on=["a.x"],
        status=common_pb2.NODE_STATUS_PENDING,
        spec=task_pb2.ActionSpec(kind="http", downstream="up", path="/b"),
    )
    async with db.transaction() as conn:
        [step] = await Passes({}, lease_ttl=10).open_many(conn, [Opening(env, "me")], NOW)
    kept = step.state.nodes
    assert set(kept) == {"a.x", "b.y"} and kept["a.x"].status is NodeState.SUCCEEDED
    kept["b.y"].last_error = "only in memory"
    later = NOW + timedelta(seconds=5)
    async with db.transaction() as conn:
        await conn.fetch(
            "UPDATE node_runs SET status = 'running', attempts = 2, round_attempts = 1,"
            " started_at = :t, not_before = NULL, last_error = 'from the row',"
            " retryable = true WHERE task_id = 'kept' AND node_id = 'b.y'",
            {"t": later},
        )
    async with db.connection() as conn:
        nodes = (await node_runs.nodes_get_many(conn, [env], {"kept": kept}))["kept"]
        fresh = (await node_runs.nodes_get_many(conn, [env]))["kept"]
    assert nodes["b.y"] is kept["b.y"] and nodes["a.x"] is kept["a.x"]
    assert nodes == fresh  # the same states as nodes made anew from the envelope and rows
    b = nodes["b.y"]
    assert (b.status, b.attempts, b.round_attempts, b.started_at, b.last_error, b.retryable) == (
        NodeState.RUNNING, 2, 1, later, "from the row", True
    )  # fmt: skip
    assert b.spec.path == "/b" and b.depends_on == ("a.x",)


async def test_outputs_are_recorded_with_success_and_read_per_request_within_one_read(service_db):
    """An output goes in with the move to SUCCEEDED; two reads of one task's outputs in
    one group-committed read each get the nodes they asked for; a step's rows carry the
    output's size, never the output."""
    from dispo.executor.commits import Flushes

    db = await service_db("executor")
    env = envelope("t1")
    env.nodes.add(node_id="b.y", status=common_pb2.NODE_STATUS_PENDING)
    async with db.transaction() as conn:
        await record_task(conn, env)
        await task_runs.tasks_open_many(conn, [("t1", "me")], NOW, 10)
        for node_id, output in (("a.x", b'{"n":1}'), ("b.y", b'"two"')):
            assert await claim_node(conn, "t1", node_id, "me")
            assert await move(
                conn, "t1", node_id, NodeState.RUNNING, NodeState.SUCCEEDED, "me", output=output
            )
        rows = (await node_runs.node_rows_many(conn, ["t1"]))["t1"]
    assert {n: (r.output_bytes, "output" in r.keys()) for n, r in rows.items()} == {
        "a.x": (7, False),
        "b.y": (5, False),
    }
    flushes = Flushes(db, None, None, None, 10)  # type: ignore[arg-type]  # reads only
    assert await flushes.outputs([("t1", ["a.x"]), ("t1", ["b.y", "gone"]), ("t2", ["a.x"])]) == [
        {"a.x": b'{"n":1}'},
        {"b.y": b'"two"'},
        {},
    ]
