"""The README's five-minute tour, run as written against `dispo up` (ports moved to free ones),
then docs/pipeline.md's walk-through on the same stack, and both again: the guides can be
run in sequence, twice, on one stack."""

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
        token = (Path(env["DISPO_DATA_DIR"]) / "admin.token").read_text()
        # The guides in sequence, twice, on one stack: each uses its own keys and ids, and a
        # second run meets what the first left (the same keys, the same ids) without error.
        for _ in range(2):
            await run_the_tour(blocks, env, ports, demo, tmp_path, token)
            if shutil.which("jq") is not None:  # the pipeline guide picks ids with jq
                await run_the_pipeline_guide(env, ports, demo, tmp_path, token)
    finally:
        up.send_signal(signal.SIGINT)
        await asyncio.to_thread(up.wait, 60)


async def run_the_tour(
    blocks: list[str], env: dict[str, str], ports: dict[str, int], demo: int, cwd: Path, token: str
) -> None:
    script = localise("\n".join(blocks), ports, demo)
    result = await asyncio.to_thread(
        subprocess.run,
        ["timeout", "180", "bash", "-u", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )
    out = result.stdout + result.stderr

    assert out.count("SERVING") >= len(SERVICES), out
    assert "unknown cell 'delete_everything'" in out, out
    assert out.count('"status": "TASK_STATUS_SUCCEEDED"') >= 2, (
        out
    )  # first task and the released one
    assert '"demoted_depth": 1' in out, out
    assert "JOB_STATUS_COMPLETED" in out and '"pass_rate": 1' in out, out

    python = localise(python_block(), ports, demo)
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", python],
        capture_output=True,
        text=True,
        env={**env, "DISPO_TOKEN": token},
        timeout=60,
    )
    assert result.stdout.strip() == "SUCCEEDED", result.stdout + result.stderr


async def run_the_pipeline_guide(
    env: dict[str, str], ports: dict[str, int], demo: int, cwd: Path, token: str
) -> None:
    """docs/pipeline.md's walk-through and its Python example (each also run on a fresh
    stack by tests/gateway/test_docs.py), here after the tour on the tour's stack."""
    text = (ROOT / "docs" / "pipeline.md").read_text()
    walkthrough = text.split("## Five minutes", 1)[1].split("### From Python", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", walkthrough, re.S)[1:]  # the first is `dispo up`
    result = await asyncio.to_thread(
        subprocess.run,
        ["timeout", "120", "bash", "-u", "-c", localise("\n".join(blocks), ports, demo)],
        capture_output=True,
        text=True,
        env={**env, "DISPO_TOKEN": token},
        cwd=cwd,
    )
    out = result.stdout + result.stderr
    assert '"duplicate": true' in out and '"status": "TASK_STATUS_SUCCEEDED"' in out, out
    assert '{"start_review.open_ticket":"NODE_STATUS_SUCCEEDED"}' in out, out
    assert '["NODE_STATUS_CANCELLED","NODE_STATUS_CANCELLED"]' in out, out
    [example] = re.findall(
        r"```python\n(.*?)```", text.split("### From Python", 1)[1].split("## ", 1)[0], re.S
    )
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", localise(example, ports, demo)],
        capture_output=True,
        text=True,
        env={**env, "DISPO_TOKEN": token},
        timeout=60,
    )
    assert ran.stdout.startswith("SUCCEEDED {"), ran.stdout + ran.stderr


def test_ci_runs_the_readme_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    install, test = (block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S))
    install = install.removesuffix(" && .venv/bin/dispo up")
    assert "[local,dev]" in install, install  # the extras that bring the embedded stack
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith(install) for line in ci), f"CI does not run {install!r}"
    assert test in ci, f"CI does not run {test!r}"
