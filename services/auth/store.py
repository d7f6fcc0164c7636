"""SQL of the token store: ``auth.tokens``, written by the gateway only and read by every
service (each looks up the bearer of a call by its hash: :mod:`dispo.libs.auth.lookup`), and
``auth.signing_secrets`` (the gateway writes them, the reconciler signs with them). Every
statement runs on the driver port (:mod:`dispo.libs.db.driver`). Names are schema-qualified: every service's
connections have its own schema first on their search path."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from dispo.auth.signing import SigningSecretRecord
from dispo.libs.auth.lookup import TOKEN_COLUMNS, token_record
from dispo.libs.auth.tokens import TokenRecord
from dispo.libs.db.driver import Conn, Statement

SCHEMA = "auth"

_TOKEN_INSERT = Statement(
    "INSERT INTO auth.tokens (id, secret_sha256, kind, business, service, label,"
    " created_at, expires_at, queues, max_priority)"
    " VALUES (:id, :digest, :kind, :business, :service, :label, :created_at, :expires_at,"
    " CAST(:queues AS text[]), :max_priority)"
)


async def token_insert(conn: Conn, record: TokenRecord, digest: str) -> None:
    await _TOKEN_INSERT.fetch(
        conn,
        {
            "id": record.token_id,
            "digest": digest,
            "kind": record.kind.value,
            "business": record.business,
            "service": record.service,
            "label": record.label,
            "created_at": record.created_at,
            "expires_at": record.expires_at,
            "queues": list(record.queues),
            "max_priority": record.max_priority,
        },
    )


_TOKENS_INSERT_IF_ABSENT = Statement(
    "INSERT INTO auth.tokens (id, secret_sha256, kind, business, service, label,"
    " created_at, expires_at)"
    " SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:digests AS text[]),"
    " CAST(:kinds AS text[]), CAST(:businesses AS text[]), CAST(:services AS text[]),"
    " CAST(:labels AS text[]), CAST(:created AS timestamptz[]),"
    " CAST(:expires AS timestamptz[]))"
    " ON CONFLICT DO NOTHING RETURNING id"
)


async def tokens_insert_if_absent(
    conn: Conn, tokens: Sequence[tuple[TokenRecord, str]]
) -> set[str]:
    """Insert each ``(record, digest)`` unless a token with its id (or its secret) exists,
    revoked ones included (a token revoked once is never brought back), with one
    statement; the ids inserted."""
    if not tokens:
        return set()
    records = [r for r, _ in tokens]
    return set(
        await _TOKENS_INSERT_IF_ABSENT.scalars(
            conn,
            {
                "ids": [r.token_id for r in records],
                "digests": [digest for _, digest in tokens],
                "kinds": [r.kind.value for r in records],
                "businesses": [r.business for r in records],
                "services": [r.service for r in records],
                "labels": [r.label for r in records],
                "created": [r.created_at for r in records],
                "expires": [r.expires_at for r in records],
            },
        )
    )


_TOKEN_GET = Statement(f"SELECT {TOKEN_COLUMNS} FROM auth.tokens WHERE id = :id")


async def token_get(conn: Conn, token_id: str) -> TokenRecord | None:
    rows = await _TOKEN_GET.fetch(conn, {"id": token_id})
    return token_record(rows[0]) if rows else None


async def token_list(
    conn: Conn, *, business: str = "", include_revoked: bool = False
) -> list[TokenRecord]:
    clauses = ["TRUE"]
    if business:
        clauses.append("business = :business")
    if not include_revoked:
        clauses.append("revoked_at IS NULL")
    rows = await conn.fetch(
        f"SELECT {TOKEN_COLUMNS} FROM auth.tokens WHERE {' AND '.join(clauses)}"
        " ORDER BY created_at DESC, id",
        {"business": business},
    )
    return [token_record(r) for r in rows]


_TOKEN_REVOKE_IF_LIVE = Statement(
    "UPDATE auth.tokens SET revoked_at = :now WHERE id = :id AND revoked_at IS NULL"
)


async def token_revoke_if_live(conn: Conn, token_id: str, now: datetime) -> TokenRecord | None:
    """Revoke the token unless it is revoked already; the token as it is now (None: no such
    token)."""
    await _TOKEN_REVOKE_IF_LIVE.fetch(conn, {"id": token_id, "now": now})
    return await token_get(conn, token_id)


# Webhook signing secrets (dispo.auth.signing): salts, never secrets.
_SECRET_COLUMNS = "id, business, salt, key_id, created_at, retires_at"


def _secret_record(row: Any) -> SigningSecretRecord:
    return SigningSecretRecord(
        row.id, row.business, bytes(row.salt), row.key_id, row.created_at, row.retires_at
    )


_SECRET_INSERT_IF_NONE = Statement(
    "INSERT INTO auth.signing_secrets (id, business, salt, key_id, created_at)"
    " VALUES (:id, :business, :salt, :key_id, :created_at)"
    " ON CONFLICT (business) WHERE retires_at IS NULL DO NOTHING RETURNING id"
)


async def signing_secret_insert_if_none(conn: Conn, record: SigningSecretRecord) -> bool:
    """Insert ``record`` as its business's current secret unless the business has one.
    True if inserted."""
    rows = await _SECRET_INSERT_IF_NONE.fetch(
        conn,
        {
            "id": record.secret_id,
            "business": record.business,
            "salt": record.salt,
            "key_id": record.key_id,
            "created_at": record.created_at,
        },
    )
    return bool(rows)


def _secrets_valid(of_businesses: bool, lock: bool) -> Statement:
    return Statement(
        f"SELECT {_SECRET_COLUMNS} FROM auth.signing_secrets"
        " WHERE "
        + ("business = ANY(CAST(:businesses AS text[])) AND " if of_businesses else "")
        + "(retires_at IS NULL OR retires_at > CAST(:now AS timestamptz))"
        " ORDER BY business, created_at DESC, id" + (" FOR UPDATE" if lock else "")
    )


# By (of some businesses only, locked).
_SECRETS_VALID = {
    (of, lock): _secrets_valid(of, lock) for of in (False, True) for lock in (False, True)
}


async def signing_secrets_valid(
    conn: Conn,
    businesses: list[str] | None,
    now: datetime,
    *,
    lock: bool = False,
) -> list[SigningSecretRecord]:
    """The secrets of ``businesses`` (None: of every business) valid at ``now``: current
    ones and previous ones not yet retired, by business, newest first (``lock``: FOR
    UPDATE, to rotate)."""
    params: dict[str, Any] = {"now": now}
    if businesses is not None:
        params["businesses"] = businesses
    rows = await conn.fetch(_SECRETS_VALID[(businesses is not None, lock)], params)
    return [_secret_record(r) for r in rows]


_SECRET_EXISTS = Statement(
    "SELECT 1 FROM auth.signing_secrets WHERE business = :business AND retires_at IS NULL"
)


async def signing_secret_exists(conn: Conn, business: str) -> bool:
    """Whether ``business`` has a current signing secret."""
    return bool(await _SECRET_EXISTS.fetch(conn, {"business": business}))


_SECRET_RETIRE_CURRENT_IF = Statement(
    "UPDATE auth.signing_secrets SET retires_at = :at"
    " WHERE id = :id AND retires_at IS NULL RETURNING id"
)


async def signing_secret_retire_current_if(
    conn: Conn, secret_id: str, retires_at: datetime
) -> bool:
    """Make the current secret ``secret_id`` a previous one, valid until ``retires_at``.
    False if it is not current any more (a rotation that raced this one)."""
    return bool(await _SECRET_RETIRE_CURRENT_IF.fetch(conn, {"id": secret_id, "at": retires_at}))


_SECRETS_RETIRE_PREVIOUS = Statement(
    "UPDATE auth.signing_secrets SET retires_at = :now"
    " WHERE business = :business AND retires_at > :now RETURNING id"
)


async def signing_secrets_retire_previous(conn: Conn, business: str, now: datetime) -> int:
    """End ``business``'s rotation: its previous secrets not yet retired retire at ``now``.
    How many did."""
    return len(await _SECRETS_RETIRE_PREVIOUS.fetch(conn, {"business": business, "now": now}))
