"""The async SQLAlchemy engine on asyncpg, with ``search_path`` set to one service's schema."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` (as printed by PostgreSQL tools) and use the asyncpg driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def create_engine(url: str, schema: str, *, pool_size: int = 20) -> AsyncEngine:
    """An engine whose connections see ``schema`` first, so queries name tables unqualified.

    At most ``pool_size`` connections, opened on demand and kept: no overflow connections,
    which the pool would close on return and reopen on the next burst (a new PostgreSQL
    backend each time, which under load costs more than the queries).

    No ping at checkout (``pool_pre_ping``): it costs a round trip per transaction. A
    connection PostgreSQL dropped (a restart) fails its first statement instead; SQLAlchemy
    then invalidates the whole pool, so the caller sees one disconnect error (UNAVAILABLE
    for a request, a nak for a consumer) and the next checkout connects afresh.

    Sequential scans are off for the session (ADR-0063): the hot statements join arrays to
    tables by key, and a generic plan made while a table is small would scan it whole, on
    every execution, as it grows. A statement with no index to use still scans.

    The schema itself is created by :func:`dispo.libs.db.migrate`.
    """
    return create_async_engine(
        normalize_url(url),
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=False,
        connect_args={
            "server_settings": {
                "search_path": schema,
                "application_name": f"dispo-{schema}",
                "enable_seqscan": "off",
            }
        },
    )
