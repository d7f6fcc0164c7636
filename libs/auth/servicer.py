"""dispo.auth.v1.TokenService: create, list and revoke API tokens (the gateway serves it;
admin tokens only, :mod:`.rules`)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import grpc
from dispo.libs.api.auth.v1 import auth_pb2 as pb
from dispo.libs.api.auth.v1 import auth_pb2_grpc
from dispo.libs.auth import store
from dispo.libs.auth.tokens import Kind, TokenRecord, new_secret, new_token_id, secret_hash
from dispo.libs.auth.verifier import TokenVerifier
from dispo.libs.clock import Clock
from dispo.libs.errors import InvalidArgument, NotFound
from dispo.libs.logging import get_logger
from dispo.libs.validation import identifier
from sqlalchemy.ext.asyncio import AsyncEngine

log = get_logger(__name__)

SERVICE_NAME = "dispo.auth.v1.TokenService"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Ten years: longer is "does not expire", which is ttl_seconds 0.
MAX_TTL_SECONDS = 10 * 365 * 86400
_KINDS = {
    pb.TOKEN_KIND_BUSINESS: Kind.BUSINESS,
    pb.TOKEN_KIND_ADMIN: Kind.ADMIN,
    pb.TOKEN_KIND_SERVICE: Kind.SERVICE,
}
_KIND_VALUES = {kind: value for value, kind in _KINDS.items()}


def token_to_proto(record: TokenRecord) -> pb.Token:
    out = pb.Token(
        token_id=record.token_id,
        kind=_KIND_VALUES[record.kind],
        business=record.business,
        service=record.service,
        label=record.label,
    )
    out.created_at.FromDatetime(record.created_at)
    if record.expires_at is not None:
        out.expires_at.FromDatetime(record.expires_at)
    if record.revoked_at is not None:
        out.revoked_at.FromDatetime(record.revoked_at)
    return out


class TokenServicer(auth_pb2_grpc.TokenServiceServicer):
    def __init__(self, engine: AsyncEngine, clock: Clock, verifier: TokenVerifier) -> None:
        self.engine = engine
        self.clock = clock
        self.verifier = verifier

    def _record(self, request: pb.CreateTokenRequest) -> TokenRecord:
        kind = _KINDS.get(request.kind)
        if kind is None:
            raise InvalidArgument(
                "kind", "TOKEN_KIND_BUSINESS, TOKEN_KIND_ADMIN or TOKEN_KIND_SERVICE"
            )
        business = service = ""
        if kind is Kind.BUSINESS:
            business = identifier(request.business, "business", NAME_PATTERN)
        elif request.business:
            raise InvalidArgument("business", "only a business token names a business")
        if kind is Kind.SERVICE:
            service = identifier(request.service, "service", NAME_PATTERN)
        elif request.service:
            raise InvalidArgument("service", "only a service token names a service")
        if request.ttl_seconds > MAX_TTL_SECONDS:
            raise InvalidArgument(
                "ttl_seconds", f"at most {MAX_TTL_SECONDS} (0: the token does not expire)"
            )
        if len(request.label) > 200:
            raise InvalidArgument("label", "at most 200 characters")
        now = self.clock.now()
        expires = now + timedelta(seconds=request.ttl_seconds) if request.ttl_seconds else None
        return TokenRecord(
            new_token_id(), kind, business, service, request.label, now, expires, None
        )

    async def CreateToken(
        self, request: pb.CreateTokenRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateTokenResponse:
        record = self._record(request)
        secret = new_secret()
        async with self.engine.begin() as conn:
            await store.token_insert(conn, record, secret_hash(secret))
        log.info(
            "token created",
            token_id=record.token_id,
            kind=record.kind.value,
            business=record.business,
            service=record.service,
        )
        return pb.CreateTokenResponse(token=token_to_proto(record), secret=secret)

    async def ListTokens(
        self, request: pb.ListTokensRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListTokensResponse:
        async with self.engine.connect() as conn:
            records = await store.token_list(
                conn, business=request.business, include_revoked=request.include_revoked
            )
        return pb.ListTokensResponse(tokens=[token_to_proto(r) for r in records])

    async def RevokeToken(
        self, request: pb.RevokeTokenRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RevokeTokenResponse:
        if not request.token_id:
            raise InvalidArgument("token_id", "required")
        async with self.engine.begin() as conn:
            record = await store.token_revoke_if_live(conn, request.token_id, self.clock.now())
        if record is None:
            raise NotFound(f"no token {request.token_id!r}")
        self.verifier.forget(record.token_id)
        log.info("token revoked", token_id=record.token_id)
        return pb.RevokeTokenResponse(token=token_to_proto(record))


def add_to_server(servicer: TokenServicer, server: grpc.aio.Server) -> None:
    auth_pb2_grpc.add_TokenServiceServicer_to_server(servicer, server)
