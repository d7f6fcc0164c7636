"""Is PostgreSQL unreachable? The one answer every service's gRPC layer uses for UNAVAILABLE.

A call that fails because the database is down, restarting or cut its connection may be
retried by the caller; a call that fails for any other database reason (a constraint, a
bad query) is a bug and stays INTERNAL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
from sqlalchemy.exc import DBAPIError

# PostgreSQL refusing or dropping connections: class 08 (connection exception), shutting
# down or starting up (57P01-57P03), no connection slot left (53300).
_SERVER_GONE: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.CannotConnectNowError,
    asyncpg.exceptions.TooManyConnectionsError,
)
_DRIVERS = ("asyncpg", "sqlalchemy")


class ConnectionLost(Exception):
    """A statement found its connection to PostgreSQL closed (the server went away): raised
    by :mod:`dispo.libs.db.driver` once the connection is out of the pool, as SQLAlchemy
    marks its own (``connection_invalidated``)."""


def interrupted() -> bool:
    """Inside ``except asyncio.CancelledError``: True when no one cancelled the current task,
    so the error was raised by a library rather than by a cancellation. The database driver
    does so when a connection closes under a statement (sqlalchemy#6592, #11821); it is then
    a failure of that call, to be answered as one, not a reason to stop."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def error_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and what it wraps (its ``__cause__``, else its ``__context__``), outermost
    first, each once: a driver's error inside SQLAlchemy's, or inside a handler's own."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def database_unreachable(error: BaseException) -> bool:
    """True when ``error`` (or what it wraps) says PostgreSQL cannot be reached.

    A socket error counts only when the driver raised it (connecting to a server that is
    not there), so an unrelated ``OSError`` in a handler is not mistaken for one.
    """
    for current in error_chain(error):
        if isinstance(current, DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(current, ConnectionLost):
            return True
        if isinstance(current, _SERVER_GONE):
            return True
        if isinstance(current, OSError) and _raised_in_driver(current):
            return True
    return False


def login_refused(error: BaseException) -> bool:
    """True when PostgreSQL refused the login itself (a wrong or missing password, an
    unknown role): waiting will not change that."""
    return any(
        isinstance(current, asyncpg.exceptions.InvalidAuthorizationSpecificationError)
        for current in error_chain(error)
    )


def _raised_in_driver(error: BaseException) -> bool:
    tb = error.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.split(".", 1)[0] in _DRIVERS:
            return True
        tb = tb.tb_next
    return False


__all__ = ["ConnectionLost", "database_unreachable", "error_chain", "login_refused"]
