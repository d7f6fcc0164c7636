"""The pool on a real OpenClaw gateway (installed on demand, one per session), in one file
so that one worker runs them all on one gateway.

The openclaw driver: automations created idempotently, their scratch written with
compare-and-set (a lost race asks the database again), a disabled automation seen as
missing and enabled again. A pool service: an evaluation driven to its end through real
automations across a gateway restart, scaling, a disabled automation's repair, a disabled
automation holding work replaced by the stuck sweep, an agent payload planned on a model,
and ``dispo up --pool-driver openclaw`` starting a gateway of its own."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import uuid
from typing import Any

import pytest
from aiohttp import web
from dispo.libs.api.pool.v1 import pool_pb2 as pb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.process import free_port
from dispo.pool.drivers.openclaw import PROVIDER, OpenClawCli, OpenClawDriver
from dispo.pool.openclaw import OpenClawGateway, ensure_openclaw
from dispo.tools.stack.stack import read_state
from support import eventually
from support.auth import admin_channel
from support.stack import DISPO, alive

from .test_processes import create_request

# A CLI call starts a Node process loading a large bundle: seconds each on a busy machine.
SLOW = 600.0
pytestmark = [pytest.mark.timeout(1500), pytest.mark.long_file]

IDLE = {"status": "idle", "eval_id": ""}


def cli_for(gateway: OpenClawGateway) -> OpenClawCli:
    return OpenClawCli(
        gateway.install.argv(),
        ["--port", str(gateway.port), "--token", gateway.token],
        gateway.install.env(gateway.home),
        timeout=SLOW,
    )


class CountingCli(OpenClawCli):
    """The real CLI, each call kept in ``calls`` as its first two words (and ``--set``)."""

    def __init__(self, cli: OpenClawCli) -> None:
        super().__init__(cli.argv, cli.connection, cli.env, cli.timeout)
        self.calls: list[str] = []

    async def __call__(self, *args: str) -> dict[str, Any]:
        self.calls.append(" ".join([*args[:2], *(["--set"] if "--set" in args else [])]))
        return await super().__call__(*args)


def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


async def automations(cli: OpenClawCli, space: str) -> dict[str, dict]:
    """This namespace's automations, disabled ones too, by cron id."""
    prefix = f"dispo-pool:{space}:"
    listed = await cli("cron", "list", "--all", "--json")
    return {
        job["declarationKey"].removeprefix(prefix): job
        for job in listed["jobs"]
        if (job.get("declarationKey") or "").startswith(prefix)
    }


async def test_driver_keeps_one_automation_per_cron_and_its_state_in_the_scratch(
    openclaw_gateway,
):
    cli = cli_for(openclaw_gateway)
    space = namespace()
    database = {"cron-a": {"status": "idle", "eval_id": ""}}
    asked: list[str] = []

    async def state_of(cron_id: str) -> dict | None:
        asked.append(cron_id)
        return database.get(cron_id)

    counted = CountingCli(cli)
    driver = OpenClawDriver(
        counted, namespace=space, tick_seconds=3600, command=lambda c: "true", state_of=state_of
    )
    await driver.create("cron-a", IDLE)
    # A new automation's scratch is empty: written at once, not read first.
    assert counted.calls == ["cron add", "cron scratch --set"]
    await driver.create("cron-a", IDLE)  # the same declaration key: the same automation
    [job] = (await automations(cli, space)).values()
    assert job["enabled"] and job["schedule"] == {**job["schedule"], "everyMs": 3_600_000}
    assert [(c.id, c.state) for c in await driver.list()] == [("cron-a", IDLE)]

    # Someone else writes the scratch: the driver's compare-and-set loses, asks the
    # database again and writes what the database says now.
    await cli("cron", "scratch", job["id"], "--set", '{"status":"busy","eval_id":"other"}')
    database["cron-a"] = {"status": "busy", "eval_id": "ev-1"}
    await driver.write_state("cron-a", {"status": "busy", "eval_id": "stale"})
    await driver.drain()
    assert asked == ["cron-a"]
    scratch = await cli("cron", "scratch", job["id"], "--json")
    assert json.loads(scratch["scratch"]["content"]) == {"status": "busy", "eval_id": "ev-1"}
    assert scratch["scratch"]["revision"] == 3  # create, the other writer, the retry

    # A driver that knows no job ids yet (a restarted pool): a state write and a wake-up of
    # the same cron at once look the job up with one listing.
    restarted = CountingCli(cli)
    fresh = OpenClawDriver(restarted, namespace=space, tick_seconds=3600, command=lambda c: "true")
    await fresh.write_state("cron-a", database["cron-a"])
    await fresh.trigger("cron-a")
    await fresh.drain()
    assert sorted(restarted.calls) == ["cron list", "cron run", "cron scratch"]

    # Disabled behind the pool's back: not a live cron any more; creating it enables it.
    await cli("cron", "disable", job["id"])
    assert await driver.list() == []
    await driver.create("cron-a", database["cron-a"])
    [again] = (await automations(cli, space)).values()
    assert again["id"] == job["id"] and again["enabled"]

    await driver.remove("cron-a")
    await driver.remove("cron-a")  # absent: not an error
    assert await automations(cli, space) == {}


