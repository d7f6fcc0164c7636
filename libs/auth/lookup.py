"""The read every server makes of the token store: a secret's hash to its token
(:class:`~dispo.libs.auth.verifier.TokenVerifier`), and the shape of an ``auth.tokens`` row.

The table belongs to the auth context (``dispo.auth``: its migrations, its writes and the
token service's reads, :mod:`dispo.auth.store`); this one read is every service's, so it
lives with the check that makes it, on the driver port (:mod:`dispo.libs.db.driver`). Names
are schema-qualified: every service's Database has its own schema first on its search path.
"""

from __future__ import annotations

from typing import Any

from dispo.libs.auth.tokens import Kind, TokenRecord
from dispo.libs.db.driver import Conn, Statement

TOKEN_COLUMNS = (
    "id, kind, business, service, label, created_at, expires_at, revoked_at, queues, max_priority"
)


def token_record(row: Any) -> TokenRecord:
    """An ``auth.tokens`` row read with :data:`TOKEN_COLUMNS`, as a record."""
    return TokenRecord(
        row.id,
        Kind(row.kind),
        row.business,
        row.service,
        row.label,
        row.created_at,
        row.expires_at,
        row.revoked_at,
        tuple(row.queues or ()),
        row.max_priority,
    )


TOKEN_BY_HASH = Statement(f"SELECT {TOKEN_COLUMNS} FROM auth.tokens WHERE secret_sha256 = :digest")


async def token_by_hash(conn: Conn, digest: str) -> TokenRecord | None:
    """The token whose secret hashes to ``digest``; None if the store holds none."""
    rows = await TOKEN_BY_HASH.fetch(conn, {"digest": digest})
    return token_record(rows[0]) if rows else None
