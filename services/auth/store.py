"""SQL of the token store: ``auth.tokens``, written by the gateway only and read by every
service (each looks up the bearer of a call by its hash: :mod:`dispo.libs.auth.lookup`), and
``auth.signing_secrets`` (the gateway writes them, the reconciler signs with them). Names are schema-qualified: every
service's engine has its own schema first on its search path."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from dispo.auth.signing import SigningSecretRecord
from dispo.libs.auth.lookup import TOKEN_COLUMNS, token_record
from dispo.libs.auth.tokens import TokenRecord
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

SCHEMA = "auth"


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


async def token_get(conn: AsyncConnection, token_id: str) -> TokenRecord | None:
    row = (
        await conn.execute(
            text(f"SELECT {TOKEN_COLUMNS} FROM auth.tokens WHERE id = :id"), {"id": token_id}
        )
    ).first()
    return token_record(row) if row is not None else None


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
            f"SELECT {TOKEN_COLUMNS} FROM auth.tokens WHERE {' AND '.join(clauses)}"
            " ORDER BY created_at DESC, id"
        ),
        {"business": business},
    )
    return [token_record(r) for r in rows]


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


# Webhook signing secrets (dispo.auth.signing): salts, never secrets.
_SECRET_COLUMNS = "id, business, salt, key_id, created_at, retires_at"


def _secret_record(row: Any) -> SigningSecretRecord:
    return SigningSecretRecord(
        row.id, row.business, bytes(row.salt), row.key_id, row.created_at, row.retires_at
    )


async def signing_secret_insert_if_none(conn: AsyncConnection, record: SigningSecretRecord) -> bool:
    """Insert ``record`` as its business's current secret unless the business has one.
    True if inserted."""
    result = await conn.execute(
        text(
            "INSERT INTO auth.signing_secrets (id, business, salt, key_id, created_at)"
            " VALUES (:id, :business, :salt, :key_id, :created_at)"
            " ON CONFLICT (business) WHERE retires_at IS NULL DO NOTHING RETURNING id"
        ),
        {
            "id": record.secret_id,
            "business": record.business,
            "salt": record.salt,
            "key_id": record.key_id,
            "created_at": record.created_at,
        },
    )
    return result.first() is not None


async def signing_secrets_valid(
    conn: AsyncConnection, businesses: list[str] | None, now: datetime, *, lock: bool = False
) -> list[SigningSecretRecord]:
    """The secrets of ``businesses`` (None: of every business) valid at ``now``: current
    ones and previous ones not yet retired, by business, newest first (``lock``: FOR
    UPDATE, to rotate)."""
    clause = "" if businesses is None else "business = ANY(:businesses) AND "
    rows = await conn.execute(
        text(
            f"SELECT {_SECRET_COLUMNS} FROM auth.signing_secrets"
            f" WHERE {clause}(retires_at IS NULL OR retires_at > :now)"
            " ORDER BY business, created_at DESC, id" + (" FOR UPDATE" if lock else "")
        ),
        {"businesses": businesses, "now": now},
    )
    return [_secret_record(r) for r in rows]


async def signing_secret_exists(conn: AsyncConnection, business: str) -> bool:
    """Whether ``business`` has a current signing secret."""
    row = (
        await conn.execute(
            text(
                "SELECT 1 FROM auth.signing_secrets"
                " WHERE business = :business AND retires_at IS NULL"
            ),
            {"business": business},
        )
    ).first()
    return row is not None


async def signing_secret_retire_current_if(
    conn: AsyncConnection, secret_id: str, retires_at: datetime
) -> bool:
    """Make the current secret ``secret_id`` a previous one, valid until ``retires_at``.
    False if it is not current any more (a rotation that raced this one)."""
    result = await conn.execute(
        text(
            "UPDATE auth.signing_secrets SET retires_at = :at"
            " WHERE id = :id AND retires_at IS NULL RETURNING id"
        ),
        {"id": secret_id, "at": retires_at},
    )
    return result.first() is not None


async def signing_secrets_retire_previous(
    conn: AsyncConnection, business: str, now: datetime
) -> int:
    """End ``business``'s rotation: its previous secrets not yet retired retire at ``now``.
    How many did."""
    result = await conn.execute(
        text(
            "UPDATE auth.signing_secrets SET retires_at = :now"
            " WHERE business = :business AND retires_at > :now RETURNING id"
        ),
        {"business": business, "now": now},
    )
    return len(result.all())
