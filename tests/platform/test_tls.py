"""Transport security: a TLS server answers TLS clients only, with mTLS only clients holding a
certificate of its CA, and a certificate of another CA is refused either way; `dispo up --tls`
makes and keeps its certificates and the CLI and SDK find them."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from dispo.libs.auth import open_channel
from dispo.libs.auth.server import Authorizer
from dispo.libs.db.passwords import PASSWORDS_FILE
from dispo.libs.grpcserver import create_server
from dispo.libs.private_files import write_private
from dispo.libs.process import free_port
from dispo.libs.settings import TLSSettings
from dispo.libs.tls import PLAINTEXT, ClientTLS, LocalCertificates, ServerTLS
from dispo.sdk import AsyncClient, Client, DispoError, cells
from dispo.tools.cli.lifecycle import banner
from dispo.tools.stack.certificates import local_certificates
from dispo.tools.stack.stack import Stack, StackOptions
from dispo.tools.stack.state import caller_tls
from grpc_health.v1 import health_pb2, health_pb2_grpc

HOSTS = ["127.0.0.1", "localhost"]
DISPO = str(Path(sys.executable).parent / "dispo")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> LocalCertificates:
    """A local CA and its certificates, as ``dispo up --tls`` makes them."""
    return local_certificates(tmp_path_factory.mktemp("tls") / "tls", HOSTS)


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> LocalCertificates:
    """Another CA with certificates of the same names: trusted by nobody here."""
    return local_certificates(tmp_path_factory.mktemp("other") / "tls", HOSTS)


async def health(address: str, tls: ClientTLS) -> grpc.StatusCode:
    async with open_channel(address, "", tls=tls) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def test_a_tls_server_answers_tls_clients_only(certificates, other_ca):
    server = create_server(
        "127.0.0.1:0",
        [],
        ["dispo.test.v1.Nothing"],
        Authorizer.refusing(),
        ServerTLS(str(certificates.cert_file), str(certificates.key_file)),
    )
    await server.start()
    await server.set_serving()
    address = f"127.0.0.1:{server.port}"
    try:
        assert await health(address, ClientTLS(str(certificates.ca_file))) is grpc.StatusCode.OK
        assert await health(f"localhost:{server.port}", certificates.client()) is grpc.StatusCode.OK
        assert await health(address, PLAINTEXT) is grpc.StatusCode.UNAVAILABLE
        # the server's certificate is not one the client's CA signed
        assert (
            await health(address, ClientTLS(str(other_ca.ca_file))) is grpc.StatusCode.UNAVAILABLE
        )
    finally:
        await server.stop(0)


@pytest.fixture(scope="module")
async def stack(infra, module_database, tmp_path_factory) -> AsyncIterator[Stack]:
    """``DISPO_TLS_CLIENT_AUTH=true dispo up --tls --services gateway`` on the session's
    PostgreSQL (the roles' passwords it keeps are the session's) and NATS."""
    data = tmp_path_factory.mktemp("stack") / "data"
    passwords = {s: login.password for s, login in infra.databases.logins.items()}
    write_private(data / PASSWORDS_FILE, json.dumps(passwords))
    options = StackOptions(
        data,
        database_url=module_database,
        nats_url=infra.nats_url,
        ports={"gateway": free_port()},
        services=("gateway",),
        demo_port=0,
        extra_env={**infra.nats_users.env("gateway"), "DISPO_TLS_CLIENT_AUTH": "true"},
        tls=True,
    )
    running = Stack(options)
    # started once SERVING, asked over mTLS as its readiness check does
    addresses = await running.start()
    assert set(addresses) == {"gateway"}
    yield running
    assert await running.stop() == []


async def submit(address: str, token: str, tls: ClientTLS | None, key: str) -> str:
    async with AsyncClient(address, token=token, tls=tls) as dispo:
        done = await dispo.submit(
            "ecommerce", [cells.update_quality_level(content_id=key, level=2)], idempotency_key=key
        )
    return done.task_id


async def refused(address: str, token: str, tls: ClientTLS) -> grpc.StatusCode:
    try:
        await submit(address, token, tls, "never")
    except DispoError as error:
        return error.code
    return grpc.StatusCode.OK


async def test_dispo_up_tls_serves_mtls_and_the_cli_and_sdk_find_the_certificates(stack, other_ca):
    data = stack.options.data_dir
    certificates = stack.options.certificates
    assert certificates is not None and certificates.folder == data / "tls"
    address = stack.options.host + f":{stack.options.ports['gateway']}"
    admin = stack.credentials.admin.secret

    # the SDK with what the CLI finds for the running stack, and the blocking client with
    # the settings a caller exports
    tls = caller_tls(data)
    assert tls == certificates.client()
    task_id = await submit(address, admin, tls, "tls-1")
    with Client(address, token=admin, tls=TLSSettings.of(certificates.env()).client) as dispo:
        seen = await asyncio.to_thread(dispo.get, task_id)
    assert seen.task_id == task_id

    # the CLI, run as a user runs it, finds the certificates in the data folder
    status = await asyncio.to_thread(
        subprocess.run,
        [DISPO, "--data-dir", str(data), "status", "--json"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("DISPO_TLS_")},
        timeout=120,
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert json.loads(status.stdout)["gateway"]["status"] == "SERVING"

    # mTLS: no client certificate, one of another CA, or no TLS at all: refused
    without_certificate = ClientTLS(str(certificates.ca_file))
    other_certificate = ClientTLS(
        str(certificates.ca_file), str(other_ca.client_cert_file), str(other_ca.client_key_file)
    )
    for refused_tls in (without_certificate, other_certificate, PLAINTEXT):
        assert await refused(address, admin, refused_tls) is grpc.StatusCode.UNAVAILABLE
    assert "-cacert" in "\n".join(banner(stack.options, {"gateway": address}))


def test_local_certificates_are_owner_only_and_kept(tmp_path):
    made = local_certificates(tmp_path / "tls", HOSTS)
    files = list(made.folder.iterdir())
    assert {p.name for p in files} == {
        "ca.pem",
        "ca.key",
        "server.pem",
        "server.key",
        "client.pem",
        "client.key",
    }
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files)
    assert made.folder.stat().st_mode & 0o777 == 0o700
    before = {p.name: p.read_bytes() for p in files}
    local_certificates(made.folder, HOSTS)  # the next start
    assert {p.name: p.read_bytes() for p in made.folder.iterdir()} == before
    # a host the server certificate does not name: it alone is made again, by the same CA
    local_certificates(made.folder, [*HOSTS, "dispo.internal"])
    after = {p.name: p.read_bytes() for p in made.folder.iterdir()}
    assert {name for name in before if before[name] != after[name]} == {"server.pem", "server.key"}
