"""The local driver: crons are rows of a SQLite registry that the pool-worker process
watches, running one loop per cron. Wake-ups go over NATS (core subject ``pool.wake.<id>``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from dispo.libs.contracts import evaluations as contract
from dispo.libs.private_files import PRIVATE_FILE, PRIVATE_FOLDER, open_private
from dispo.pool.domain import DriverCron
from dispo.pool.drivers.base import encode_state

WAKE_SUBJECT = contract.POOL_WAKE

_SCHEMA = """CREATE TABLE IF NOT EXISTS crons (
    id TEXT PRIMARY KEY, state TEXT NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"""


class Registry:
    """Synchronous access to the registry file, shared by the driver and the worker."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
        # Owner-only (its rows are the crons' targets and states): made so before SQLite
        # opens it, which gives its journal files the database file's mode.
        open_private(self.path).close()
        for journal in ("-wal", "-shm"):  # an earlier version's, readable by others
            with contextlib.suppress(FileNotFoundError):
                self.path.with_name(self.path.name + journal).chmod(PRIVATE_FILE)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One transaction on a connection closed after it: a connection left to the
        garbage collector keeps its file open until a collection (the worker lists the
        registry every tick)."""
        db = sqlite3.connect(self.path, timeout=10)
        try:
            with db:
                yield db
        finally:
            db.close()

    def create(self, cron_id: str, state: str) -> None:
        with self._connect() as db:
            db.execute("INSERT OR IGNORE INTO crons (id, state) VALUES (?, ?)", (cron_id, state))

    def remove(self, cron_id: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM crons WHERE id = ?", (cron_id,))

    def list(self) -> list[DriverCron]:
        with self._connect() as db:
            rows = db.execute("SELECT id, state FROM crons ORDER BY id").fetchall()
        return [DriverCron(r[0], json.loads(r[1])) for r in rows]

    def get(self, cron_id: str) -> DriverCron | None:
        with self._connect() as db:
            row = db.execute("SELECT id, state FROM crons WHERE id = ?", (cron_id,)).fetchone()
        return DriverCron(row[0], json.loads(row[1])) if row else None

    def write_state(self, cron_id: str, state: str) -> None:
        with self._connect() as db:
            db.execute("UPDATE crons SET state = ? WHERE id = ?", (state, cron_id))


class LocalDriver:
    name = "local"

    def __init__(
        self, registry_path: Path, publish: Callable[[str, bytes], Awaitable[None]]
    ) -> None:
        self.registry = Registry(registry_path)
        self._publish = publish

    async def create(self, cron_id: str, state: dict) -> None:
        await asyncio.to_thread(self.registry.create, cron_id, encode_state(state))

    async def remove(self, cron_id: str) -> None:
        await asyncio.to_thread(self.registry.remove, cron_id)

    async def list(self) -> list[DriverCron]:
        return await asyncio.to_thread(self.registry.list)

    async def find(self, cron_id: str) -> DriverCron | None:
        return await asyncio.to_thread(self.registry.get, cron_id)

    async def write_state(self, cron_id: str, state: dict) -> None:
        await asyncio.to_thread(self.registry.write_state, cron_id, encode_state(state))

    async def trigger(self, cron_id: str) -> None:
        await self._publish(contract.pool_wake(cron_id), b"")

    async def drain(self) -> None:
        """Nothing runs in the background: every call is done when it returns."""
