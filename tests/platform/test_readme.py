"""The README's five-minute tour, run as written against `dispo up` (ports moved to free ones),
then docs/pipeline.md's walk-through on the same stack, then what a second run of the two
meets from the first: the guides can be run in sequence, twice, on one stack."""

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from dispo.libs.catalogue import EXAMPLE
from dispo.libs.stack.nats import free_port
from dispo.libs.stack.stack import SERVICES
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


def tour_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", tour, re.S)


def python_block() -> str:
    readme = (ROOT / "README.md").read_text()
    tour = readme.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", tour, re.S)
    return block


@pytest.fixture
def stack_env(tmp_path):
    ports = {name: free_port() for name in SERVICES}
    demo = free_port()
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(EXAMPLE.read_text().replace("127.0.0.1:8181", f"127.0.0.1:{demo}"))
    env = {**os.environ, "DISPO_DATA_DIR": str(tmp_path / "data"), "PATH": f"{BIN}:/usr/bin:/bin"}
    env |= {f"DISPO_{name.upper()}_PORT": str(port) for name, port in ports.items()}
    env |= {f"DISPO_{name.upper()}_METRICS_PORT": str(free_port()) for name in SERVICES}
    env["DISPO_CATALOGUE"] = str(catalogue)
    env["DISPO_RECONCILER_DRIFT_POOL_ADDRESS"] = f"127.0.0.1:{ports['pool']}"
    env["DISPO_RECONCILER_GATEWAY_ADDRESS"] = f"127.0.0.1:{ports['gateway']}"
    return env, ports, demo


def localise(script: str, ports: dict[str, int], demo: int) -> str:
    for name, port in DEFAULT_PORTS.items():
        script = script.replace(f"127.0.0.1:{port}", f"127.0.0.1:{ports[name]}")
    return (
        script.replace("127.0.0.1:8181", f"127.0.0.1:{demo}")
        .replace("export PATH=$PWD/.venv/bin:$PATH", "")
        .replace(".dispo/admin.token", "$DISPO_DATA_DIR/admin.token")
    )


