"""The read every server makes of the token store: a secret's hash to its token
(:class:`~dispo.libs.auth.verifier.TokenVerifier`), and the shape of an ``auth.tokens`` row.

The table belongs to the auth context (``dispo.auth``: its migrations, its writes and the
token service's reads, :mod:`dispo.auth.store`); this one read is every service's, so it
lives with the check that makes it. Names are schema-qualified: every service's engine has
its own schema first on its search path.
"""

from __future__ import annotations

from typing import Any

from dispo.libs.auth.tokens import Kind, TokenRecord
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

TOKEN_COLUMNS = "id, kind, business, service, label, created_at, expires_at, revoked_at"


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
    )


async def token_by_hash(conn: AsyncConnection, digest: str) -> TokenRecord | None:
    row = (
        await conn.execute(
            text(f"SELECT {TOKEN_COLUMNS} FROM auth.tokens WHERE secret_sha256 = :digest"),
            {"digest": digest},
        )
    ).first()
    return token_record(row) if row is not None else None
