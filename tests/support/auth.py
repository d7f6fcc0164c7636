"""Tokens for the tests: every test database holds an admin token and one service token per
process (seeded once into the template the databases are cloned from), so each test's
clients and service processes authenticate as in a real stack.

    tokens.admin                                  # the admin secret (fixture ``tokens``)
    tokens.services["reconciler"]                 # what start_service hands the reconciler
    async with admin_channel(service.address) as channel: ...   # an operator's channel
    secret = await worker_token(gateway.address, "tickets")    # a worker token of a queue
    token_id, secret = await business_token(database_url, "ecommerce")
    secret = await signing_secret(database_url, "ecommerce")   # the webhook signing secret
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import grpc
from dispo.auth import store
from dispo.auth.signing import (
    KEY_ENV,
    SIGNING_KEY_HOLDERS,
    SigningKey,
    SigningSecretRecord,
    new_key,
    new_salt,
    new_secret_id,
)
from dispo.libs.api.auth.v1 import auth_pb2, auth_pb2_grpc
from dispo.libs.auth import (
    RULES,
    Authorizer,
    Kind,
    Rule,
    open_channel,
    open_sync_channel,
)
from dispo.libs.auth.tokens import TokenRecord, new_secret, new_token_id, secret_hash
from dispo.libs.auth.verifier import TokenVerifier
from dispo.libs.clock import SystemClock
from dispo.libs.db.driver import Database
from dispo.tools.stack.stack import POOL_WORKER, SERVICES

CALLERS = (*SERVICES, POOL_WORKER)
# This session's tokens, set by the ``infra`` fixture (tests/conftest.py).
_session: list[TestTokens] = []


@dataclass(frozen=True)
class TestTokens:
    __test__ = False  # not a test class

    admin: str
    services: dict[str, str]
    # DISPO_SIGNING_KEY of the gateways and reconcilers the tests start.
    signing_key: str

    @classmethod
    def make(cls) -> TestTokens:
        """New tokens for this session (:func:`session_tokens` returns them from now on)."""
        made = cls(new_secret(), {name: new_secret() for name in CALLERS}, new_key())
        _session.append(made)
        return made

    async def seed(self, url: str) -> None:
        """Store the tokens in the database at ``url``."""
        entries = [(Kind.ADMIN, "", self.admin)] + [
            (Kind.SERVICE, name, secret) for name, secret in self.services.items()
        ]
        db = await Database.open(url, "auth", size=1)
        try:
            async with db.transaction() as conn:
                for kind, service, secret in entries:
                    await store.token_insert(
                        conn, record(kind, service=service), secret_hash(secret)
                    )
        finally:
            await db.close()

    def service_env(self, name: str) -> dict[str, str]:
        """The environment that hands ``name`` (a service or ``pool-worker``) its token, and
        the gateway and the reconciler the signing key, as ``dispo up`` does."""
        env = {"DISPO_SERVICE_TOKEN": self.services[name]}
        if name in SIGNING_KEY_HOLDERS:
            env[KEY_ENV] = self.signing_key
        return env

    @property
    def key(self) -> SigningKey:
        return SigningKey.parse(self.signing_key)


def record(
    kind: Kind, *, business: str = "", service: str = "", expires_at: datetime | None = None
) -> TokenRecord:
    return TokenRecord(
        new_token_id(), kind, business, service, "test", datetime.now(UTC), expires_at, None
    )


async def business_token(
    database_url: str, business: str, *, expires_at: datetime | None = None
) -> tuple[str, str]:
    """A new token of ``business`` in the test's database: (token id, secret)."""
    secret = new_secret()
    made = record(Kind.BUSINESS, business=business, expires_at=expires_at)
    db = await Database.open(database_url, "auth", size=1)
    try:
        async with db.connection() as conn:
            await store.token_insert(conn, made, secret_hash(secret))
    finally:
        await db.close()
    return made.token_id, secret


async def signing_secret(database_url: str, business: str) -> str:
    """A current webhook signing secret for ``business`` in the test's database, made under
    the session's signing key (unless it has one): the secret."""
    key = session_tokens().key
    made = SigningSecretRecord(
        new_secret_id(), business, new_salt(), key.key_id, datetime.now(UTC), None
    )
    db = await Database.open(database_url, "auth", size=1)
    try:
        async with db.connection() as conn:
            if not await store.signing_secret_insert_if_none(conn, made):
                raise RuntimeError(f"{business!r} has a signing secret already")
    finally:
        await db.close()
    return key.derive(business, made.secret_id, made.salt)


def authorizer(db: Database, rules: dict[str, Rule] | None = None) -> Authorizer:
    """What a service's server checks calls with, for a server a test runs in-process on
    ``db`` (no cache, so a revoke shows at once); ``rules`` adds rules for test methods."""
    return Authorizer(TokenVerifier(db, SystemClock(), 0), {**RULES, **(rules or {})})


def session_tokens() -> TestTokens:
    """The tokens every test database of this session holds."""
    if not _session:
        raise RuntimeError("no test infrastructure yet: ask for a database or service fixture")
    return _session[-1]


def admin_channel(address: str) -> grpc.aio.Channel:
    """A channel to ``address`` whose calls carry the session's admin token."""
    return open_channel(address, session_tokens().admin)


async def worker_token(gateway: str, *queues: str) -> str:
    """A new worker token serving ``queues``, made through the gateway's TokenService as an
    operator would: its secret."""
    async with admin_channel(gateway) as channel:
        reply = await auth_pb2_grpc.TokenServiceStub(channel).CreateToken(
            auth_pb2.CreateTokenRequest(kind=auth_pb2.TOKEN_KIND_WORKER, queues=list(queues)),
            timeout=10,
        )
    return reply.secret


def admin_sync_channel(address: str) -> grpc.Channel:
    """A blocking channel to ``address`` whose calls carry the session's admin token."""
    return open_sync_channel(address, session_tokens().admin)
