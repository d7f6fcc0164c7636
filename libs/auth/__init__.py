"""Who calls: the check every gRPC server makes of a caller's token, and the channels that
send one (docs/security.md, ADR-0040). The tokens themselves, their tables, the token service
and the signing secrets are the auth context's (:mod:`dispo.auth`); this is what every
service runs, so it is the kernel's (ADR-0087).

- :mod:`.tokens`: the domain (kinds, principal, secret and hash);
- :mod:`.lookup`: the one read every server makes of ``auth.tokens`` (a hash to its token);
- :mod:`.verifier`: a secret to its principal, through a short cache;
- :mod:`.rules`: which token may call which RPC, one rule per RPC;
- :mod:`.server`: the check :func:`dispo.libs.grpcserver.create_server` applies to every call;
- :mod:`.scope`: the caller inside a servicer, and what a business token may see;
- :mod:`.channel`: every client channel, carrying ``authorization: Bearer <token>``;
- :mod:`.caller`: the token a command-line caller sends.

This package's names are the ones a caller and a servicer need; they import neither the
database layer nor the bus, so a ``dispo`` command does not load them. What reads the token
store is imported from its module (``lookup``, ``verifier.TokenVerifier``).
"""

from __future__ import annotations

from dispo.libs.auth.caller import TOKEN_ENV, caller_token
from dispo.libs.auth.channel import bearer, open_channel, open_sync_channel
from dispo.libs.auth.rules import RULES, Rule
from dispo.libs.auth.scope import (
    business_filter,
    business_scope,
    caller,
    require_priority,
    require_visible,
)
from dispo.libs.auth.server import Authorizer
from dispo.libs.auth.tokens import Kind, Principal

__all__ = [
    "RULES",
    "TOKEN_ENV",
    "Authorizer",
    "Kind",
    "Principal",
    "Rule",
    "bearer",
    "business_filter",
    "business_scope",
    "require_priority",
    "caller",
    "caller_token",
    "open_channel",
    "open_sync_channel",
    "require_visible",
]
