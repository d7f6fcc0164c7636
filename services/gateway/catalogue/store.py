"""Every SQL statement of the catalogue's versions (ADR-0111), on the driver port. The one
write is :func:`catalogue_versions_insert_if_next`: a version is inserted only as the next
after its parent, so of two changes made from one version exactly one is recorded."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispo.libs.db.driver import Conn, Row, Statement


@dataclass(frozen=True)
class VersionRow:
    version: int
    parent: int
    # The catalogue file's mapping, as JSON text ("" in a listing).
    document: str
    owners: dict[str, str]
    retired: tuple[str, ...]
    author: str
    change: str
    created_at: datetime

    @property
    def data(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.document or "{}")
        return parsed


def _version(row: Row) -> VersionRow:
    return VersionRow(
        row.version,
        row.parent,
        row.document or "",
        dict(json.loads(row.owners)),
        tuple(json.loads(row.retired)),
        row.author,
        row.change,
        row.created_at,
    )


_COLUMNS = (
    "version, parent, owners::text AS owners, retired::text AS retired, author, change, created_at"
)

_INSERT = Statement(
    "INSERT INTO catalogue_versions (version, parent, document, owners, retired, author,"
    " change, created_at) VALUES (:parent + 1, :parent, CAST(:document AS json),"
    " CAST(:owners AS jsonb), CAST(:retired AS jsonb), :author, :change, :now)"
    " ON CONFLICT (version) DO NOTHING RETURNING version"
)


async def catalogue_versions_insert_if_next(
    conn: Conn,
    parent: int,
    document: dict[str, Any],
    owners: dict[str, str],
    retired: tuple[str, ...],
    *,
    author: str,
    change: str,
    now: datetime,
) -> int | None:
    """Record version ``parent + 1``; None when another change recorded it first (nothing
    written). ``parent`` 0 records the first version (the seed)."""
    rows = await _INSERT.fetch(
        conn,
        {
            "parent": parent,
            "document": json.dumps(document, separators=(",", ":")),  # in its own order
            "owners": json.dumps(owners, sort_keys=True),
            "retired": json.dumps(sorted(retired)),
            "author": author,
            "change": change,
            "now": now,
        },
    )
    return int(rows[0][0]) if rows else None


_LATEST = Statement("SELECT COALESCE(max(version), 0) FROM catalogue_versions")


async def catalogue_versions_latest(conn: Conn) -> int:
    """The current version's number (0: none yet)."""
    return int((await _LATEST.scalars(conn))[0])


_GET = Statement(
    f"SELECT {_COLUMNS}, document::text AS document FROM catalogue_versions"
    " WHERE version = :version"
)


async def catalogue_versions_get(conn: Conn, version: int) -> VersionRow | None:
    rows = await _GET.fetch(conn, {"version": version})
    return _version(rows[0]) if rows else None


_LIST = Statement(
    f"SELECT {_COLUMNS}, '' AS document FROM catalogue_versions WHERE version < :before"
    " ORDER BY version DESC LIMIT CAST(:limit AS integer)"
)


async def catalogue_versions_list(conn: Conn, before: int, limit: int) -> list[VersionRow]:
    """Versions older than ``before``, newest first, without their documents."""
    return [_version(r) for r in await _LIST.fetch(conn, {"before": before, "limit": limit})]
