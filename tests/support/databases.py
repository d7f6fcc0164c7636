"""A database per test, cloned from a template migrated once per session.

The template holds every service's schema at head, migrated by the services' own Alembic
chains. Each test gets ``CREATE DATABASE … TEMPLATE`` of it and the database is dropped
afterwards, so no test sees another's rows and none pays for the migrations again.

A background thread keeps a few clones ready ahead of the next tests and drops finished ones,
so neither the copy nor the drop sits on a test's setup path. A test that needs a database
with no Dispo tables at all (to watch migrations run) asks for :meth:`blank`.

The protection is the real one: the server wants a password for every connection, and the
template is made as ``dispo up`` makes a database, by the bootstrap (each service's role
owning its schema, no privilege on the others), each chain then migrated as its owner's
role. A clone keeps the schemas' owners and grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

import asyncpg
from dispo.libs.db import create_engine, migrate
from dispo.libs.db.roles import SCHEMAS, Login, ensure_roles, ensure_schemas, login_url
from sqlalchemy.engine import make_url

TEMPLATE = "dispo_template"
# Clones kept ready: a copy takes longer than the shortest tests, not than the average one.
SPARE = 2


def database_url(server_url: str, name: str) -> str:
    """``server_url`` pointing at database ``name`` instead."""
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


async def _execute(url: str, *statements: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


class TestDatabases:
    """Per-test databases on one PostgreSQL server (``server_url``: its maintenance database,
    as the superuser), with ``logins`` the services' roles (service -> login)."""

    __test__ = False  # not a test class

    def __init__(
        self, server_url: str, chains: Iterable[tuple[str, Path]], logins: Mapping[str, Login]
    ) -> None:
        self.server_url = server_url
        # (schema, Alembic script location) in the order the template applies them.
        self.chains = list(chains)
        self.logins = dict(logins)
        self._numbers = itertools.count()
        self._ready: queue.Queue[str] = queue.Queue(maxsize=SPARE)
        self._dropping: queue.Queue[str] = queue.Queue()
        self._wake = threading.Event()
        self._stopping = False
        self._worker: threading.Thread | None = None
        self._last_error: BaseException | None = None

    async def build_template(self, seed: Callable[[str], Awaitable[None]] | None = None) -> None:
        """Create the roles and the template, bootstrap it and migrate every chain into it
        as the chain's owner, then ``seed(url)`` it (rows every test database starts with);
        start the clone worker."""
        await _execute(
            self.server_url,
            f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)',
            f'CREATE DATABASE "{TEMPLATE}"',
        )
        await self._bootstrap(TEMPLATE, roles=True)
        owners = {schema.name: schema.owner for schema in SCHEMAS}
        for schema, location in self.chains:
            url = self.role_url(TEMPLATE, owners[schema])
            engine = create_engine(url, schema)
            try:
                await migrate(engine, schema, location)
            finally:
                await engine.dispose()
        if seed is not None:
            await seed(self.role_url(TEMPLATE, "gateway"))  # the token store's writer
        self._worker = threading.Thread(target=self._work, name="test-databases", daemon=True)
        self._worker.start()

    async def take(self, timeout: float = 60.0) -> str:
        """A fresh clone of the template, for one test; hand it back with :meth:`release`."""
        try:
            name = await asyncio.to_thread(self._ready.get, timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no test database ready: {self._last_error!r}") from None
        self._wake.set()  # make the next one
        return name

    async def blank(self) -> str:
        """A fresh database without any Dispo table (made now, not ahead): bootstrapped, its
        schemas empty, as ``dispo up`` leaves a new database before the services start."""
        name = self._new_name()
        await _execute(self.server_url, f'CREATE DATABASE "{name}"')
        await self._bootstrap(name, roles=False)
        return name

    async def _bootstrap(self, name: str, *, roles: bool) -> None:
        conn = await asyncpg.connect(self.url(name))
        try:
            if roles:  # the server's, for every database
                await ensure_roles(conn, self.logins)
            await ensure_schemas(conn, self.logins)
        finally:
            await conn.close()

    def _new_name(self) -> str:
        return f"dispo_test_{os.getpid()}_{next(self._numbers)}"

    def url(self, name: str) -> str:
        """Database ``name`` as the superuser."""
        return database_url(self.server_url, name)

    def role_url(self, name: str, service: str) -> str:
        """Database ``name`` as ``service``'s own role."""
        return login_url(self.url(name), self.logins[service])

    def release(self, name: str) -> None:
        """Drop ``name`` in the background (its connections are closed by force)."""
        self._dropping.put(name)
        self._wake.set()

    def close(self) -> None:
        """Stop the worker after it has dropped everything handed back."""
        self._stopping = True
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout=60)
        with contextlib.suppress(queue.Empty):
            while True:
                self._drop(self._ready.get_nowait())

    def _work(self) -> None:
        while True:
            self._wake.clear()
            try:
                while not self._dropping.empty():
                    self._drop(self._dropping.get_nowait())
                if self._stopping:
                    return
                if not self._ready.full():
                    name = self._new_name()
                    asyncio.run(
                        _execute(self.server_url, f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
                    )
                    self._ready.put_nowait(name)
                    continue
            except Exception as error:  # reported by take()
                # Most likely a test has taken PostgreSQL away for a moment: try again shortly.
                self._last_error = error
                if self._stopping:
                    return
                self._wake.wait(0.2)
                continue
            self._wake.wait()

    def _drop(self, name: str) -> None:
        try:
            asyncio.run(_execute(self.server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        except Exception:
            self._dropping.put(name)  # PostgreSQL is down; drop it on a later pass
            raise
