"""Transport security: a TLS server answers TLS clients only, with mTLS only clients holding a
certificate of its CA, and a certificate of another CA is refused either way."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from dispo.libs.auth import open_channel
from dispo.libs.auth.server import Authorizer
from dispo.libs.grpcserver import create_server
from dispo.libs.sdk import AsyncClient, Client, DispoError, cells
from dispo.libs.stack.certificates import LocalCertificates, local_certificates
from dispo.libs.tls import PLAINTEXT, ClientTLS, ServerTLS
from grpc_health.v1 import health_pb2, health_pb2_grpc

HOSTS = ["127.0.0.1", "localhost"]


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


def tls_env(files: LocalCertificates, *, client_auth: bool) -> dict[str, str]:
    return {**files.env(), "DISPO_TLS_CLIENT_AUTH": str(client_auth).lower()}


async def submit(address: str, token: str, tls: ClientTLS, key: str) -> str:
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


async def test_mtls_admits_only_clients_with_a_certificate_of_its_ca(
    module_services, tokens, certificates, other_ca
):
    # started and found SERVING over mTLS, as dispo up's readiness check asks
    gateway = await module_services.start("gateway", tls_env(certificates, client_auth=True))
    address = gateway.address

    task_id = await submit(address, tokens.admin, certificates.client(), "tls-1")
    # the blocking client too, its settings from the environment a caller would set
    with Client(address, token=tokens.admin, tls=certificates.client()) as dispo:
        seen = await asyncio.to_thread(dispo.get, task_id)
    assert seen.task_id == task_id

    without_certificate = ClientTLS(str(certificates.ca_file))
    other_certificate = ClientTLS(
        str(certificates.ca_file), str(other_ca.client_cert_file), str(other_ca.client_key_file)
    )
    for tls in (without_certificate, other_certificate, PLAINTEXT):
        assert await refused(address, tokens.admin, tls) is grpc.StatusCode.UNAVAILABLE, tls


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
