"""`dispo tokens` against a real gateway: a token is made, shown once, listed without its
secret, revoked, and refused from then on; a token that expired is refused; a business's
first token brings its webhook signing secret, which `rotate-secret` rotates."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from dispo.auth.bootstrap import stack_credentials
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.auth import open_channel

DISPO = str(Path(sys.executable).parent / "dispo")


def dispo(gateway: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPO, "--token", token, "tokens", "--gateway", gateway, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def list_cells(address: str, token: str) -> grpc.StatusCode:
    async with open_channel(address, token) as channel:
        try:
            await gateway_pb2_grpc.GatewayServiceStub(channel).ListCells(
                gateway_pb2.ListCellsRequest(), timeout=10
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def test_create_list_revoke_through_the_cli(start_service, tokens, tmp_path):
    gateway = (await start_service("gateway")).address

    made = await asyncio.to_thread(
        dispo, gateway, tokens.admin, "--json", "create", "--business", "shop", "--expires", "30d"
    )
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    secret, token_id = created["secret"], created["token"]["token_id"]
    assert secret.startswith("dispo_") and created["token"]["business"] == "shop"
    assert "expires_at" in created["token"]
    assert await list_cells(gateway, secret) is grpc.StatusCode.OK
    # the business's first token made its webhook signing secret, shown this once
    first = created["signing_secret"]
    assert first.startswith("whsec_") and created["signing_secret_info"]["business"] == "shop"

    rotated = await asyncio.to_thread(
        dispo, gateway, tokens.admin, "rotate-secret", "--business", "shop", "--grace", "1h"
    )
    assert rotated.returncode == 0, rotated.stderr
    assert rotated.stdout.startswith("whsec_") and first not in rotated.stdout
    assert "previous, valid until" in rotated.stderr

    listed = await asyncio.to_thread(
        dispo, gateway, tokens.admin, "--json", "list", "--business", "shop"
    )
    assert listed.returncode == 0, listed.stderr
    assert [t["token_id"] for t in json.loads(listed.stdout)] == [token_id]
    assert secret not in listed.stdout

    # a business token may not administer tokens
    refused = await asyncio.to_thread(dispo, gateway, secret, "list")
    assert refused.returncode == 4 and "PERMISSION_DENIED" in refused.stderr

    revoked = await asyncio.to_thread(dispo, gateway, tokens.admin, "revoke", token_id)
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout
    assert await list_cells(gateway, secret) is grpc.StatusCode.UNAUTHENTICATED


async def test_a_worker_token_through_the_cli_names_its_queues(start_service, tokens):
    gateway = (await start_service("gateway")).address
    made = await asyncio.to_thread(
        dispo,
        gateway,
        tokens.admin,
        "--json",
        "create",
        "--worker",
        "--queue",
        "tickets",
        "--queue",
        "mail",
        "--label",
        "ticket workers",
    )
    assert made.returncode == 0, made.stderr
    created = json.loads(made.stdout)
    secret, token = created["secret"], created["token"]
    assert (token["kind"], token["queues"]) == ("TOKEN_KIND_WORKER", ["mail", "tickets"])
    # It serves queues, nothing else: not even a read of the catalogue.
    assert await list_cells(gateway, secret) is grpc.StatusCode.PERMISSION_DENIED

    listed = await asyncio.to_thread(dispo, gateway, tokens.admin, "list")
    assert listed.returncode == 0, listed.stderr
    [line] = [row for row in listed.stdout.splitlines() if token["token_id"] in row]
    assert "worker" in line and "mail,tickets" in line and "ticket workers" in line

    no_queue = await asyncio.to_thread(dispo, gateway, tokens.admin, "create", "--worker")
    assert no_queue.returncode == 2 and "--queue" in no_queue.stderr
    bad = await asyncio.to_thread(
        dispo, gateway, tokens.admin, "create", "--worker", "--queue", "9lives"
    )
    assert bad.returncode != 0 and "queues[0]" in bad.stderr, bad.stderr
    business_queue = await asyncio.to_thread(
        dispo, gateway, tokens.admin, "create", "--business", "shop", "--queue", "tickets"
    )
    assert business_queue.returncode == 2 and "--worker" in business_queue.stderr


@pytest.mark.parametrize("value", ["0d", "soon", "5w"])
def test_an_expiry_that_is_not_a_duration_is_refused_before_any_call(value):
    result = subprocess.run(
        [
            DISPO,
            "tokens",
            "--gateway",
            "127.0.0.1:1",
            "create",
            "--business",
            "b",
            "--expires",
            value,
        ],
        capture_output=True,
        text=True,
        env={"DISPO_TOKEN": "x", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2 and "not a duration" in result.stderr


def test_the_stack_credentials_are_owner_only_in_an_owner_only_folder(tmp_path):
    data = tmp_path / "data"
    made = stack_credentials(data, ["gateway", "reconciler"])
    files = [made.admin_token_file, made.bootstrap_file, data / "auth" / "credentials.json"]
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files)
    assert (data / "auth").stat().st_mode & 0o777 == 0o700
    # the next start keeps them
    assert stack_credentials(data, ["gateway", "reconciler"]) == made
    # what one start had to make again (here the signing key) the starts after it keep
    kept = json.loads(files[2].read_text())
    files[2].write_text(json.dumps({**kept, "signing_key": ""}))
    again = stack_credentials(data, ["gateway", "reconciler"])
    assert again.signing_key not in ("", made.signing_key)
    assert stack_credentials(data, ["gateway", "reconciler"]) == again
    assert again.admin == made.admin and again.services == made.services
