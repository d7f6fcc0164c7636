"""One PostgreSQL role per service, owning its schema and nothing else: the bootstrap.

The brief's rule "no service reads or writes another service's tables" is the database's:
each service logs in as its own role (``dispo_<service>``), which owns its schema (and so
may migrate it) and has no privilege on any other. :data:`SCHEMAS` declares every schema,
its owner and the services that may read it; :func:`bootstrap` makes the database agree,
as a superuser (or a role with CREATEROLE that may create schemas), and is idempotent:
``dispo up`` runs it on every start, the test fixtures once for their template.

    python -m dispo.libs.db.roles     # bootstrap an external database (docs/security.md)
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass

import asyncpg
from dispo.libs.db.passwords import scram_verifier
from dispo.libs.settings import DEFAULT_PORTS, CommonSettings, server_settings
from sqlalchemy.engine import URL, make_url

# The services with a schema of their own (the console has none).
SERVICES = tuple(DEFAULT_PORTS)


@dataclass(frozen=True)
class Schema:
    """A schema, the service whose role owns it (creates, writes and migrates its tables),
    and the services whose roles may only read (SELECT) its tables."""

    name: str
    owner: str
    readers: tuple[str, ...] = ()


# Every schema and who may touch it. A schema shared for reading is one more line.
SCHEMAS: tuple[Schema, ...] = (
    *(Schema(service, service) for service in SERVICES),
    # The API tokens of callers and services: the gateway issues and revokes them, every
    # other service only looks its callers up.
    Schema("auth", "gateway", readers=tuple(s for s in SERVICES if s != "gateway")),
)


@dataclass(frozen=True)
class Login:
    role: str
    password: str


def role_name(service: str) -> str:
    return f"dispo_{service}"


def login_url(url: str, login: Login) -> str:
    """``url`` (any role's, the same server and database) logging in as ``login``."""
    return (
        make_url(url)
        .set(username=login.role, password=login.password)
        .render_as_string(hide_password=False)
    )


def login_from_url(url: str) -> Login:
    parsed = make_url(url)
    if not parsed.username or not parsed.password:
        raise ValueError(f"{parsed!r} names no role and password")
    return Login(parsed.username, parsed.password)


def without_password(url: str) -> str:
    """``url`` with its password left out (for state files and messages): the one in its
    user part and a ``password`` query parameter alike. (SQLAlchemy's ``URL.set(password=None)``
    means "leave it as it is", so the URL is made again from the parts it keeps.)"""
    parsed = make_url(url)
    query = {k: v for k, v in parsed.query.items() if k.lower() != "password"}
    return URL.create(
        parsed.drivername,
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query=query,
    ).render_as_string(hide_password=False)


def asyncpg_url(url: str) -> str:
    """``url`` as asyncpg takes it (``postgresql://``, without SQLAlchemy's driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def _ident(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"bad role or schema name {name!r}")
    return f'"{name}"'


async def ensure_roles(conn: asyncpg.Connection, logins: Mapping[str, Login]) -> None:
    """Each login a role that may log in with its password and nothing more (not a
    superuser, may create no role or database); an existing role is brought to that."""
    for login in logins.values():
        role = _ident(login.role)
        await conn.execute(
            "DO $$ BEGIN CREATE ROLE " + role + ";"
            " EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        await conn.execute(
            f"ALTER ROLE {role} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION"
            f" NOBYPASSRLS PASSWORD '{scram_verifier(login.password)}'"
        )


async def ensure_schemas(conn: asyncpg.Connection, logins: Mapping[str, Login]) -> None:
    """In ``conn``'s database: each declared schema whose owner has a login, owned by its
    role with every table in it (a schema an earlier version made as the superuser is
    handed over), and readable by its readers' roles (those with a login) alone."""
    for schema in SCHEMAS:
        if schema.owner not in logins:
            continue
        name, owner = _ident(schema.name), _ident(logins[schema.owner].role)
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('dispo.bootstrap'))")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {name}")
            await conn.execute(f"ALTER SCHEMA {name} OWNER TO {owner}")
            await conn.execute(f"REVOKE ALL ON SCHEMA {name} FROM PUBLIC")
            for (table,) in await conn.fetch(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f')"
                " AND pg_get_userbyid(c.relowner) <> $2",
                schema.name,
                logins[schema.owner].role,
            ):
                await conn.execute(f'ALTER TABLE {name}."{table}" OWNER TO {owner}')
            for reader in schema.readers:
                if reader not in logins:
                    continue
                role = _ident(logins[reader].role)
                await conn.execute(f"GRANT USAGE ON SCHEMA {name} TO {role}")
                await conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {name} TO {role}")
                await conn.execute(
                    f"ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {name}"
                    f" GRANT SELECT ON TABLES TO {role}"
                )


async def bootstrap(admin_url: str, logins: Mapping[str, Login]) -> None:
    """Roles (with these passwords), schemas and grants for the services in ``logins``
    (service -> its login), in the database ``admin_url`` names, as that URL's role."""
    conn = await asyncpg.connect(asyncpg_url(admin_url))
    try:
        await ensure_roles(conn, logins)
        await ensure_schemas(conn, logins)
    finally:
        await conn.close()


def main() -> None:
    """Bootstrap an external database: ``DISPO_DATABASE_URL`` is the administrator's URL,
    each ``DISPO_<SERVICE>_DATABASE_URL`` names the role and password that service logs in
    with (the role is created, or its password set)."""
    logins = {s: login_from_url(url) for s in SERVICES if (url := server_settings(s).database_url)}
    if not logins:
        raise SystemExit("set DISPO_<SERVICE>_DATABASE_URL for the services to bootstrap")
    admin = CommonSettings().database_url
    asyncio.run(bootstrap(admin, logins))
    for service, login in logins.items():
        print(f"{service}: role {login.role} owns schema {service}")


if __name__ == "__main__":
    main()
