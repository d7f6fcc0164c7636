"""The tour (docs/tour.md) and the README's Python example, run as written against `dispo up`
(ports moved to free ones), then the guides' walk-throughs on the same stack —
docs/pipeline.md, docs/intelligence.md, docs/pool.md, docs/recovery.md, docs/waiting-time.md —
and the tour's own cell and downstream; then what a second run of them meets from the first:
the guides can be run in sequence, twice, on one stack. The stack is started as the tour's "Add your own cell
and downstream" says, with its catalogue and allow list (and the pool guide's target on it)."""

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from dispo.libs.catalogue import EXAMPLE
from dispo.libs.process import free_port
from dispo.tools.stack.stack import SERVICES
from support import eventually

pytestmark = pytest.mark.long_file

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEFAULT_PORTS = {
    "gateway": 50051,
    "executor": 50052,
    "reconciler": 50053,
    "intelligence": 50054,
    "pool": 50055,
}
DEMO, OWN, SITE = 8181, 8282, 18000  # the demo downstream, "your service", the pool's target


def section(page: str, title: str) -> str:
    """The text under ``## title`` in ``page`` (a path from the repository's root)."""
    return (ROOT / page).read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def tour_blocks() -> list[str]:
    return sh_blocks(section("docs/tour.md", "A five-minute tour"))


def python_block() -> str:
    """The README's SDK example, which the tour runs after its blocks."""
    [block] = re.findall(r"```python\n(.*?)```", section("README.md", "Ten lines of Python"), re.S)
    return block


def own_cell_blocks() -> tuple[str, str, str]:
    """The tour's catalogue block, its start block and its submit block."""
    catalogue, start, submit = sh_blocks(
        section("docs/tour.md", "Add your own cell and downstream")
    )
    return catalogue, start, submit


def walkthrough(guide: str) -> list[str]:
    """The blocks of a guide's "Walk-through with grpcurl", without the `dispo up` it starts
    with (the stack is up)."""
    text = (ROOT / "docs" / guide).read_text()
    blocks = sh_blocks(text.split("## Walk-through", 1)[1].split("\n## ", 1)[0])
    return [
        "\n".join(line for line in block.splitlines() if not line.startswith("dispo up"))
        for block in blocks
    ]


def failures_foretold(blocks: list[str]) -> list[str]:
    """The codes the blocks' `# fails: <Code>` comments say the next command answers."""
    return re.findall(r"^# fails: (\w+)$", "\n".join(blocks), re.M)


class Stack:
    """Where the test's stack listens: each documented port and its free stand-in."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.ports = {name: free_port() for name in SERVICES}
        self.moved = {port: self.ports[name] for name, port in DEFAULT_PORTS.items()}
        self.moved |= {DEMO: free_port(), OWN: free_port(), SITE: free_port()}

    def localise(self, script: str) -> str:
        for documented, port in self.moved.items():
            script = script.replace(f"127.0.0.1:{documented}", f"127.0.0.1:{port}")
            script = script.replace(f"--port {documented}", f"--port {port}")
        return (
            script.replace(f"http.server {SITE}", f"http.server {self.moved[SITE]}")
            .replace("export PATH=$PWD/.venv/bin:$PATH", "")
            .replace("libs/catalogue/content_governance.yaml", str(EXAMPLE))
        )

    def calls(self, port: int) -> dict[str, int]:
        """The calls a demo downstream counted, by idempotency key."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.moved[port]}/calls") as answer:
            return json.load(answer)["calls"]


