"""The credentials of the compose stack (``compose.yaml``): made once into an env file on the
operator's machine, applied by the stack's one-shot init container.

    python -m dispo.tools.stack.compose_env generate > .env    # once, before `docker compose up`
    python -m dispo.tools.stack.compose_env init               # the dispo-init container does it

``generate`` prints every variable compose.yaml interpolates, each a fresh random value: the
PostgreSQL superuser's password, one database password, bus password and service token per
service, the bus's ``admin`` password, an admin API token and the webhook signing key. The
file holds no default: without it compose refuses to start and names what is missing.

``init`` runs before the services, with the URLs and tokens compose hands it: the database
bootstrap (each service's role, with its password, owning its schema; ADR-0036), the token
store with the hashes of the admin and service tokens (ADR-0040), and nats-server's
``authorization`` block, each password read from the server's own environment (ADR-0037).
It is idempotent: a token stored once, revoked or not, is never stored again.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import sys
from pathlib import Path

from dispo.auth.bootstrap import insert_tokens, token_store
from dispo.auth.signing import new_key
from dispo.libs.auth.tokens import Kind, new_secret, secret_hash
from dispo.libs.clock import SystemClock
from dispo.libs.db.roles import SERVICES, bootstrap, login_from_url
from dispo.libs.settings import CommonSettings, server_settings
from dispo.tools.stack.nats_auth import USERS, Variable, server_config

# Where ``init`` writes nats-server's authorization block (a volume the bus nodes mount).
NATS_AUTH_FILE_ENV = "NATS_AUTH_FILE"
ADMIN_TOKEN = "ADMIN_TOKEN"
SIGNING_KEY = "SIGNING_KEY"
POSTGRES_PASSWORD = "POSTGRES_PASSWORD"


def db_password(service: str) -> str:
    return f"DB_PASSWORD_{service.upper()}"


def nats_password(user: str) -> str:
    """The variable of ``user``'s bus password: the one the ``authorization`` block reads."""
    return f"NATS_PASSWORD_{user.upper()}"


def service_token(service: str) -> str:
    return f"SERVICE_TOKEN_{service.upper()}"


def generate() -> dict[str, str]:
    """Every variable compose.yaml interpolates, each a fresh random value."""
    values = {POSTGRES_PASSWORD: secrets.token_hex(24)}
    values |= {db_password(s): secrets.token_hex(24) for s in SERVICES}
    values |= {nats_password(u): secrets.token_hex(24) for u in USERS}
    values |= {service_token(s): new_secret() for s in SERVICES}
    values[ADMIN_TOKEN] = new_secret()
    values[SIGNING_KEY] = new_key()
    return values


def token_id(secret: str) -> str:
    """A stable id for a token given by value: the same on every run of ``init``."""
    return "tok_" + hashlib.sha256(b"compose token id\0" + secret.encode()).hexdigest()[:16]


async def store_tokens(gateway_url: str, environ: dict[str, str]) -> int:
    """The token store (its migrations) with the admin token and each service's token of
    ``environ``, as the gateway's role; how many were stored now."""
    given = [(Kind.ADMIN, "", environ[ADMIN_TOKEN])]
    given += [(Kind.SERVICE, s, environ[service_token(s)]) for s in SERVICES]
    tokens = [
        (token_id(secret), kind, service, secret_hash(secret)) for kind, service, secret in given
    ]
    async with token_store(gateway_url) as db:
        return await insert_tokens(db, tokens, "made by compose", SystemClock())


def nats_authorization() -> str:
    """nats-server's ``authorization`` block, each password ``$NATS_PASSWORD_<USER>``."""
    return server_config({user: Variable(nats_password(user)) for user in USERS})


async def init(environ: dict[str, str]) -> None:
    urls = {s: url for s in SERVICES if (url := server_settings(s).database_url)}
    missing = sorted(set(SERVICES) - set(urls))
    if missing:
        raise SystemExit(f"init: no DISPO_<SERVICE>_DATABASE_URL for {', '.join(missing)}")
    await bootstrap(CommonSettings().database_url, {s: login_from_url(u) for s, u in urls.items()})
    stored = await store_tokens(urls["gateway"], environ)
    target = Path(environ[NATS_AUTH_FILE_ENV])
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(nats_authorization())
    print(f"init: roles and schemas of {', '.join(SERVICES)}; {stored} token(s) stored; {target}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args == ["generate"]:
        print("# Dispo's compose stack: secrets made by `python -m dispo.tools.stack.compose_env")
        print("# generate`. Keep this file private (chmod 600) and out of version control.")
        for name, value in generate().items():
            print(f"{name}={value}")
    elif args == ["init"]:
        asyncio.run(init(dict(os.environ)))
    else:
        raise SystemExit("usage: python -m dispo.tools.stack.compose_env generate|init")


if __name__ == "__main__":
    main()
