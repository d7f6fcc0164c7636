"""API tokens as the platform sees them: who a bearer is, and how a secret is made and kept.

A secret is 32 random bytes (:func:`secrets.token_urlsafe`) behind the ``dispo_`` prefix. It
is shown once and only its SHA-256 is stored: for a secret of 256 random bits a plain hash
is as good as a slow one (nothing to guess from a dictionary), and it lets every server
look a token up by its hash in one indexed read (ADR-0040).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

PREFIX = "dispo_"


class Kind(StrEnum):
    """What a token may do (docs/security.md)."""

    # A business line's token: its own tasks only.
    BUSINESS = "business"
    # An operator's token: every RPC.
    ADMIN = "admin"
    # A service's credential for its calls to other services.
    SERVICE = "service"
    # A worker process's token: it serves the runs of its queues, nothing else (ADR-0100).
    WORKER = "worker"


def new_secret() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def new_token_id() -> str:
    return "tok_" + secrets.token_hex(8)


def secret_hash(secret: str) -> str:
    """What the token store keeps of ``secret``: its SHA-256, in hex."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    """The bearer of a valid token: what a server knows about the caller of an RPC."""

    token_id: str
    kind: Kind
    business: str = ""
    service: str = ""
    expires_at: datetime | None = None
    # The queues a worker token serves (empty for the other kinds).
    queues: tuple[str, ...] = ()
    # The highest Submit priority a business token may ask for (1: any; ADR-0109).
    max_priority: int = 1

    def describe(self) -> str:
        match self.kind:
            case Kind.BUSINESS:
                return f"a token of business {self.business!r}"
            case Kind.SERVICE:
                return f"the service token of {self.service!r}"
            case Kind.WORKER:
                return f"a worker token of queues {', '.join(self.queues)}"
            case _:
                return "an admin token"


@dataclass(frozen=True)
class TokenRecord:
    """A row of the token store, without its hash."""

    token_id: str
    kind: Kind
    business: str
    service: str
    label: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    queues: tuple[str, ...] = ()
    max_priority: int = 1

    def principal(self) -> Principal:
        return Principal(
            self.token_id,
            self.kind,
            self.business,
            self.service,
            self.expires_at,
            self.queues,
            self.max_priority,
        )

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now
