"""Real processes: the pool service and the pool-worker (local driver), killed mid-evaluation."""

from __future__ import annotations

import asyncio
from datetime import UTC
from pathlib import Path

import grpc
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.pool.v1 import pool_pb2 as pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.sdk import DispoError
from sqlalchemy import text
from support import eventually
from support.auth import admin_channel
from support.stack import alive


def create_request(target_url: str, evaluation_id: str, **schedule) -> pb.CreateEvaluationRequest:
    return pb.CreateEvaluationRequest(
        evaluation_id=evaluation_id,
        series="checkout-assistant",
        line=common_pb2.LINE_FORMAL,
        period="2026-01",
        configuration_json='{"prompt": "v3"}',
        target_url=target_url,
        cases=[
            pb.TestCase(
                id="capital",
                path="/answer",
                rules=[
                    pb.Rule(kind=pb.RULE_KIND_STATUS, value="200"),
                    pb.Rule(kind=pb.RULE_KIND_JSON_CONTAINS, path="$.answer", value="paris"),
                ],
            )
        ],
        **schedule,
    )


async def evaluation(address: str, evaluation_id: str) -> pb.Evaluation | None:
    try:
        async with admin_channel(address) as channel:
            return await pool_pb2_grpc.PoolServiceStub(channel).GetEvaluation(
                pb.GetEvaluationRequest(evaluation_id=evaluation_id), timeout=5
            )
    except grpc.aio.AioRpcError:
        return None


async def test_pool_service_and_worker_killed_mid_evaluation_lose_nothing(
    pool_stack, target, file_clock
):
    pool, worker = await pool_stack()
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        status = await eventually(lambda: _size(stub, 5))
        assert status.driver == pb.DRIVER_LOCAL and status.idle == 5
        target.hold = asyncio.Event()
        # 5 slots of 60 s, 2 runs each.
        await stub.CreateEvaluation(
            create_request(
                target.url, "survivor", window_seconds=300, slot_count=5, runs_per_slot=2
            )
        )
    # The event wakes a cron at once (no tick needed); its first run is now in flight.
    await eventually(lambda: target.waiting >= 1)
    held = await evaluation(pool.address, "survivor")
    assert held.status == pb.EVALUATION_STATUS_EXECUTING and held.assigned_cron_id
    cron_id = held.assigned_cron_id

    pool.kill()  # the pool service dies while the run is in flight
    target.hold.set()  # the run finishes; recording it fails
    # Nothing outside the worker shows its RecordRun reaching the dead pool (the call waits for
    # the pool to come back), so give it a moment; either outcome is accepted below.
    await asyncio.sleep(0.5)
    await pool.restart()
    after = await evaluation(pool.address, "survivor")
    # Nothing lost and never held by another cron: the in-flight run is recorded once (the
    # worker's call waits for the pool to come back) or redone on the next tick; if the worker
    # was quick, slot 0 is already finished and the cron back in the pool.
    assert after.status == pb.EVALUATION_STATUS_EXECUTING and after.runs_done <= 2
    assert after.assigned_cron_id in (cron_id, "")
    assert after.assigned_cron_id == cron_id or after.runs_done == 2

    file_clock.advance(seconds=60)  # the tick: the same cron resumes; slot 1 is due as well
    await eventually(lambda: _runs_done(pool.address, "survivor", 4))

    worker.kill()  # the driver dies too
    file_clock.advance(seconds=60)
    worker.spawn()  # restarts from the registry; busy crons pick up their evaluations
    await eventually(lambda: _runs_done(pool.address, "survivor", 6), timeout=60)

    file_clock.advance(seconds=60)  # slot 3 is due
    await eventually(lambda: _runs_done(pool.address, "survivor", 8), timeout=60)
    file_clock.advance(seconds=60)  # slot 4, the last
    done = await eventually(
        lambda: _status(pool.address, "survivor", pb.EVALUATION_STATUS_COMPLETED), timeout=60
    )
    assert done.runs_done == done.runs_total == 10
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        history = (
            await stub.ListAssignments(pb.ListAssignmentsRequest(evaluation_id="survivor"))
        ).assignments
        crons = (await stub.ListCrons(pb.ListCronsRequest())).crons
    # Assignments of the evaluation never overlap, and no cron still names it.
    spans = sorted((a.started_at.ToDatetime(), a.ended_at.ToDatetime()) for a in history)
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1))
    assert all(c.evaluation_id != "survivor" for c in crons)
    assert {a.end_reason for a in history} <= {
        pb.ASSIGNMENT_END_DONE,
        pb.ASSIGNMENT_END_COMPLETED,
    }  # no stuck cron, no force release
    assert target.calls >= 10


async def _size(stub, n: int):
    status = await stub.GetPoolStatus(pb.GetPoolStatusRequest())
    return status if status.size == n else None