async def test_the_tour_runs_as_written(stack_env, tmp_path):
    env, ports, demo = stack_env
    blocks = tour_blocks()
    assert len(blocks) == 5
    output = tmp_path / "up.out"
    with open(output, "wb") as out:
        up = subprocess.Popen(
            [str(BIN / "dispo"), "up", "--nats-port", str(free_port()), "--demo-port", str(demo)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> bool:
            assert up.poll() is None, output.read_text()
            return "Ctrl-C stops everything" in output.read_text()

        await eventually(ready, timeout=120, interval=0.1, wanted="the stack up")
        # the tour exports DISPO_TOKEN itself; the Python examples and the pipeline guide
        # (and a second run, in the same terminal) have it from there
        exported = {**env, "DISPO_TOKEN": (Path(env["DISPO_DATA_DIR"]) / "admin.token").read_text()}
        jq = shutil.which("jq") is not None  # the pipeline guide picks ids with jq
        # The guides in sequence on one stack: each uses its own keys and ids.
        await run_the_tour(blocks, env, exported, ports, demo, tmp_path)
        if jq:
            await run_the_pipeline_guide(exported, ports, demo, tmp_path)
        # Then again what a second run of them meets from the first (the same keys, the same
        # evaluation id): it answers as the first time, and no call of it is refused (set -e).
        await run_the_tour_again(blocks, exported, ports, demo, tmp_path)
        if jq:
            await run_the_pipeline_guide_again(exported, ports, demo, tmp_path)
    finally:
        up.send_signal(signal.SIGINT)
        await asyncio.to_thread(up.wait, 60)


# A block naming an idempotency key or an evaluation id makes what a second run of its guide
# meets again (the same task, the same evaluation). Every other block makes new work each
# time it runs (a task without a key gets a new id) or only reads, so running it twice
# repeats the first run.
KEYED = re.compile(r"idempotency_key|evaluation_id")


def keyed(blocks: list[str]) -> list[str]:
    return [block for block in blocks if KEYED.search(block)]


async def shell(
    blocks: list[str], env: dict[str, str], ports: dict[str, int], demo: int, cwd: Path, *flags: str
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        ["timeout", "180", "bash", "-u", *flags, "-c", localise("\n".join(blocks), ports, demo)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )


async def python(script: str, env: dict[str, str], ports: dict[str, int], demo: int) -> str:
    """What ``script`` printed; it must end without error."""
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", localise(script, ports, demo)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran.stdout


async def run_the_tour(
    blocks: list[str],
    env: dict[str, str],
    exported: dict[str, str],
    ports: dict[str, int],
    demo: int,
    cwd: Path,
) -> None:
    result = await shell(blocks, env, ports, demo, cwd)
    out = result.stdout + result.stderr

    assert out.count("SERVING") >= len(SERVICES), out
    assert "unknown cell 'delete_everything'" in out, out
    assert out.count('"status": "TASK_STATUS_SUCCEEDED"') >= 2, (
        out
    )  # first task and the released one
    assert '"demoted_depth": 1' in out, out
    assert "JOB_STATUS_COMPLETED" in out and '"pass_rate": 1' in out, out
    assert (await python(python_block(), exported, ports, demo)).strip() == "SUCCEEDED"


async def run_the_tour_again(
    blocks: list[str], env: dict[str, str], ports: dict[str, int], demo: int, cwd: Path
) -> None:
    """The tour's keyed blocks (the content-42 task, the tour-1 evaluation) and its Python
    example (the content-44 task) a second time."""
    again = keyed(blocks)
    assert len(again) == 2, again
    result = await shell(again, env, ports, demo, cwd, "-e", "-o", "pipefail")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert "JOB_STATUS_COMPLETED" in out and '"pass_rate": 1' in out, out
    assert KEYED.search(python_block())
    assert (await python(python_block(), env, ports, demo)).strip() == "SUCCEEDED"


def pipeline_guide() -> tuple[list[str], str]:
    """docs/pipeline.md's walk-through (the blocks after `dispo up`) and its Python example."""
    text = (ROOT / "docs" / "pipeline.md").read_text()
    walkthrough = text.split("## Five minutes", 1)[1].split("### From Python", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", walkthrough, re.S)[1:]  # the first is `dispo up`
    [example] = re.findall(
        r"```python\n(.*?)```", text.split("### From Python", 1)[1].split("## ", 1)[0], re.S
    )
    return blocks, example


async def run_the_pipeline_guide(
    env: dict[str, str], ports: dict[str, int], demo: int, cwd: Path
) -> None:
    """docs/pipeline.md's walk-through and its Python example, run as written after the
    tour on the tour's stack (the `dispo up` the guide starts with)."""
    blocks, example = pipeline_guide()
    assert len(blocks) == 4, blocks
    result = await shell(blocks, env, ports, demo, cwd)
    out = result.stdout + result.stderr
    assert '"duplicate": true' in out and '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert (
        '[{"label.set_label":"NODE_STATUS_FAILED"},{"label.audit":"NODE_STATUS_DEPENDENCY_FAILED"},'
        '{"start_review.open_ticket":"NODE_STATUS_SUCCEEDED"},'
        '{"notify_owner.send":"NODE_STATUS_DEPENDENCY_FAILED"}]'
    ) in out, out
    assert '["NODE_STATUS_CANCELLED","NODE_STATUS_CANCELLED"]' in out, out
    assert "Code: InvalidArgument" in out, out
    assert "cells[0].cell: unknown cell 'delete_everything'" in out, out
    assert (await python(example, env, ports, demo)).startswith("SUCCEEDED {")


async def run_the_pipeline_guide_again(
    env: dict[str, str], ports: dict[str, int], demo: int, cwd: Path
) -> None:
    """The walk-through's keyed block (the content-42-pipeline task) and its Python example
    (content-44-pipeline) a second time."""
    blocks, example = pipeline_guide()
    again = keyed(blocks)
    assert len(again) == 1, again
    result = await shell(again, env, ports, demo, cwd, "-e", "-o", "pipefail")
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert '"duplicate": true' in out and '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert KEYED.search(example)
    assert (await python(example, env, ports, demo)).startswith("SUCCEEDED {")


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    install, test = (block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S))
    install = install.removesuffix(" && .venv/bin/dispo up")
    assert "[local,dev]" in install, install  # the extras that bring the embedded stack
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(install) for line in ci), f"CI does not run {install!r}"
    assert test in ci, f"CI does not run {test!r}"
