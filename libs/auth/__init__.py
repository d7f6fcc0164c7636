"""Who calls: API tokens, the one check every gRPC server makes, and the channels that send
them (docs/security.md, ADR-0040).

- :mod:`.tokens`: the domain (kinds, principal, secret and hash);
- :mod:`.store`: ``auth.tokens``, written by the gateway, read by every service;
- :mod:`.verifier`: a secret to its principal, through a short cache;
- :mod:`.rules`: which token may call which RPC, one rule per RPC;
- :mod:`.server`: the check :func:`dispo.libs.grpcserver.create_server` applies to every call;
- :mod:`.scope`: the caller inside a servicer, and what a business token may see;
- :mod:`.channel`: every client channel, carrying ``authorization: Bearer <token>``;
- :mod:`.servicer`: ``dispo.auth.v1.TokenService`` (create, list, revoke);
- :mod:`.bootstrap`: the credentials ``dispo up`` makes and hands over.
"""

from __future__ import annotations

import os
from pathlib import Path

from dispo.libs.auth.bootstrap import ADMIN_TOKEN_FILE, MIGRATIONS, SCHEMA
from dispo.libs.auth.channel import open_channel, open_sync_channel
from dispo.libs.auth.rules import RULES, Rule
from dispo.libs.auth.scope import business_filter, business_scope, caller, require_visible
from dispo.libs.auth.server import Authorizer
from dispo.libs.auth.tokens import Kind, Principal
from dispo.libs.auth.verifier import TokenVerifier

TOKEN_ENV = "DISPO_TOKEN"


def caller_token(explicit: str | None = None, data_dir: Path | None = None) -> str:
    """The token a command-line caller sends: ``explicit`` (``--token``), else
    ``DISPO_TOKEN``, else the admin token ``dispo up`` wrote in ``data_dir``; empty if none."""
    if explicit:
        return explicit.strip()
    if os.environ.get(TOKEN_ENV, "").strip():
        return os.environ[TOKEN_ENV].strip()
    if data_dir is not None and (data_dir / ADMIN_TOKEN_FILE).exists():
        return (data_dir / ADMIN_TOKEN_FILE).read_text().strip()
    return ""


__all__ = [
    "MIGRATIONS",
    "RULES",
    "SCHEMA",
    "Authorizer",
    "Kind",
    "Principal",
    "Rule",
    "TokenVerifier",
    "business_filter",
    "business_scope",
    "caller",
    "caller_token",
    "open_channel",
    "open_sync_channel",
    "require_visible",
]
