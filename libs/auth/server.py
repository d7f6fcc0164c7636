"""The server side: every call of every service is admitted here before its servicer runs
(:func:`dispo.libs.grpcserver.create_server` wires it in; health and reflection stay open).

- no ``authorization: Bearer <token>`` metadata, or a token that is unknown, revoked or
  expired: UNAUTHENTICATED;
- a valid token the RPC's rule (:mod:`.rules`) does not admit, or an RPC without a rule:
  PERMISSION_DENIED;
- a token that would take a read of the token store from a caller whose reads keep failing:
  RESOURCE_EXHAUSTED (:mod:`.verifier`; the limit is per caller address, :func:`peer_address`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from dispo.libs.auth.rules import RULES, Rule
from dispo.libs.auth.tokens import Principal
from dispo.libs.errors import PermissionDenied, Unauthenticated

METADATA_KEY = "authorization"
SCHEME = "bearer"


class Verifier(Protocol):
    async def principal(self, secret: str, peer: str = "") -> Principal: ...

    def forget(self, token_id: str) -> None: ...


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The token of ``authorization: Bearer <token>``; UNAUTHENTICATED without one."""
    for key, value in metadata or ():
        if key.lower() != METADATA_KEY:
            continue
        text = value.decode() if isinstance(value, bytes) else value
        scheme, _, token = text.strip().partition(" ")
        if scheme.lower() == SCHEME and token.strip():
            return token.strip()
        raise Unauthenticated("the authorization metadata must be 'Bearer <token>'")
    raise Unauthenticated(
        "no credentials: send the metadata 'authorization: Bearer <token>'"
        " (dispo tokens create makes a token)"
    )


def peer_address(peer: str) -> str:
    """The caller's address in gRPC's peer string, without its port: ``ipv4:10.0.0.7`` of
    ``ipv4:10.0.0.7:53412``, ``ipv6:[::1]`` of ``ipv6:[::1]:53412``; other kinds (``unix:``)
    as they are. A caller's connections share its address, not their ports."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return f"{kind}:{rest.rsplit(':', 1)[0]}"
    return peer


class _Nobody:
    async def principal(self, secret: str, peer: str = "") -> Principal:
        raise Unauthenticated("this server accepts no token")

    def forget(self, token_id: str) -> None:
        return None


class Authorizer:
    def __init__(self, verifier: Verifier, rules: Mapping[str, Rule] = RULES) -> None:
        self.verifier = verifier
        self.rules = rules

    @classmethod
    def refusing(cls) -> Authorizer:
        """An authorizer that admits nobody (a server that only answers health checks)."""
        return cls(_Nobody(), {})

    async def admit(
        self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None, peer: str = ""
    ) -> Principal:
        """The caller of ``method``, by its token; ``peer``: its address (gRPC's peer string),
        which bounds how many failed reads of the token store it may cause."""
        principal = await self.verifier.principal(bearer(metadata), peer_address(peer))
        rule = self.rules.get(method)
        if rule is None:
            raise PermissionDenied(f"{method} has no access rule: it is refused to every caller")
        if not rule.admits(principal):
            raise PermissionDenied(f"{method} needs {rule.needs()}; this is {principal.describe()}")
        return principal