async def pool_on(gateway, start_service, file_clock, space: str, target=None, **env: str):
    return await start_service(
        "pool",
        env={
            **file_clock.env,
            **({"DISPO_EGRESS_ALLOW": target.url} if target else {}),
            **gateway.cli_env(),
            "DISPO_POOL_DRIVER": "openclaw",
            "DISPO_POOL_OPENCLAW_NAMESPACE": space,
            "DISPO_POOL_OPENCLAW_TIMEOUT_SECONDS": str(SLOW),
            # Wake-ups come from the pool (`cron run`), not from the automations' schedule.
            "DISPO_POOL_TICK_SECONDS": "3600",
            "DISPO_POOL_MIN_SIZE": "2",
            "DISPO_POOL_MAX_SIZE": "4",
            **env,
        },
    )


async def get(stub, evaluation_id: str) -> pb.Evaluation:
    return await stub.GetEvaluation(pb.GetEvaluationRequest(evaluation_id=evaluation_id))


async def test_pool_drives_an_evaluation_through_real_automations_across_a_gateway_restart(
    openclaw_gateway, start_service, file_clock, target
):
    cli = cli_for(openclaw_gateway)
    space = namespace()
    pool = await pool_on(openclaw_gateway, start_service, file_clock, space, target)
    created = await eventually(lambda: automations(cli, space), lambda a: len(a) == 2, timeout=SLOW)
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        status = await stub.GetPoolStatus(pb.GetPoolStatusRequest())
        assert status.driver == pb.DRIVER_OPENCLAW and status.size == 2
        assert {c.id for c in (await stub.ListCrons(pb.ListCronsRequest())).crons} == set(created)
        # Two slots of 60 s, two runs each: slot 0 is due at once.
        await stub.CreateEvaluation(
            create_request(target.url, "claw-1", window_seconds=120, slot_count=2, runs_per_slot=2)
        )
        # The pool runs `cron run` on an idle cron; its automation runs dispo-pool-wake,
        # which takes the evaluation and records slot 0's runs.
        first = await eventually(
            lambda: get(stub, "claw-1"), lambda e: e.runs_done == 2, timeout=SLOW
        )
        assert first.status == pb.EVALUATION_STATUS_EXECUTING and target.calls == 2
        [served] = (await stub.ListAssignments(pb.ListAssignmentsRequest())).assignments
        assert served.end_reason == pb.ASSIGNMENT_END_DONE
        view = await eventually(
            lambda: stub.GetDriftView(pb.GetDriftViewRequest()),
            lambda v: {json.loads(c.state_json)["status"] for c in v.driver_crons} == {"idle"},
            timeout=SLOW,
        )
        assert {c.cron_id for c in view.driver_crons} == set(created)

        # The gateway dies mid-evaluation; slot 1 falls due while it is down (the wake-up
        # fails), and it comes back with the same state folder.
        openclaw_gateway.kill()
        file_clock.advance(seconds=61)
        await eventually(lambda: stub.ListQueue(pb.ListQueueRequest()), lambda q: len(q.items) == 1)
        await openclaw_gateway.start()
        after = await automations(cli, space)
        assert {c: j["id"] for c, j in after.items()} == {c: j["id"] for c, j in created.items()}
        # The next sweep pass wakes an idle cron again; the evaluation completes.
        file_clock.advance(seconds=31)
        done = await eventually(
            lambda: get(stub, "claw-1"),
            lambda e: e.status == pb.EVALUATION_STATUS_COMPLETED,
            timeout=SLOW,
        )
        assert done.runs_done == 4 and target.calls == 4  # nothing lost, nothing run twice
        ends = [
            a.end_reason
            for a in (await stub.ListAssignments(pb.ListAssignmentsRequest())).assignments
        ]
        assert sorted(ends) == sorted([pb.ASSIGNMENT_END_DONE, pb.ASSIGNMENT_END_COMPLETED])


