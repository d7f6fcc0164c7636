"""`dispo up` as a real process, on free ports, in a folder of the test's own.

running = RunningStack.fresh(tmp_path)
await running.up()                      # until it prints that it is up
state = read_state(running.data_dir)    # pids and addresses
await running.down()                    # Ctrl-C, exit code 0
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from dispo.libs.db.passwords import PASSWORDS_FILE
from dispo.libs.process import free_port
from dispo.tools.bench.machine import process_times
from dispo.tools.stack.ownership import start_ticks
from dispo.tools.stack.stack import SERVICES

from support.waiting import eventually

DISPO = str(Path(sys.executable).parent / "dispo")


class RunningStack:
    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.env = env
        self.output = data_dir.parent / "up.out"
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def fresh(cls, root: Path) -> RunningStack:
        """A stack kept in ``root/data``, its NATS, demo downstream and services on free ports."""
        env = {
            **os.environ,
            "DISPO_DATA_DIR": str(root / "data"),
            "NATS_PORT": str(free_port()),
            "DEMO_PORT": str(free_port()),
            "DISPO_CONSOLE_PORT": str(free_port()),  # dispo up's --console-port
        }
        for name in SERVICES:
            env[f"DISPO_{name.upper()}_PORT"] = str(free_port())
            env[f"DISPO_{name.upper()}_METRICS_PORT"] = str(free_port())
        return cls(root / "data", env)

    def database_passwords(self) -> dict[str, str]:
        """The passwords ``dispo up`` keeps: the superuser's (``postgres``) and each
        service's role's."""
        return json.loads((self.data_dir / PASSWORDS_FILE).read_text())

    @property
    def token(self) -> str:
        """The admin token the stack made on its first start."""
        return (self.data_dir / "admin.token").read_text().strip()

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.env[f'DISPO_{service.upper()}_PORT']}"

    def up_arguments(self, *args: str) -> list[str]:
        """``up`` on this stack's ports, with ``args`` added (``dispo`` comes before)."""
        return [
            "up",
            "--nats-port",
            self.env["NATS_PORT"],
            "--demo-port",
            self.env["DEMO_PORT"],
            *args,
        ]

    async def up(self) -> None:
        with open(self.output, "wb") as out:
            self.process = subprocess.Popen(
                [DISPO, *self.up_arguments()], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

        def ready() -> bool:
            assert self.process is not None
            assert self.process.poll() is None, self.output.read_text()
            return "Ctrl-C stops everything" in self.output.read_text()

        await eventually(ready, timeout=120, interval=0.1, wanted="the stack up")

    def run(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """``dispo *args`` for this stack, to its end; output and errors together."""
        return subprocess.run(
            [DISPO, *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )

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


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended)."""
    return start_ticks(pid) is not None


def descendants(pid: int) -> set[int]:
    """The pids of every live process below ``pid`` (children, theirs, and so on)."""
    parents = {
        int(entry.name): times[0]
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and (times := process_times(int(entry.name))) is not None
    }
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {p for p in found if alive(p)}
