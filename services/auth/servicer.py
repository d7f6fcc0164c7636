"""dispo.auth.v1.TokenService: create, list and revoke API tokens, and make and rotate the
businesses' webhook signing secrets (:mod:`.signing`). The gateway serves it; admin tokens
only (:mod:`.rules`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import grpc
from dispo.auth import store
from dispo.auth.signing import (
    SigningKey,
    SigningSecretRecord,
    new_salt,
    new_secret_id,
)
from dispo.libs.api.auth.v1 import auth_pb2 as pb
from dispo.libs.api.auth.v1 import auth_pb2_grpc
from dispo.libs.auth.tokens import Kind, TokenRecord, new_secret, new_token_id, secret_hash
from dispo.libs.auth.verifier import TokenVerifier
from dispo.libs.catalogue import QUEUE_PATTERN
from dispo.libs.clock import Clock
from dispo.libs.contracts.tasks import HIGHEST_PRIORITY, LOWEST_PRIORITY
from dispo.libs.db.driver import Conn, Database
from dispo.libs.errors import FailedPrecondition, InvalidArgument, NotFound
from dispo.libs.logging import get_logger
from dispo.libs.timestamps import to_timestamp
from dispo.libs.validation import business_name, identifier

log = get_logger(__name__)

SERVICE_NAME = "dispo.auth.v1.TokenService"
# A service token's service (a business token's business follows the one business rule,
# dispo.libs.validation.business_name).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# Ten years: longer is "does not expire", which is ttl_seconds 0.
MAX_TTL_SECONDS = 10 * 365 * 86400
_KINDS = {
    pb.TOKEN_KIND_BUSINESS: Kind.BUSINESS,
    pb.TOKEN_KIND_ADMIN: Kind.ADMIN,
    pb.TOKEN_KIND_SERVICE: Kind.SERVICE,
    pb.TOKEN_KIND_WORKER: Kind.WORKER,
}
_KIND_VALUES = {kind: value for value, kind in _KINDS.items()}
# A worker token serves at most this many queues.
MAX_QUEUES = 100
# How long a previous signing secret stays valid when a rotation is not finished first.
DEFAULT_GRACE_SECONDS = 86400
MAX_GRACE_SECONDS = 30 * 86400


def token_to_proto(record: TokenRecord) -> pb.Token:
    return pb.Token(
        token_id=record.token_id,
        kind=_KIND_VALUES[record.kind],
        business=record.business,
        service=record.service,
        label=record.label,
        created_at=to_timestamp(record.created_at),
        expires_at=to_timestamp(record.expires_at),
        revoked_at=to_timestamp(record.revoked_at),
        queues=record.queues,
        max_priority=record.max_priority if record.kind is Kind.BUSINESS else 0,
    )


def worker_queues(requested: Sequence[str]) -> tuple[str, ...]:
    """A worker token's queues: 1 to :data:`MAX_QUEUES` catalogue queue names, each once,
    sorted (INVALID_ARGUMENT naming the field otherwise)."""
    if not requested:
        raise InvalidArgument("queues", "a worker token serves at least one queue")
    if len(requested) > MAX_QUEUES:
        raise InvalidArgument("queues", f"at most {MAX_QUEUES} queues")
    for i, queue in enumerate(requested):
        if not QUEUE_PATTERN.fullmatch(queue):
            raise InvalidArgument(
                f"queues[{i}]",
                "a queue name: a letter, then letters, digits, '_' or '-', at most 63",
            )
    return tuple(sorted(set(requested)))


def signing_secret_to_proto(record: SigningSecretRecord) -> pb.SigningSecret:
    return pb.SigningSecret(
        secret_id=record.secret_id,
        business=record.business,
        created_at=to_timestamp(record.created_at),
        retires_at=to_timestamp(record.retires_at),
    )


def _when(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


class TokenServicer(auth_pb2_grpc.TokenServiceServicer):
    def __init__(
        self,
        db: Database,
        clock: Clock,
        verifier: TokenVerifier,
        signing_key: SigningKey | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self.verifier = verifier
        # None: no DISPO_SIGNING_KEY, so no signing secret can be made here.
        self.signing_key = signing_key

    def _new_signing_secret(
        self, key: SigningKey, business: str
    ) -> tuple[SigningSecretRecord, str]:
        record = SigningSecretRecord(
            new_secret_id(), business, new_salt(), key.key_id, self.clock.now(), None
        )
        return record, key.derive(business, record.secret_id, record.salt)

    async def _first_signing_secret(
        self, conn: Conn, business: str
    ) -> tuple[SigningSecretRecord, str] | None:
        """The business's first signing secret, made with its token; None if it has one
        (or this gateway has no signing key)."""
        if self.signing_key is None:
            log.warning("no signing secret made: DISPO_SIGNING_KEY is not set", business=business)
            return None
        record, secret = self._new_signing_secret(self.signing_key, business)
        if not await store.signing_secret_insert_if_none(conn, record):
            return None
        return record, secret

    def _record(self, request: pb.CreateTokenRequest) -> TokenRecord:
        kind = _KINDS.get(request.kind)
        if kind is None:
            raise InvalidArgument(
                "kind",
                "TOKEN_KIND_BUSINESS, TOKEN_KIND_ADMIN, TOKEN_KIND_SERVICE or TOKEN_KIND_WORKER",
            )
        business = service = ""
        if kind is Kind.BUSINESS:
            business = business_name(request.business)
        elif request.business:
            raise InvalidArgument("business", "only a business token names a business")
        if kind is Kind.SERVICE:
            service = identifier(request.service, "service", NAME_PATTERN)
        elif request.service:
            raise InvalidArgument("service", "only a service token names a service")
        queues: tuple[str, ...] = ()
        if kind is Kind.WORKER:
            queues = worker_queues(request.queues)
        elif request.queues:
            raise InvalidArgument("queues", "only a worker token names queues")
        max_priority = 1
        if request.max_priority:
            if kind is not Kind.BUSINESS:
                raise InvalidArgument("max_priority", "only a business token has a max_priority")
            if not HIGHEST_PRIORITY <= request.max_priority <= LOWEST_PRIORITY:
                raise InvalidArgument(
                    "max_priority", "1 (any priority) to 5 (the lowest only), or 0 for 1"
                )
            max_priority = request.max_priority
        if request.ttl_seconds > MAX_TTL_SECONDS:
            raise InvalidArgument(
                "ttl_seconds", f"at most {MAX_TTL_SECONDS} (0: the token does not expire)"
            )
        if len(request.label) > 200:
            raise InvalidArgument("label", "at most 200 characters")
        now = self.clock.now()
        expires = now + timedelta(seconds=request.ttl_seconds) if request.ttl_seconds else None
        return TokenRecord(
            new_token_id(),
            kind,
            business,
            service,
            request.label,
            now,
            expires,
            None,
            queues,
            max_priority,
        )

    async def CreateToken(
        self, request: pb.CreateTokenRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateTokenResponse:
        record = self._record(request)
        secret = new_secret()
        signing = None
        async with self.db.transaction() as conn:
            await store.token_insert(conn, record, secret_hash(secret))
            if record.kind is Kind.BUSINESS:
                signing = await self._first_signing_secret(conn, record.business)
        self.verifier.forget_refused(secret)
        log.info(
            "token created",
            token_id=record.token_id,
            kind=record.kind.value,
            business=record.business,
            service=record.service,
            queues=list(record.queues),
            max_priority=record.max_priority,
            signing_secret=signing[0].secret_id if signing else "",
        )
        reply = pb.CreateTokenResponse(token=token_to_proto(record), secret=secret)
        if signing is not None:
            reply.signing_secret = signing[1]
            reply.signing_secret_info.CopyFrom(signing_secret_to_proto(signing[0]))
        return reply

    async def ListTokens(
        self, request: pb.ListTokensRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListTokensResponse:
        async with self.db.connection() as conn:
            records = await store.token_list(
                conn, business=request.business, include_revoked=request.include_revoked
            )
        return pb.ListTokensResponse(tokens=[token_to_proto(r) for r in records])

    async def RevokeToken(
        self, request: pb.RevokeTokenRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RevokeTokenResponse:
        if not request.token_id:
            raise InvalidArgument("token_id", "required")
        async with self.db.transaction() as conn:
            record = await store.token_revoke_if_live(conn, request.token_id, self.clock.now())
        if record is None:
            raise NotFound(f"no token {request.token_id!r}")
        self.verifier.forget(record.token_id)
        log.info("token revoked", token_id=record.token_id)
        return pb.RevokeTokenResponse(token=token_to_proto(record))

    async def RotateSigningSecret(
        self, request: pb.RotateSigningSecretRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RotateSigningSecretResponse:
        business = business_name(request.business)
        if not 0 <= request.grace_seconds <= MAX_GRACE_SECONDS:
            raise InvalidArgument(
                "grace_seconds", f"0 to {MAX_GRACE_SECONDS} (0: {DEFAULT_GRACE_SECONDS})"
            )
        if self.signing_key is None:
            raise FailedPrecondition(
                "this gateway has no signing key (DISPO_SIGNING_KEY): it cannot make signing"
                " secrets"
            )
        grace = timedelta(seconds=request.grace_seconds or DEFAULT_GRACE_SECONDS)
        new, secret = self._new_signing_secret(self.signing_key, business)
        async with self.db.transaction() as conn:
            valid = await store.signing_secrets_valid(conn, [business], new.created_at, lock=True)
            retiring = [r.retires_at for r in valid if r.retires_at is not None]
            if retiring:
                raise FailedPrecondition(
                    f"business {business!r} is in a rotation: its previous signing secret is"
                    f" valid until {_when(retiring[0])}; finish it first"
                    f" (`dispo tokens finish-rotation --business {business}`)"
                )
            previous = None
            if valid:  # its current secret, alone: it stays valid for the grace period
                previous = replace(valid[0], retires_at=new.created_at + grace)
                await store.signing_secret_retire_current_if(
                    conn, previous.secret_id, new.created_at + grace
                )
            if not await store.signing_secret_insert_if_none(conn, new):
                raise FailedPrecondition(
                    f"business {business!r}'s signing secret was made by another call at the"
                    " same moment; rotate it if you need a new one"
                )
        log.info(
            "signing secret rotated",
            business=business,
            secret_id=new.secret_id,
            previous=previous.secret_id if previous else "",
        )
        reply = pb.RotateSigningSecretResponse(current=signing_secret_to_proto(new), secret=secret)
        if previous is not None:
            reply.previous.CopyFrom(signing_secret_to_proto(previous))
        return reply

    async def FinishSigningSecretRotation(
        self,
        request: pb.FinishSigningSecretRotationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.FinishSigningSecretRotationResponse:
        business = business_name(request.business)
        now = self.clock.now()
        async with self.db.transaction() as conn:
            retired = await store.signing_secrets_retire_previous(conn, business, now)
            valid = await store.signing_secrets_valid(conn, [business], now)
        if not retired:
            raise FailedPrecondition(f"business {business!r} has no rotation in progress")
        log.info("signing secret rotation finished", business=business)
        return pb.FinishSigningSecretRotationResponse(current=signing_secret_to_proto(valid[0]))

    async def ListSigningSecrets(
        self, request: pb.ListSigningSecretsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListSigningSecretsResponse:
        async with self.db.connection() as conn:
            records = await store.signing_secrets_valid(
                conn, [request.business] if request.business else None, self.clock.now()
            )
        return pb.ListSigningSecretsResponse(secrets=[signing_secret_to_proto(r) for r in records])


def add_to_server(servicer: TokenServicer, server: grpc.aio.Server) -> None:
    auth_pb2_grpc.add_TokenServiceServicer_to_server(servicer, server)
