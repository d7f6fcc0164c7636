"""`dispo up` on a fresh folder: everything SERVING, crashes restarted, data kept across restarts."""

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import httpx
import pytest
from dispo.libs.health import health_status
from dispo.libs.stack.nats import free_port
from dispo.libs.stack.stack import SERVICES, read_state
from support import eventually

DISPO = str(Path(sys.executable).parent / "dispo")


class RunningStack:
    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.env = env
        self.output = data_dir.parent / "up.out"
        self.process: subprocess.Popen | None = None

    async def up(self) -> None:
        with open(self.output, "wb") as out:
            self.process = subprocess.Popen(
                [
                    DISPO,
                    "up",
                    "--nats-port",
                    self.env["NATS_PORT"],
                    "--demo-port",
                    self.env["DEMO_PORT"],
                ],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def ready() -> bool:
            assert self.process.poll() is None, self.output.read_text()
            return "Ctrl-C stops everything" in self.output.read_text()

        await eventually(ready, timeout=120, interval=0.1, wanted="the stack up")

    def status(self) -> tuple[int, dict]:
        result = subprocess.run(
            [DISPO, "status", "--json"], env=self.env, capture_output=True, text=True
        )
        return result.returncode, json.loads(result.stdout)

    async def down(self) -> int:
        """Ctrl-C; returns the exit code (a failure shows what dispo up printed)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(self.process.wait, 60)
        assert code == 0, self.output.read_text()
        return code

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def stack(tmp_path):
    env = {
        **os.environ,
        "DISPO_DATA_DIR": str(tmp_path / "data"),
        "NATS_PORT": str(free_port()),
        "DEMO_PORT": str(free_port()),
    }
    for name in SERVICES:
        env[f"DISPO_{name.upper()}_PORT"] = str(free_port())
    running = RunningStack(tmp_path / "data", env)
    yield running
    running.kill()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


async def test_up_status_restart_and_data_kept(stack):
    await stack.up()

    code, report = stack.status()
    assert code == 0
    assert set(report) == set(SERVICES)
    for name in SERVICES:
        assert report[name] == {
            "address": f"127.0.0.1:{stack.env[f'DISPO_{name.upper()}_PORT']}",
            "status": "SERVING",
        }

    # the pool's worker process and the demo downstream run beside the services
    state = read_state(stack.data_dir)
    assert {"pool-worker", "demo-downstream"} == set(state["companions"])
    assert all(alive(info["pid"]) for info in state["companions"].values())
    async with httpx.AsyncClient() as http:
        assert (
            await http.get(f"http://127.0.0.1:{stack.env['DEMO_PORT']}/healthz")
        ).status_code == 200

    # a crashed service is restarted
    executor = state["services"]["executor"]
    os.kill(executor["pid"], signal.SIGKILL)
    executor_log = stack.data_dir / "logs" / "executor.log"

    async def restarted() -> bool:
        return (
            executor_log.read_text().count('"event": "serving"') >= 2
            and await health_status(executor["address"]) == "SERVING"
        )

    await eventually(restarted, timeout=60, interval=0.2, wanted="the executor restarted")
    assert not alive(executor["pid"])
    assert alive(read_state(stack.data_dir)["services"]["executor"]["pid"])

    # data written now survives a full stop and start
    conn = await asyncpg.connect(state["database_url"])
    await conn.execute(
        "CREATE TABLE public.kept (v text); INSERT INTO public.kept VALUES ('still here')"
    )
    await conn.close()

    state = read_state(stack.data_dir)
    pids = [info["pid"] for group in ("services", "companions") for info in state[group].values()]
    assert await stack.down() == 0
    assert not any(alive(pid) for pid in pids if pid != executor["pid"])
    assert read_state(stack.data_dir) is None
    code, report = stack.status()
    assert code == 1 and {info["status"] for info in report.values()} == {"UNREACHABLE"}

    await stack.up()
    state = read_state(stack.data_dir)
    conn = await asyncpg.connect(state["database_url"])
    assert await conn.fetchval("SELECT v FROM public.kept") == "still here"
    await conn.close()
    assert stack.status()[0] == 0
    assert await stack.down() == 0


@pytest.mark.blank_database  # the services create their schemas in it
async def test_up_with_external_database_and_nats_starts_only_services(
    infra, database_url, nats_url, tmp_path
):
    env = {
        **os.environ,
        "DISPO_DATA_DIR": str(tmp_path / "data"),
        "DISPO_GATEWAY_PORT": str(free_port()),
        "DISPO_EXECUTOR_PORT": str(free_port()),
    }
    up = subprocess.Popen(
        [
            DISPO,
            "up",
            "--services",
            "gateway,executor",
            "--demo-port",
            "0",
            "--database-url",
            database_url,
            "--nats-url",
            nats_url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed = []
        async with asyncio.timeout(120):
            while not printed or "Ctrl-C" not in printed[-1]:
                printed.append(await asyncio.to_thread(up.stdout.readline))
                assert printed[-1], "".join(printed)
        assert not (tmp_path / "data" / "postgres").exists()
        assert not (tmp_path / "data" / "nats").exists()
        state = read_state(tmp_path / "data")
        assert set(state["services"]) == {"gateway", "executor"}
        assert state["database_url"] == database_url
        for info in state["services"].values():
            assert await health_status(info["address"]) == "SERVING"
        conn = await asyncpg.connect(database_url)
        schemas = {r[0] for r in await conn.fetch("SELECT nspname FROM pg_namespace")}
        await conn.close()
        assert {"gateway", "executor"} <= schemas
        up.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(up.wait, 60) == 0
        assert infra.postgres.running() and infra.nats.running()
    finally:
        if up.poll() is None:
            up.kill()
