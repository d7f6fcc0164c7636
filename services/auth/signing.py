"""Webhook signing secrets: one per business, rotatable, two valid during a rotation
(docs/security.md, ADR-0043).

A signing secret is never stored, not even encrypted. The store keeps, per secret, a random
salt; the secret is derived from it, the business and the secret's id with HMAC-SHA256 under
the **signing key** (``DISPO_SIGNING_KEY``), which only the gateway (it makes secrets) and
the reconciler (it signs callbacks) hold. A read of the database alone gives salts, from
which nothing can be signed. Each row names the key it was made under (:attr:`SigningKey.key_id`)
so that a process holding another key says so instead of signing with a wrong secret.

The signature of a callback is ``sha256=<hex>`` of HMAC-SHA256(secret, ``"<timestamp>." +
body``); the header carries one per valid secret, newest first, comma-separated.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

PREFIX = "whsec_"
SIGNATURE_HEADER = "X-Dispo-Signature"
TIMESTAMP_HEADER = "X-Dispo-Timestamp"
KEY_ENV = "DISPO_SIGNING_KEY"
# The services that hold the signing key: the gateway makes secrets, the reconciler signs.
SIGNING_KEY_HOLDERS = ("gateway", "reconciler")
# The signing key: 32 random bytes, written as 64 hex digits.
KEY_BYTES = 32
_DOMAIN = b"dispo webhook signing secret v1"


class SigningKeyError(ValueError):
    """The signing key is missing or malformed."""


@dataclass(frozen=True)
class SigningKey:
    raw: bytes

    @classmethod
    def parse(cls, text: str) -> SigningKey:
        """The key from its 64 hex digits (``DISPO_SIGNING_KEY``)."""
        try:
            raw = bytes.fromhex(text.strip())
        except ValueError:
            raw = b""
        if len(raw) != KEY_BYTES:
            raise SigningKeyError(
                f"{KEY_ENV} must be {KEY_BYTES * 2} hex digits (make one with"
                " `python -c 'import secrets; print(secrets.token_hex(32))'`)"
            )
        return cls(raw)

    @property
    def key_id(self) -> str:
        """A fingerprint of the key, kept beside each secret made under it."""
        return hashlib.sha256(b"key id\0" + self.raw).hexdigest()[:16]

    def derive(self, business: str, secret_id: str, salt: bytes) -> str:
        """The signing secret of the row (``business``, ``secret_id``, ``salt``)."""
        message = b"\0".join([_DOMAIN, business.encode(), secret_id.encode(), salt])
        return PREFIX + hmac.new(self.raw, message, hashlib.sha256).hexdigest()


def configured_key(text: str) -> SigningKey | None:
    """The key ``DISPO_SIGNING_KEY`` holds (None: not set; SigningKeyError if malformed)."""
    return SigningKey.parse(text) if text.strip() else None


def new_key() -> str:
    """A new signing key, as ``DISPO_SIGNING_KEY`` takes it."""
    return secrets.token_hex(KEY_BYTES)


def new_secret_id() -> str:
    return "whs_" + secrets.token_hex(8)


def new_salt() -> bytes:
    return secrets.token_bytes(32)


@dataclass(frozen=True)
class SigningSecretRecord:
    """A row of ``auth.signing_secrets``: the business's current secret
    (``retires_at`` None) or a previous one, valid until ``retires_at``."""

    secret_id: str
    business: str
    salt: bytes
    key_id: str
    created_at: datetime
    retires_at: datetime | None

    def valid(self, now: datetime) -> bool:
        return self.retires_at is None or self.retires_at > now


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256(secret, "<timestamp>." + body)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def signature_header(secrets_: Sequence[str], timestamp: str, body: bytes) -> str:
    """The ``X-Dispo-Signature`` value: one signature per secret, in the order given (newest
    first), comma-separated, as several headers of one name are joined (RFC 9110 §5.3)."""
    return ", ".join(signature(s, timestamp, body) for s in secrets_)