@pytest.mark.timeout(600)  # one stack for the tour and every guide, twice
async def test_the_tour_and_the_guides_run_twice_on_one_stack(tmp_path):
    stack = Stack(tmp_path)
    catalogue, start, _ = own_cell_blocks()
    # The tour's catalogue, written as it says (the example's demo downstream moved too).
    made = await shell([catalogue], os.environ, stack, "-e")
    assert made.returncode == 0, made.stdout + made.stderr
    mine = tmp_path / "my-catalogue.yaml"
    mine.write_text(mine.read_text().replace("127.0.0.1:8181", f"127.0.0.1:{stack.moved[DEMO]}"))
    # Its start block: "your service" in the background, then `dispo up` with the settings
    # the block gives it, and the pool guide's target added to the allow list.
    serve, up_line = [line for line in start.splitlines() if line.strip()]
    assert serve.split("#")[0].strip().endswith("&") and up_line.endswith(" dispo up"), start
    settings = dict(re.findall(r"(DISPO_\w+)=(\S+)", stack.localise(up_line)))
    assert set(settings) == {"DISPO_CATALOGUE", "DISPO_EGRESS_ALLOW"}, up_line
    [pool_target] = re.findall(
        r"export DISPO_EGRESS_ALLOW=(\S+)", "\n".join(walkthrough("pool.md"))
    )
    settings["DISPO_EGRESS_ALLOW"] += "," + stack.localise(pool_target)
    env = {**os.environ, "DISPO_DATA_DIR": str(tmp_path / ".dispo"), "PATH": f"{BIN}:/usr/bin:/bin"}
    env |= {f"DISPO_{name.upper()}_PORT": str(port) for name, port in stack.ports.items()}
    env |= {f"DISPO_{name.upper()}_METRICS_PORT": str(free_port()) for name in SERVICES}
    env |= settings
    env["DISPO_CONSOLE_PORT"] = str(free_port())
    own = subprocess.Popen(
        ["bash", "-c", "exec " + stack.localise(serve.split("&")[0])],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    output = tmp_path / "up.out"
    with open(output, "wb") as out:
        up = subprocess.Popen(
            [
                str(BIN / "dispo"),
                "up",
                "--nats-port",
                str(free_port()),
                "--demo-port",
                str(stack.moved[DEMO]),
            ],
            env=env,
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> bool:
            assert up.poll() is None, output.read_text()
            return "Ctrl-C stops everything" in output.read_text()

        await eventually(ready, timeout=120, interval=0.1, wanted="the stack up")
        # the tour exports DISPO_TOKEN itself; the Python examples and the guides (and a
        # second run, in the same terminal) have it from there
        exported = {**env, "DISPO_TOKEN": (tmp_path / ".dispo" / "admin.token").read_text()}
        jq = shutil.which("jq") is not None  # the pipeline guide picks ids with jq
        # The guides in sequence on one stack: each uses its own keys and ids.
        await run_the_tour(env, exported, stack)
        if jq:
            await run_the_pipeline_guide(exported, stack)
            await run_the_outputs_walkthrough(exported, stack)
        await run_the_recovery_guide(exported, stack)
        await run_the_intelligence_guide(exported, stack)
        await run_the_pool_guide(exported, stack)
        await run_your_own_cell(exported, stack)
        if jq:
            await run_the_delays_and_deadlines_guide(exported, stack)
        await run_the_retention_guide(exported, stack)
        # Then again what a second run of them meets from the first (the same keys, the same
        # evaluation ids): it answers as the first time, and no call of it is refused (set -e)
        # but those its guide says are. The recovery guide submits without a key: a second run
        # of it makes a new task, its first run again.
        await run_the_tour_again(exported, stack)
        if jq:
            await run_the_pipeline_guide_again(exported, stack)
        await run_the_intelligence_guide(exported, stack)
        await run_the_pool_guide(exported, stack)
        await run_your_own_cell(exported, stack)
        if jq:
            await run_the_delays_and_deadlines_guide(exported, stack)
    finally:
        up.send_signal(signal.SIGINT)
        await asyncio.to_thread(up.wait, 60)
        own.terminate()
        await asyncio.to_thread(own.wait, 10)


# A block naming an idempotency key or an evaluation id makes what a second run of its guide
# meets again (the same task, the same evaluation). Every other block makes new work each
# time it runs (a task without a key gets a new id) or only reads, so running it twice
# repeats the first run.
KEYED = re.compile(r"idempotency_key|evaluation_id")


def keyed(blocks: list[str]) -> list[str]:
    return [block for block in blocks if KEYED.search(block)]


async def shell(
    blocks: list[str], env: dict[str, str], stack: Stack, *flags: str
) -> subprocess.CompletedProcess[str]:
    """The blocks as one script; what it starts in the background stops with it."""
    script = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + "\n".join(blocks)
    return await asyncio.to_thread(
        subprocess.run,
        ["timeout", "180", "bash", "-u", *flags, "-c", stack.localise(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=stack.cwd,
    )


async def python(script: str, env: dict[str, str], stack: Stack) -> str:
    """What ``script`` printed; it must end without error."""
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", stack.localise(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran.stdout


async def run_the_tour(env: dict[str, str], exported: dict[str, str], stack: Stack) -> None:
    blocks = tour_blocks()
    assert len(blocks) == 5
    result = await shell(blocks, env, stack)
    out = result.stdout + result.stderr

    assert out.count("SERVING") >= len(SERVICES), out
    assert "unknown cell 'delete_everything'" in out, out
    assert out.count('"status": "TASK_STATUS_SUCCEEDED"') >= 2, (
        out
    )  # first task and the released one
    assert '"demoted_depth": 1' in out, out
    assert "JOB_STATUS_COMPLETED" in out and '"pass_rate": 1' in out, out
    assert (await python(python_block(), exported, stack)).strip() == "SUCCEEDED"


async def run_the_tour_again(env: dict[str, str], stack: Stack) -> None:
    """The tour's keyed blocks (the content-42 task, the tour-1 evaluation) and its Python
    example (the content-44 task) a second time."""
    again = keyed(tour_blocks())
    assert len(again) == 2, again
    result = await shell(again, env, stack, "-e", "-o", "pipefail")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert "JOB_STATUS_COMPLETED" in out and '"pass_rate": 1' in out, out
    assert KEYED.search(python_block())
    assert (await python(python_block(), env, stack)).strip() == "SUCCEEDED"


def pipeline_guide() -> tuple[list[str], str]:
    """docs/pipeline.md's walk-through (the blocks after `dispo up`) and its Python example."""
    text = (ROOT / "docs" / "pipeline.md").read_text()
    walkthrough = text.split("## Five minutes", 1)[1].split("### From Python", 1)[0]
    blocks = sh_blocks(walkthrough)[1:]  # the first is `dispo up`
    [example] = re.findall(
        r"```python\n(.*?)```", text.split("### From Python", 1)[1].split("## ", 1)[0], re.S
    )
    return blocks, example


async def run_the_pipeline_guide(env: dict[str, str], stack: Stack) -> None:
    """docs/pipeline.md's walk-through and its Python example, run as written after the
    tour on the tour's stack (the `dispo up` the guide starts with)."""
    blocks, example = pipeline_guide()
    assert len(blocks) == 4, blocks
    result = await shell(blocks, env, stack)
    out = result.stdout + result.stderr
    assert '"duplicate": true' in out and '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert (
        '[{"label.set_label":"NODE_STATUS_FAILED"},{"label.audit":"NODE_STATUS_DEPENDENCY_FAILED"},'
        '{"start_review.open_ticket":"NODE_STATUS_SUCCEEDED"},'
        '{"notify_owner.send":"NODE_STATUS_DEPENDENCY_FAILED"}]'
    ) in out, out
    assert '["NODE_STATUS_SUCCEEDED","NODE_STATUS_CANCELLED"]' in out, out
    assert "Code: InvalidArgument" in out, out
    assert "cells[0].cell: unknown cell 'delete_everything'" in out, out
    assert (await python(example, env, stack)).startswith("SUCCEEDED {")


async def run_the_outputs_walkthrough(env: dict[str, str], stack: Stack) -> None:
    """docs/pipeline.md's Outputs: a review opened, then the owner told the ticket's number,
    taken from the review's output; the outputs and the result read back (a new task each
    run: no key)."""
    blocks = sh_blocks(section("docs/pipeline.md", "Outputs"))
    assert len(blocks) == 1 and not keyed(blocks), blocks
    result = await shell(blocks, env, stack, "-e", "-o", "pipefail")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    [ticket] = set(re.findall(r'"ticket_id": ?"(T-[0-9a-f]{8})"', out))
    assert f'{{"message":"your ticket is {ticket}","owner_id":"user-7"}}' in out, out
    assert '{"notify_owner.send":{' in out and '"review.open_ticket":{' in out, out  # result
    assert '"outputs": [' in out and '"node_id": "review.open_ticket"' in out, out  # GetOutputs


async def run_the_pipeline_guide_again(env: dict[str, str], stack: Stack) -> None:
    """The walk-through's keyed block (the content-42-pipeline task) and its Python example
    (content-44-pipeline) a second time."""
    blocks, example = pipeline_guide()
    again = keyed(blocks)
    assert len(again) == 1, again
    result = await shell(again, env, stack, "-e", "-o", "pipefail")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert '"duplicate": true' in out and '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert KEYED.search(example)
    assert (await python(example, env, stack)).startswith("SUCCEEDED {")


async def run_guide(guide: str, env: dict[str, str], stack: Stack, *extra: str) -> str:
    """A guide's walk-through as one script, whole, each time: what it printed. Every call
    it says fails fails with the code it names, and no other call fails."""
    blocks = walkthrough(guide)
    result = await shell([*blocks, *extra], env, stack)
    out = result.stdout + result.stderr
    assert result.returncode != 124, out  # timed out: a wait of it never ended
    expected = failures_foretold(blocks)
    assert re.findall(r"^  Code: (\w+)$", out, re.M) == expected, out
    return out


async def run_the_recovery_guide(env: dict[str, str], stack: Stack) -> None:
    """docs/recovery.md: a task whose label call is refused four times, parked, redriven by
    hand; a new task each run (it has no key)."""
    assert not keyed(walkthrough("recovery.md"))
    out = await run_guide("recovery.md", env, stack, 'echo "task: $TASK"')
    assert "dispo.reconciler.v1.ReconcilerService" in out, out
    assert '"error_class": "http_5xx"' in out, out
    assert '"state": "RECOVERY_STATE_REDRIVEN"' in out, out  # RedriveTask's answer
    assert '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert '"paused": true' in out, out
    [task] = re.findall(r"^task: ([0-9a-f]{32})$", out, re.M)
    calls = stack.calls(DEMO)
    # 4 refused, 1 after the redrive; the node after it once
    assert calls[f"{task}/update_quality_level.set_label"] == 5, calls
    assert calls[f"{task}/update_quality_level.audit"] == 1, calls
    # The late review call: fenced by the probe, run again at once, one effect.
    assert '"reason": "probe reports done=false, fenced"' in out, out
    assert '{"calls":2,"effects":1,"refused":1}' in out, out


async def run_the_retention_guide(env: dict[str, str], stack: Stack) -> None:
    """docs/retention.md's dry run, as written: every service answers, nothing is due (the
    guides' tasks finished minutes ago, within the default 30 days)."""
    blocks = sh_blocks(section("docs/retention.md", "What the next passes will delete"))
    assert len(blocks) == 1
    result = await shell(blocks, env, stack, "-e", "-o", "pipefail")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for service in ("gateway", "executor", "reconciler"):
        assert service in out, out
    assert "0 rows of finished tasks past their retention" in out, out
    assert '"default_retention_days": 30' in out, out


async def run_the_intelligence_guide(env: dict[str, str], stack: Stack) -> None:
    """docs/intelligence.md: two periods of the nightly series (the same evaluations again
    on a second run) and a trial evaluation of its own each run."""
    out = await run_guide("intelligence.md", env, stack)
    assert "no baseline for evaluation 'nightly-w01'" in out, out
    assert '"baseline_evaluation_id": "nightly-w01"' in out, out
    assert "DIRECTION_IMPROVED" in out, out
    assert '"started": true' in out, out


async def run_the_pool_guide(env: dict[str, str], stack: Stack) -> None:
    """docs/pool.md: the demo-1 evaluation (the same one on a second run), an operated
    evaluation of its own each run, a drift repaired, a refusal."""
    out = await run_guide("pool.md", env, stack)
    assert '"end_reason": "ASSIGNMENT_END_DONE"' in out, out
    assert '"status": "EVALUATION_STATUS_COMPLETED"' in out and '"runs_done": 4' in out, out
    assert '"status": "EVALUATION_STATUS_CANCELLED"' in out, out
    assert '"cron_id": "cron-stray"' in out and "REPAIR_OUTCOME_APPLIED" in out, out
    assert "Code: InvalidArgument" in out, out


async def run_your_own_cell(env: dict[str, str], stack: Stack) -> None:
    """The tour's own cell on its own downstream, with the callback there too; the same
    task on a second run (its key)."""
    _, _, submit = own_cell_blocks()
    assert keyed([submit])
    result = await shell([submit], env, stack, "-e", "-o", "pipefail")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"^1$", out, re.M), out  # ListCells names the new cell
    # one task, the same on a second run: its archive call and its callback, once each
    [task] = set(re.findall(r'"([0-9a-f]{32})/archive_content\.archive"', out))
    calls = stack.calls(OWN)
    assert calls.get(f"{task}/archive_content.archive") == 1, (out, calls)
    assert calls.get(f"{task}/completion") == 1, (out, calls)


async def run_the_delays_and_deadlines_guide(env: dict[str, str], stack: Stack) -> None:
    """docs/waiting-time.md: a delayed task listed as scheduled, then run; one cancelled
    before its start; a start beyond the horizon refused; a deadline ending a task whose
    label call keeps failing. New tasks each run (no key): a second run meets the same."""
    blocks = walkthrough("waiting-time.md")
    assert len(blocks) == 3 and not keyed(blocks), blocks
    out = await run_guide("waiting-time.md", env, stack)
    assert '["scheduled","TASK_STATUS_ACCEPTED"]' in out, out
    assert '["ran","TASK_STATUS_SUCCEEDED"]' in out, out
    assert '["TASK_STATUS_CANCELLED","cancelled before publication"]' in out, out
    assert "not_before: more than 31622400 seconds ahead" in out, out
    assert (
        '["deadline reached",[{"update_quality_level.set_label":"NODE_STATUS_CANCELLED"},'
        '{"update_quality_level.audit":"NODE_STATUS_CANCELLED"}]]'
    ) in out, out


def test_ci_runs_the_readme_commands():
    install, test = (block.strip() for block in sh_blocks(section("README.md", "Two commands")))
    install = install.removesuffix(" && .venv/bin/dispo up")
    assert "[local,dev]" in install, install  # the extras that bring the embedded stack
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(install) for line in ci), f"CI does not run {install!r}"
    assert test in ci, f"CI does not run {test!r}"


@contextlib.asynccontextmanager
async def dispo_up(
    tmp_path: Path, stack: Stack, services: str = "", settings: dict[str, str] | None = None
) -> AsyncIterator[tuple[dict[str, str], dict[str, str]]]:
    """`dispo up` started in ``tmp_path`` as a newcomer runs it (on ``stack``'s ports, the
    demo downstream on its moved port; ``services``: only those; ``settings``: more
    DISPO_ variables), until it says the stack is up: its environment, and that
    environment with the admin token exported. Stopped with Ctrl-C on the way out."""
    env = {**os.environ, "DISPO_DATA_DIR": str(tmp_path / ".dispo"), "PATH": f"{BIN}:/usr/bin:/bin"}
    env |= {f"DISPO_{name.upper()}_PORT": str(port) for name, port in stack.ports.items()}
    env |= {f"DISPO_{name.upper()}_METRICS_PORT": str(free_port()) for name in SERVICES}
    env |= settings or {}
    env["DISPO_CONSOLE_PORT"] = "0" if services else str(free_port())
    only = ["--services", services] if services else []
    output = tmp_path / "up.out"
    with open(output, "wb") as out:
        up = subprocess.Popen(
            [str(BIN / "dispo"), "up", *only,
             "--nats-port", str(free_port()), "--demo-port", str(stack.moved[DEMO])],
            env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:

        def ready() -> bool:
            assert up.poll() is None, output.read_text()
            return "Ctrl-C stops everything" in output.read_text()

        await eventually(ready, timeout=120, interval=0.1, wanted="the stack up")
        token = (tmp_path / ".dispo" / "admin.token").read_text()
        yield env, {**env, "DISPO_TOKEN": token}
    finally:
        up.send_signal(signal.SIGINT)
        await asyncio.to_thread(up.wait, 60)


@pytest.mark.timeout(300)
async def test_the_waiting_guide_runs_twice_on_one_stack(tmp_path):
    """docs/waiting.md's "Wait nodes" and "Signals", each section on its own, run as written
    twice against `dispo up` with the example catalogue (gateway and executor): a review
    waits, its verdict comes as a signal, and the owner is told it; a repeated signal is a
    duplicate and an undeclared one is refused. No block has a key: a second run makes new
    tasks, and meets nothing of the first."""
    stack = Stack(tmp_path)
    async with dispo_up(tmp_path, stack, services="gateway,executor") as (env, exported):
        if shutil.which("jq") is None:
            pytest.skip("the guide picks ids with jq")
        waits = sh_blocks(section("docs/waiting.md", "Wait nodes"))
        signals = sh_blocks(section("docs/waiting.md", "Signals"))
        assert len(waits) == 1 and len(signals) == 1 and not keyed(waits + signals)
        for _ in range(2):
            result = await shell(waits, exported, stack, "-e", "-o", "pipefail")
            out = result.stdout + result.stderr
            assert result.returncode == 0, out
            assert (
                '["TASK_STATUS_RUNNING",["NODE_STATUS_WAITING","NODE_STATUS_PENDING",'
                '"NODE_STATUS_PENDING","NODE_STATUS_PENDING"]]' in out
            ), out
            assert "recorded" in out and "SUCCEEDED" in out, out

            out = await run_blocks(signals, exported, stack)
            assert out.count('"duplicate": true') == 1, out
            assert '["NODE_STATUS_SUCCEEDED","NODE_STATUS_SUCCEEDED"]' in out, out
            assert (
                '{"message":"review of content-51: rejected (misleading title)",'
                '"owner_id":"user-8"}' in out
            ), out
            assert "(declared: verdict)" in out, out


async def run_blocks(blocks: list[str], env: dict[str, str], stack: Stack) -> str:
    """Blocks run whole: every call they say fails fails with the code they name, and no
    other call fails; what they printed."""
    result = await shell(blocks, env, stack)
    out = result.stdout + result.stderr
    assert result.returncode != 124, out  # timed out: a wait of it never ended
    assert re.findall(r"^  Code: (\w+)$", out, re.M) == failures_foretold(blocks), out
    return out


@pytest.mark.timeout(600)
async def test_the_schedules_guide_runs_twice_on_a_stack(tmp_path):
    """docs/schedules.md: a nightly schedule created, triggered and its task followed to its
    end, paused, changed, resumed and deleted; a bad time zone refused; then its Python
    example. Twice: the same create again answers the same schedule."""
    stack = Stack(tmp_path)
    async with dispo_up(tmp_path, stack) as (env, exported):
        [example] = re.findall(
            r"```python\n(.*?)```", section("docs/schedules.md", "From Python"), re.S
        )
        for _ in range(2):
            out = await run_guide("schedules.md", exported, stack)
            assert out.count("nightly-recheck") >= 4, out
            assert "fired: task" not in out  # the trigger's --json answer, not the line
            assert '"manual": true' in out and "SUCCEEDED" in out, out
            assert "definition.spec.time_zone" in out, out
            assert '"paused": false' in out, out  # resume --json
            assert (await python(example, exported, stack)).startswith("20"), out


@pytest.mark.timeout(400)
async def test_the_workers_guide_runs_twice_on_one_stack(tmp_path):
    """docs/workers.md's Walk-through, run as written twice against `dispo up` started with
    its catalogue: a worker token of the queue, the README's worker (the guide's tickets.py
    is that example, word for word) run by `dispo worker run` on it, a task whose worker
    node's output flows into the owner's message, the queue seen live by `dispo queues`, and
    the worker token refused a task list. No block has a key: a second run makes a new task
    and a new worker process, and meets nothing of the first."""
    stack = Stack(tmp_path)
    catalogue, start, walk = sh_blocks(section("docs/workers.md", "Walk-through"))
    [example] = re.findall(
        r"```python\n(.*?)```", section("README.md", "Your own code as a step"), re.S
    )
    assert f"cat > tickets.py <<'EOF'\n{example}EOF\n" in walk, "not the README's worker"
    assert '"idempotency_key"' not in walk  # the worker names ctx's key; no task has one
    made = await shell([catalogue], os.environ, stack, "-e")
    assert made.returncode == 0, made.stdout + made.stderr
    mine = tmp_path / "tickets-catalogue.yaml"
    mine.write_text(mine.read_text().replace("127.0.0.1:8181", f"127.0.0.1:{stack.moved[DEMO]}"))
    settings = dict(re.findall(r"(DISPO_\w+)=(\S+)", start))
    assert start.strip().endswith(" dispo up") and set(settings) == {"DISPO_CATALOGUE"}, start
    async with dispo_up(tmp_path, stack, services="gateway,executor", settings=settings) as (
        env,
        exported,
    ):
        if shutil.which("jq") is None:
            pytest.skip("the guide picks ids with jq")
        for _ in range(2):
            result = await shell([walk], env, stack, "-e", "-o", "pipefail")
            out = result.stdout + result.stderr
            assert result.returncode == 0, out + (tmp_path / "worker.log").read_text()
            assert "TASK_STATUS_SUCCEEDED" in out, out
            assert '"review.open_ticket":{"ticket_id":"T-content-48-1"}' in out, out
            assert '{"message":"your ticket is T-content-48-1","owner_id":"user-7"}' in out, out
            assert re.search(r"^tickets +\d+ +live ", out, re.M), out  # dispo queues
            assert '{"name":"tickets","live":true,"live_workers":' in out, out
            assert "refused, as it should be" in out and "PERMISSION_DENIED" in out, out


@pytest.mark.timeout(600)
async def test_the_bulk_guide_runs_twice_on_a_stack(tmp_path):
    """docs/bulk.md: three delayed tasks of a business counted by a dry run, cancelled by a
    bulk cancel followed to its end, its record listed; a finished status refused; then its
    Python example. Twice: each run's bulk cancel takes that run's three tasks alone."""
    stack = Stack(tmp_path)
    async with dispo_up(tmp_path, stack) as (env, exported):
        [example] = re.findall(r"```python\n(.*?)```", section("docs/bulk.md", "From Python"), re.S)
        for _ in range(2):
            out = await run_guide("bulk.md", exported, stack)
            assert "3 tasks would be cancelled (dry run)" in out, out
            assert "cancel DONE: 3 matched, 3 cancelled, 0 asked already" in out, out
            assert "statuses[0]" in out, out
            assert '"reason": "import withdrawn"' in out, out  # the record's reason, listed
            assert (await python(example, exported, stack)).splitlines() == ["0", "DONE 0"]


@pytest.mark.timeout(600)
async def test_the_catalogue_guide_runs_twice_on_a_stack(tmp_path):
    """docs/catalogue.md: a business's token registers a cell on a running stack and a task of
    it succeeds, no restart; the same token adds no downstream and changes no cell of
    another; a dry run, a refused definition and a stale change; the file exported and
    checked back; then its Python example. Twice: the second run updates the cell."""
    stack = Stack(tmp_path)
    async with dispo_up(tmp_path, stack) as (env, exported):
        [example] = re.findall(
            r"```python\n(.*?)```", section("docs/catalogue.md", "From Python"), re.S
        )
        for _ in range(2):
            out = await run_guide("catalogue.md", exported, stack)
            assert "SUCCEEDED" in out, out
            assert re.findall(r"^refused$", out, re.M) == ["refused"] * 2, out
            assert '"path": "/hello/user-9"' in out, out  # the dry run's node
            assert "cells.welcome_owner.actions.send.kind" in out, out
            assert "no difference" in out and "+  welcome_owner:" in out, out
            printed = await python(example, exported, stack)
            assert printed.rstrip().endswith("welcome /welcome/user-3"), printed


@pytest.mark.timeout(600)
async def test_the_fairness_guide_runs_twice_on_a_stack(tmp_path):
    """docs/fairness.md: a business token limited to priority 3 submits at 4 and is refused
    1; its business paused, a task waits ACCEPTED (its paused depth listed) and runs once
    resumed; its tasks listed by priority; then its Python example. Twice: a pause of a
    paused business changes nothing."""
    stack = Stack(tmp_path)
    async with dispo_up(tmp_path, stack) as (env, exported):
        [example] = re.findall(
            r"```python\n(.*?)```", section("docs/fairness.md", "From Python"), re.S
        )
        for _ in range(2):
            out = await run_guide("fairness.md", exported, stack)
            assert "priority: a token of business 'bulk-relabel' may ask for priority 3" in out
            assert '"paused_reason": "held during the incident"' in out, out  # the pause
            assert "ACCEPTED" in out and "SUCCEEDED" in out, out
            assert '"priority": 4' in out, out  # its tasks listed by priority
            assert (await python(example, exported, stack)).strip() == "1", out


async def test_the_limits_section_of_the_pipeline_guide_runs_on_a_stack(tmp_path):
    """docs/pipeline.md's "Limits across the cluster": the commands it gives show every
    downstream of the shipped catalogue with its limits and the share the stack's executor
    holds of them (the whole of each: it is the only one)."""
    stack = Stack(tmp_path)
    async with dispo_up(tmp_path, stack) as (env, exported):
        blocks = sh_blocks(section("docs/pipeline.md", "Limits across the cluster"))
        assert len(blocks) == 1, blocks

        async def shown() -> str:
            result = await shell(blocks, exported, stack, "-e")
            assert result.returncode == 0, result.stdout + result.stderr
            return result.stdout

        out = await eventually(
            shown, lambda o: '"slots_share": 16' in o, wanted="the executor's share taken"
        )
        # (the table's headers wrap with the terminal's width: its JSON is what is read)
        assert '"name": "labels"' in out and '"name": "review"' in out, out
        assert '"max_concurrency": 16' in out and '"cluster_slots": 16' in out, out