def kill_wake(cron_id: str) -> None:
    """Kill the ``dispo-pool-wake`` process an automation is running for ``cron_id``."""
    wanted = ["dispo.pool.wake", "--cron", cron_id]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
        except OSError:
            continue
        if any(argv[i : i + 3] == wanted for i in range(len(argv))):
            os.kill(int(pid), signal.SIGKILL)
            return
    raise AssertionError(f"no wake process for cron {cron_id}")


async def test_pool_scales_automations_and_replaces_a_disabled_one_holding_work(
    openclaw_gateway, start_service, file_clock, target
):
    cli = cli_for(openclaw_gateway)
    space = namespace()
    pool = await pool_on(openclaw_gateway, start_service, file_clock, space, target)
    await eventually(lambda: automations(cli, space), lambda a: len(a) == 2, timeout=SLOW)
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        # Scale up: a minimum of 3 adds one automation at the next sweep pass.
        await stub.SetPoolBounds(pb.SetPoolBoundsRequest(min_size=3, max_size=4))
        file_clock.advance(seconds=31)
        grown = await eventually(
            lambda: automations(cli, space), lambda a: len(a) == 3, timeout=SLOW
        )
        crons = {c.id for c in (await stub.ListCrons(pb.ListCronsRequest())).crons}
        assert crons == set(grown)

        # An automation disabled in OpenClaw: the drift view lacks it, and the repair the
        # reconciler asks for enables it again.
        victim = sorted(grown)[0]
        await cli("cron", "disable", grown[victim]["id"])
        view = await stub.GetDriftView(pb.GetDriftViewRequest())
        assert {c.cron_id for c in view.driver_crons} == crons - {victim}
        repaired = await stub.ApplyRepair(
            pb.ApplyRepairRequest(kind=pb.REPAIR_KIND_RECREATE_MISSING, cron_id=victim)
        )
        assert repaired.applied, repaired.detail
        assert (await automations(cli, space))[victim]["enabled"]

        # Scale down: a maximum of 1 removes the others' automations.
        await stub.SetPoolBounds(pb.SetPoolBoundsRequest(min_size=1, max_size=1))
        file_clock.advance(seconds=31)
        left = await eventually(
            lambda: automations(cli, space), lambda a: len(a) == 1, timeout=SLOW
        )
        assert set(left) == {c.id for c in (await stub.ListCrons(pb.ListCronsRequest())).crons}
        reasons = [r.reason for r in (await stub.ListResizes(pb.ListResizesRequest())).resizes]
        assert "above_max" in reasons

        # The last automation takes an evaluation; its wake dies mid-run (the target holds
        # the call) and the automation is disabled in OpenClaw: the cron holds the work and
        # nothing will wake it again.
        [victim] = left
        target.hold = asyncio.Event()
        await stub.CreateEvaluation(
            create_request(target.url, "claw-2", window_seconds=60, slot_count=1, runs_per_slot=1)
        )
        await eventually(lambda: target.waiting, lambda n: n == 1, timeout=SLOW)
        kill_wake(victim)
        held_call, target.hold = target.hold, None
        held_call.set()  # the killed wake's call ends (its answer goes nowhere)
        await cli("cron", "disable", left[victim]["id"])
        [held] = (await stub.ListCrons(pb.ListCronsRequest())).crons
        assert (held.id, held.status, held.evaluation_id) == (victim, pb.CRON_STATUS_BUSY, "claw-2")
        view = await stub.GetDriftView(pb.GetDriftViewRequest())
        assert [c.cron_id for c in view.driver_crons] == []  # the drift check sees it missing
        # Left alone, the cron is silent for the stuck timeout: the stuck sweep removes its
        # automation, adds a replacement and hands the evaluation to it, which completes it.
        file_clock.advance(seconds=601)
        done = await eventually(
            lambda: get(stub, "claw-2"),
            lambda e: e.status == pb.EVALUATION_STATUS_COMPLETED,
            timeout=SLOW,
        )
        assert done.runs_done == 1 and done.assigned_cron_id == ""
        [replacement] = (await automations(cli, space)).values()
        assert replacement["declarationKey"] != left[victim]["declarationKey"]
        assert replacement["enabled"]
        ends = {
            a.cron_id: a.end_reason
            for a in (await stub.ListAssignments(pb.ListAssignmentsRequest())).assignments
            if a.evaluation_id == "claw-2"
        }
        assert ends == {
            victim: pb.ASSIGNMENT_END_STUCK,
            replacement["name"]: pb.ASSIGNMENT_END_COMPLETED,
        }
        assert target.calls == 2  # the run lost with the killed wake, and its redo


