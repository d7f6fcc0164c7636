"""The credentials ``dispo up`` makes on a stack's first start, and their handover.

In the data folder, owner-only (0600, in a 0700 folder):

- ``admin.token``: the first admin token, which the CLI reads by default;
- ``auth/credentials.json``: that token and one service token per process of the stack,
  each handed to its process as ``DISPO_SERVICE_TOKEN``, and the signing key of webhook
  callbacks (:mod:`.signing`), handed to the gateway and the reconciler only as
  ``DISPO_SIGNING_KEY``;
- ``auth/bootstrap.json``: their ids, kinds and hashes only. The stack stores them before it
  starts the services, with the gateway's database credentials (:func:`prepare_token_store`),
  and so does the gateway on start (``DISPO_GATEWAY_AUTH_BOOTSTRAP_FILE``): each inserts a
  token unless one with its id exists, so a token revoked once stays revoked across restarts.

The files are made once; later starts reuse them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from dispo.auth import store
from dispo.auth.signing import new_key
from dispo.libs.auth.caller import ADMIN_TOKEN_FILE
from dispo.libs.auth.tokens import Kind, TokenRecord, new_secret, new_token_id, secret_hash
from dispo.libs.clock import Clock
from dispo.libs.db import create_engine, migrate
from dispo.libs.db.driver import Database
from dispo.libs.logging import get_logger
from dispo.libs.private_files import write_private

log = get_logger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"
SCHEMA = "auth"
CREDENTIALS_FILE = Path("auth") / "credentials.json"
BOOTSTRAP_FILE = Path("auth") / "bootstrap.json"


@dataclass(frozen=True)
class Credential:
    token_id: str
    secret: str
    kind: Kind
    service: str = ""


@dataclass(frozen=True)
class StackCredentials:
    admin: Credential
    services: dict[str, Credential]
    admin_token_file: Path
    bootstrap_file: Path
    # DISPO_SIGNING_KEY of the gateway and the reconciler.
    signing_key: str = ""

    def service_token(self, service: str) -> str:
        return self.services[service].secret


def _credential(data: dict[str, str]) -> Credential:
    return Credential(data["token_id"], data["secret"], Kind(data["kind"]), data.get("service", ""))


def stack_credentials(data_dir: Path, services: list[str]) -> StackCredentials:
    """The stack's credentials: read from ``data_dir``, made (and written) where missing.

    ``services`` names every process that calls another; one made later for a process not
    named before is added, the others are kept."""
    path = data_dir / CREDENTIALS_FILE
    known = json.loads(path.read_text()) if path.exists() else {}
    admin_data = known.get("admin") or {
        "token_id": new_token_id(),
        "secret": new_secret(),
        "kind": Kind.ADMIN.value,
    }
    service_data: dict[str, dict[str, str]] = dict(known.get("services", {}))
    for name in services:
        if name not in service_data:
            service_data[name] = {
                "token_id": new_token_id(),
                "secret": new_secret(),
                "kind": Kind.SERVICE.value,
                "service": name,
            }
    signing_key = known.get("signing_key") or new_key()  # a folder from before it: made now
    kept = {"admin": admin_data, "services": service_data, "signing_key": signing_key}
    admin = _credential(admin_data)
    creds = {name: _credential(data) for name, data in service_data.items()}
    if kept != known:  # something was made: both files are written again
        write_private(path, json.dumps(kept, indent=2))
        entries = [admin, *creds.values()]
        write_private(
            data_dir / BOOTSTRAP_FILE,
            json.dumps(
                [
                    {
                        "token_id": c.token_id,
                        "kind": c.kind.value,
                        "service": c.service,
                        "secret_sha256": secret_hash(c.secret),
                    }
                    for c in entries
                ],
                indent=2,
            ),
        )
    admin_file = data_dir / ADMIN_TOKEN_FILE
    if not admin_file.exists() or admin_file.read_text().strip() != admin.secret:
        write_private(admin_file, admin.secret + "\n")
    return StackCredentials(admin, creds, admin_file, data_dir / BOOTSTRAP_FILE, signing_key)


# A token stored by value: (token_id, kind, service, the SHA-256 of its secret).
StoredToken = tuple[str, Kind, str, str]


async def insert_tokens(
    db: Database, tokens: Iterable[StoredToken], label: str, clock: Clock
) -> int:
    """Insert each of ``tokens`` unless one with its id exists (a token revoked once stays
    revoked); how many were inserted."""
    now = clock.now()
    records = [
        (TokenRecord(token_id, kind, "", service, label, now, None, None), hashed)
        for token_id, kind, service, hashed in tokens
    ]
    async with db.connection() as conn:  # one statement: atomic on its own
        return len(await store.tokens_insert_if_absent(conn, records))


async def apply_bootstrap(db: Database, path: Path, clock: Clock) -> int:
    """Insert the tokens ``path`` lists unless their ids exist; how many were inserted."""
    entries = json.loads(path.read_text())
    tokens = [
        (e["token_id"], Kind(e["kind"]), e.get("service", ""), e["secret_sha256"]) for e in entries
    ]
    inserted = await insert_tokens(db, tokens, "made by dispo up", clock)
    if inserted:
        log.info("bootstrap tokens stored", inserted=inserted, file=str(path))
    return inserted


def read_token_file(path: Path) -> str:
    """The token kept in ``path`` (an admin token file, a service token file)."""
    return path.read_text().strip()


@asynccontextmanager
async def token_store(database_url: str) -> AsyncIterator[Database]:
    """The driver port on the token store, its migrations applied, for the length of the
    block."""
    engine = create_engine(database_url, SCHEMA, pool_size=1)
    try:
        await migrate(engine, SCHEMA, MIGRATIONS)
    finally:
        await engine.dispose()
    db = await Database.open(database_url, SCHEMA, size=1)
    try:
        yield db
    finally:
        await db.close()


async def prepare_token_store(database_url: str, bootstrap_file: Path, clock: Clock) -> None:
    """Create the token store (its migrations) and store the stack's tokens, as the gateway
    does on start: a stack without a gateway (``dispo up --services pool``) checks tokens too."""
    async with token_store(database_url) as db:
        await apply_bootstrap(db, bootstrap_file, clock)
