"""SQL of the token store: ``auth.tokens``, written by the gateway only and read by every
service (each looks up the bearer of a call by its hash). Names are schema-qualified: every
service's engine has its own schema first on its search path."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispo.libs.auth.tokens import Kind, TokenRecord
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

SCHEMA = "auth"
_COLUMNS = "id, kind, business, service, label, created_at, expires_at, revoked_at"


def _record(row: Any) -> TokenRecord:
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


def _params(record: TokenRecord, digest: str) -> dict[str, Any]:
    return {
        "id": record.token_id,
        "digest": digest,
        "kind": record.kind.value,
        "business": record.business,
        "service": record.service,
        "label": record.label,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
    }


async def token_insert(conn: AsyncConnection, record: TokenRecord, digest: str) -> None:
    await conn.execute(
        text(
            "INSERT INTO auth.tokens (id, secret_sha256, kind, business, service, label,"
            " created_at, expires_at)"
            " VALUES (:id, :digest, :kind, :business, :service, :label, :created_at, :expires_at)"
        ),
        _params(record, digest),
    )


async def token_insert_if_absent(conn: AsyncConnection, record: TokenRecord, digest: str) -> bool:
    """Insert unless a token with this id exists (revoked ones included: a token revoked
    once is never brought back). True if inserted."""
    result = await conn.execute(
        text(
            "INSERT INTO auth.tokens (id, secret_sha256, kind, business, service, label,"
            " created_at, expires_at)"
            " VALUES (:id, :digest, :kind, :business, :service, :label, :created_at, :expires_at)"
            " ON CONFLICT DO NOTHING RETURNING id"
        ),
        _params(record, digest),
    )
    return result.first() is not None


async def token_by_hash(conn: AsyncConnection, digest: str) -> TokenRecord | None:
    row = (
        await conn.execute(
            text(f"SELECT {_COLUMNS} FROM auth.tokens WHERE secret_sha256 = :digest"),
            {"digest": digest},
        )
    ).first()
    return _record(row) if row is not None else None


async def token_get(conn: AsyncConnection, token_id: str) -> TokenRecord | None:
    row = (
        await conn.execute(
            text(f"SELECT {_COLUMNS} FROM auth.tokens WHERE id = :id"), {"id": token_id}
        )
    ).first()
    return _record(row) if row is not None else None


async def token_list(
    conn: AsyncConnection, *, business: str = "", include_revoked: bool = False
) -> list[TokenRecord]:
    clauses = ["TRUE"]
    if business:
        clauses.append("business = :business")
    if not include_revoked:
        clauses.append("revoked_at IS NULL")
    rows = await conn.execute(
        text(
            f"SELECT {_COLUMNS} FROM auth.tokens WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at DESC, id"
        ),
        {"business": business},
    )
    return [_record(r) for r in rows]


async def token_revoke_if_live(
    conn: AsyncConnection, token_id: str, now: datetime
) -> TokenRecord | None:
    """Revoke the token unless it is revoked already; the token as it is now (None: no such
    token)."""
    await conn.execute(
        text("UPDATE auth.tokens SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL"),
        {"id": token_id, "now": now},
    )
    return await token_get(conn, token_id)