async def _runs_done(address: str, evaluation_id: str, n: int):
    ev = await evaluation(address, evaluation_id)
    return ev if ev and ev.runs_done >= n else None


async def _status(address: str, evaluation_id: str, status: int):
    ev = await evaluation(address, evaluation_id)
    return ev if ev and ev.status == status else None


async def test_bad_requests_get_precise_statuses(pool_stack, target):
    pool, _ = await pool_stack()
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as bad:
            await stub.CreateEvaluation(create_request("not-a-url", "x1"))
        assert (
            bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            and "target_url" in bad.value.details()
        )
        for line in (common_pb2.LINE_UNSPECIFIED, 7):  # unset, and a number no line has
            no_line = create_request(target.url, "no-line")
            no_line.line = line
            with pytest.raises(grpc.aio.AioRpcError) as bad_line:
                await stub.CreateEvaluation(no_line)
            assert bad_line.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "line: must be LINE_FORMAL or LINE_TRIAL" in bad_line.value.details()
        no_kind = create_request(target.url, "no-kind")
        no_kind.cases[0].rules[0].kind = pb.RULE_KIND_UNSPECIFIED
        with pytest.raises(grpc.aio.AioRpcError) as bad_kind:
            await stub.CreateEvaluation(no_kind)
        assert bad_kind.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "cases[0].rules[0]: kind must be one of RULE_KIND_STATUS" in bad_kind.value.details()
        # Pool rules and the configuration are checked when the evaluation is created.
        refused_rules = [
            (pb.Rule(kind=pb.RULE_KIND_STATUS, value="²"), "HTTP status code"),  # isdigit()
            (pb.Rule(kind=pb.RULE_KIND_LATENCY_MS, value="٣"), "number of milliseconds"),
            (pb.Rule(kind=pb.RULE_KIND_REGEX, value=r"(a)\1"), "linear time"),
            (pb.Rule(kind=pb.RULE_KIND_REGEX, value="(?=a)"), "linear time"),
        ]
        for i, (rule, reason) in enumerate(refused_rules):
            bad_rule = create_request(target.url, f"bad-rule-{i}")
            bad_rule.cases[0].rules[0].CopyFrom(rule)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CreateEvaluation(bad_rule)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith("cases[0].rules[0]: "), reason
            assert reason in refused.value.details()
        for configuration, field in [
            ('{"threshold": NaN}', "configuration_json.threshold"),
            ('{"note": "a\\u0000b"}', "configuration_json.note"),
            ("[1, 2]", "configuration_json"),
        ]:
            bad_configuration = create_request(target.url, "bad-configuration")
            bad_configuration.configuration_json = configuration
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.CreateEvaluation(bad_configuration)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details().startswith(f"{field}: "), refused.value.details()
        exponential = create_request(target.url, "linear-regex")
        exponential.cases[0].rules[0].CopyFrom(pb.Rule(kind=pb.RULE_KIND_REGEX, value="(a+)+$"))
        await stub.CreateEvaluation(exponential)  # RE2 runs it in linear time: accepted
        for i in range(len(refused_rules)):
            with pytest.raises(grpc.aio.AioRpcError) as never_written:
                await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=f"bad-rule-{i}"))
            assert never_written.value.code() == grpc.StatusCode.NOT_FOUND
        for verdict in (common_pb2.VERDICT_UNSPECIFIED, 9):
            with pytest.raises(grpc.aio.AioRpcError) as bad_verdict:
                await stub.RecordRun(
                    pb.RecordRunRequest(
                        cron_id="c", evaluation_id="e", case_id="c1", verdict=verdict
                    )
                )
            assert bad_verdict.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "verdict: must be VERDICT_PASS" in bad_verdict.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id="nope"))
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        created = await stub.CreateEvaluation(create_request(target.url, "twice"))
        again = await stub.CreateEvaluation(create_request(target.url, "twice"))
        assert (again.id, again.created_at) == (created.id, created.created_at)
        with pytest.raises(grpc.aio.AioRpcError) as changed:
            await stub.CreateEvaluation(create_request(target.url, "twice", runs_per_slot=2))
        assert changed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert DispoError.from_rpc(changed.value).violations == {
            "runs_per_slot": "differs from the existing one's"
        }
        with pytest.raises(grpc.aio.AioRpcError) as big:
            await stub.CreateEvaluation(
                create_request(
                    target.url,
                    "big",
                ).__class__(
                    evaluation_id="big",
                    series="s",
                    line=common_pb2.LINE_TRIAL,
                    period="p",
                    target_url=target.url,
                    configuration_json='{"a": "' + "x" * 70_000 + '"}',
                    cases=[pb.TestCase(id="c")],
                )
            )
        assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as pre:
            await stub.ResumeEvaluation(pb.EvaluationRef(evaluation_id="twice"))
        assert pre.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def _children(pid: int) -> list[int]:
    from pathlib import Path

    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "children").read_text().split()
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
        found += [int(child) for child in text]
    return found


