"""Database passwords: made at random, kept in one owner-only file, sent as SCRAM verifiers.

``dispo up`` keeps the embedded server's superuser password and every service role's in
``postgres-passwords.json`` in the data folder (mode 0600, a JSON object name -> password);
a name missing from it gets a new password the first time it is asked for. A password set
on a role travels as its SCRAM-SHA-256 verifier, never as the password itself, so no
statement, log line or error message carries it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from pathlib import Path

from dispo.libs.private_files import kept_secrets

PASSWORDS_FILE = "postgres-passwords.json"
# PostgreSQL's own default for the verifiers it makes.
SCRAM_ITERATIONS = 4096


def new_password() -> str:
    return secrets.token_hex(24)


def kept_passwords(path: Path, names: Iterable[str]) -> dict[str, str]:
    """Every password the file at ``path`` keeps, with one made for each of ``names`` it
    lacks (the file is created, or rewritten whole, with mode 0600)."""
    return kept_secrets(path, names, new_password)


def scram_verifier(password: str, *, salt: bytes | None = None) -> str:
    """``password`` as PostgreSQL stores it (``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``),
    what ``CREATE ROLE … PASSWORD`` may be given instead of the password (RFC 5802, 7677).
    For a non-ASCII password PostgreSQL would first normalise it (SASLprep): refused here."""
    if not password.isascii():
        raise ValueError("database passwords must be ASCII")
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, SCRAM_ITERATIONS)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    return f"SCRAM-SHA-256${SCRAM_ITERATIONS}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"