async def test_dispo_up_starts_a_gateway_for_the_pool(
    infra, database_url, role_url, nats_url, tmp_path
):
    """``dispo up --pool-driver openclaw`` starts its own gateway (state under the data
    folder, a kept token), no pool-worker, and the pool's automations on it."""
    install = await asyncio.to_thread(ensure_openclaw)  # fails saying why if it cannot
    data, port, pool_port = tmp_path / "data", free_port(), free_port()
    env = {
        **os.environ,
        **infra.nats_users.env("pool"),  # an external bus: the pool's own user
        "DISPO_DATA_DIR": str(data),
        "DISPO_POOL_PORT": str(pool_port),
        "DISPO_POOL_METRICS_PORT": str(free_port()),
        "DISPO_POOL_DATABASE_URL": role_url("pool"),
        # dispo up also stores its tokens as the gateway (the token store's one writer),
        # whichever services it runs: the gateway's role too stays the session's.
        "DISPO_GATEWAY_DATABASE_URL": role_url("gateway"),
        "DISPO_POOL_MIN_SIZE": "2",
        "DISPO_POOL_TICK_SECONDS": "3600",
        "DISPO_POOL_OPENCLAW_TIMEOUT_SECONDS": str(SLOW),
    }
    up = subprocess.Popen(
        [DISPO, "up", "--services", "pool", "--pool-driver", "openclaw", "--openclaw-port",
         str(port), "--demo-port", "0", "--database-url", database_url, "--nats-url", nats_url],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        printed: list[str] = []
        async with asyncio.timeout(SLOW):
            while not printed or "Ctrl-C" not in printed[-1]:
                printed.append(await asyncio.to_thread(up.stdout.readline))
                assert printed[-1], "".join(printed)
        # It said what it was doing before the services were up.
        banner = next(i for i, line in enumerate(printed) if line.startswith("Dispo is up"))
        starting = [i for i, line in enumerate(printed) if "starting the OpenClaw gateway" in line]
        assert starting and starting[0] < banner, "".join(printed)
        state = read_state(data)
        assert set(state["services"]) == {"pool"} and "pool-worker" not in state["companions"]
        gateway_pid = state["infrastructure"]["openclaw"]["pid"]
        token = (data / "openclaw" / "token").read_text().strip()
        cli = OpenClawCli(
            install.argv(),
            ["--port", str(port), "--token", token],
            install.env(data / "openclaw" / "home"),
            timeout=SLOW,
        )
        created = await eventually(
            lambda: automations(cli, "default"), lambda a: len(a) == 2, timeout=SLOW
        )
        async with admin_channel(f"127.0.0.1:{pool_port}") as channel:
            stub = pool_pb2_grpc.PoolServiceStub(channel)
            status = await stub.GetPoolStatus(pb.GetPoolStatusRequest())
            crons = (await stub.ListCrons(pb.ListCronsRequest())).crons
        assert status.driver == pb.DRIVER_OPENCLAW and {c.id for c in crons} == set(created)
        up.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(asyncio.to_thread(up.wait), 180) == 0
        assert not alive(gateway_pid)
    finally:
        up.kill()
        up.wait()


async def test_agent_payload_plans_the_next_step_on_a_model_and_reports_through_the_pool(
    openclaw_gateway, start_service, file_clock, target, fake_server
):
    """Agent payload: the automation's turn asks a model (a local OpenAI-compatible server
    playing it) what to do; the model calls the exec tool with the cron's wake command, the
    gateway runs it, and the pool records the run it reported."""
    asked: list[dict] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        asked.append({**body, "authorization": request.headers.get("Authorization", "")})
        users = [m for m in body["messages"] if m.get("role") == "user"]
        command = re.search(r"`([^`]+)`", str(users[0]["content"])) if users else None
        if command and not any(m.get("role") == "tool" for m in body["messages"]):
            call = {"name": "exec", "arguments": json.dumps({"command": command.group(1)})}
            delta = {
                "role": "assistant",
                "tool_calls": [{"index": 0, "id": "call-1", "type": "function", "function": call}],
            }
            finish = "tool_calls"
        else:
            delta, finish = {"role": "assistant", "content": "done"}, "stop"
        chunks = [
            {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
        ]  # fmt: skip
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in chunks:
            chunk = {"id": "c1", "object": "chat.completion.chunk", "model": body["model"], **chunk}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    model = await fake_server({("POST", "/v1/chat/completions"): chat})
    cli = cli_for(openclaw_gateway)
    space = namespace()
    pool = await pool_on(
        openclaw_gateway,
        start_service,
        file_clock,
        space,
        target,
        DISPO_POOL_MIN_SIZE="1",
        DISPO_POOL_MAX_SIZE="1",
        DISPO_POOL_OPENCLAW_PAYLOAD="agent",
        DISPO_POOL_OPENCLAW_MODEL_BASE_URL=f"{model.url}/v1",
        DISPO_POOL_OPENCLAW_MODEL_NAME="planner",
        DISPO_POOL_OPENCLAW_MODEL_API_KEY="model-key",
    )
    [job] = (
        await eventually(lambda: automations(cli, space), lambda a: len(a) == 1, timeout=SLOW)
    ).values()
    assert job["payload"]["kind"] == "agentTurn"
    assert job["payload"]["model"] == f"{PROVIDER}/planner"
    async with admin_channel(pool.address) as channel:
        stub = pool_pb2_grpc.PoolServiceStub(channel)
        await stub.CreateEvaluation(
            create_request(target.url, "claw-3", window_seconds=60, slot_count=1, runs_per_slot=1)
        )
        done = await eventually(
            lambda: get(stub, "claw-3"),
            lambda e: e.status == pb.EVALUATION_STATUS_COMPLETED,
            timeout=SLOW,
        )
    assert done.runs_done == 1 and target.calls == 1
    # The turn: the model asked for the wake command, then got its output back (after the
    # pool recorded the run).
    await eventually(lambda: len(asked), lambda n: n >= 2, timeout=SLOW)
    assert [body["model"] for body in asked[:2]] == ["planner", "planner"]
    assert {body["authorization"] for body in asked} == {"Bearer model-key"}
    assert not [m for m in asked[0]["messages"] if m.get("role") == "tool"]
    [result] = [m for m in asked[1]["messages"] if m.get("role") == "tool"]
    assert '"runs": 1' in str(result["content"])