async def test_spawned_worker_is_restarted_and_dies_with_the_pool(
    start_service, target, file_clock, tmp_path
):
    import os
    import signal

    pool = await start_service(
        "pool",
        env={
            **file_clock.env,
            "DISPO_POOL_LOCAL_REGISTRY": str(tmp_path / "reg.sqlite"),
            "DISPO_POOL_SPAWN_WORKER": "true",
            "DISPO_EGRESS_ALLOW": target.url,
        },
    )
    [worker_pid] = await eventually(lambda: _children(pool.process.pid))
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        await eventually(lambda: _size(stub, 5))
        await stub.CreateEvaluation(
            create_request(target.url, "spawned", window_seconds=120, slot_count=2, runs_per_slot=1)
        )
        await eventually(lambda: _runs_done(pool.address, "spawned", 1))
        os.kill(worker_pid, signal.SIGKILL)  # the driver crashes
        [restarted] = await eventually(
            lambda: [p for p in _children(pool.process.pid) if p != worker_pid]
        )
        file_clock.advance(seconds=60)
        done = await eventually(
            lambda: _status(pool.address, "spawned", pb.EVALUATION_STATUS_COMPLETED), timeout=60
        )
        assert done.runs_done == 2
    pool.kill()  # SIGKILL: no shutdown code runs, yet the worker follows its parent
    await eventually(lambda: not alive(restarted))


async def test_a_target_dripping_its_answer_fails_the_run_at_its_deadline(
    pool_stack, target, pool_engine
):
    """The deadline covers the whole call: a target sending a byte every 0.2 s, each read well
    within the 1 s deadline, does not hold the cron; the run fails and the evaluation ends."""
    target.drips.add("/drip")
    pool, _ = await pool_stack(worker_env={"DISPO_POOL_WORKER_HTTP_TIMEOUT_SECONDS": "1"})
    ask = create_request(target.url, "dripped", window_seconds=60, slot_count=1, runs_per_slot=1)
    ask.cases[0].path = "/drip"
    async with admin_channel(pool.address) as channel:
        await pool_pb2_grpc.PoolServiceStub(channel).CreateEvaluation(ask)
    done = await eventually(
        lambda: _status(pool.address, "dripped", pb.EVALUATION_STATUS_COMPLETED)
    )
    assert done.runs_done == 1
    async with pool_engine.connect() as conn:
        [(verdict, reason)] = (
            await conn.execute(
                text("SELECT verdict, failure_reason FROM runs WHERE evaluation_id = 'dripped'")
            )
        ).all()
    assert verdict == "error" and "1 s deadline" in reason


async def test_a_new_evaluations_next_slot_wakes_a_cron_when_it_falls_due(
    pool_stack, target, file_clock
):
    """Slot 1 falls due 60 s (clock) after slot 0: a cron takes it then, although neither the
    sweeps (every 300 s) nor the crons' tick (every hour) would come round by that time."""
    hour = {"DISPO_POOL_WORKER_TICK_SECONDS": "3600"}
    pool, _ = await pool_stack(
        worker_env=hour, DISPO_POOL_TICK_SECONDS="3600", DISPO_POOL_SWEEP_SECONDS="300"
    )
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        await eventually(lambda: _size(stub, 5))
        await stub.CreateEvaluation(
            create_request(target.url, "prompt", window_seconds=120, slot_count=2, runs_per_slot=1)
        )
    await eventually(lambda: _runs_done(pool.address, "prompt", 1))
    # Slot 0 done, its cron let it go: the evaluation waits in the queue for slot 1.
    await eventually(lambda: _unassigned(pool.address, "prompt"))
    file_clock.advance(seconds=60)
    done = await eventually(lambda: _status(pool.address, "prompt", pb.EVALUATION_STATUS_COMPLETED))
    assert done.runs_done == 2


async def _unassigned(address: str, evaluation_id: str):
    ev = await evaluation(address, evaluation_id)
    return ev if ev and not ev.assigned_cron_id else None


async def test_the_worker_keeps_its_open_files_over_many_ticks(pool_stack, target, file_clock):
    """Every tick wakes every cron; 40 ticks (40 minutes of the clock) leave the worker with
    the files it had after the first few."""
    pool, worker = await pool_stack(DISPO_POOL_SWEEP_SECONDS="3600")
    fds = Path(f"/proc/{worker.process.pid}/fd")
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        await eventually(lambda: _size(stub, 5))

        async def all_woke_at(moment) -> bool:
            crons = (await stub.ListCrons(pb.ListCronsRequest())).crons
            return all(c.last_activity.ToDatetime(tzinfo=UTC) >= moment for c in crons)

        counts = []
        for _ in range(40):
            moment = file_clock.advance(seconds=60)
            await eventually(lambda m=moment: all_woke_at(m))
            counts.append(len(list(fds.iterdir())))
    assert max(counts[5:]) <= counts[4], counts
