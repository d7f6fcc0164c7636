"""Clients in other languages: the Go example (examples/go), built with Go from Debian's
packages, against a real stack — gateway and executor processes on the example catalogue and
the demo downstream, called with a business's own token; and a gateway serving TLS."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from dispo.libs.catalogue import EXAMPLE
from dispo.sdk import AsyncClient
from dispo.tools.stack.certificates import local_certificates
from pipeline_fixtures import Pipeline
from support.auth import business_token
from support.go import GoUnavailable, build_example

BUSINESS = "go-example"
NODES = {"update_quality_level.set_label", "update_quality_level.audit", "notify_owner.send"}


@pytest.fixture(scope="module")
def dispo_go() -> Path:
    """The dispo-go command, built by the example's build.sh (Go installed first if
    missing)."""
    try:
        return build_example() / "dispo-go"
    except GoUnavailable as missing:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"no Go from Debian's packages: {missing}")


@pytest.fixture(scope="module")
async def stack(module_services, module_downstream, tmp_path_factory):
    catalogue = tmp_path_factory.mktemp("go-client") / "catalogue.yaml"
    catalogue.write_text(
        EXAMPLE.read_text().replace("http://127.0.0.1:8181", module_downstream.url)
    )
    pipeline = Pipeline(module_services.start, catalogue, module_downstream.url)
    await asyncio.gather(pipeline.start_gateway(), pipeline.start_executor())
    return pipeline


@pytest.fixture(scope="module")
async def token(module_database) -> str:
    _, secret = await business_token(module_database, BUSINESS)
    return secret


async def run(dispo_go: Path, address: str, *args: str, **env: str) -> tuple[int, str, str]:
    """One run of dispo-go against the gateway at ``address``: (exit code, stdout, stderr)."""
    ran = await asyncio.to_thread(
        subprocess.run,
        [str(dispo_go), "-address", address, "-timeout", "60s", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={"PATH": os.environ["PATH"], **env},
    )
    return ran.returncode, ran.stdout, ran.stderr


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def node_states(task: dict[str, Any]) -> dict[str, str]:
    return {node["node_id"]: node["status"] for node in task["nodes"]}


async def test_the_go_client_submits_under_a_key_watches_to_the_end_and_reads_the_task(
    dispo_go, stack, token
):
    gateway = stack.gateway.address
    code, out, err = await run(dispo_go, gateway, "cells", DISPO_TOKEN=token)
    assert code == 0, err
    [listed] = lines(out)
    cells = {cell["name"]: cell for cell in listed["cells"]}
    assert {"update_quality_level", "notify_owner"} <= cells.keys()
    assert [a["name"] for a in cells["update_quality_level"]["actions"]] == ["set_label", "audit"]

    key = f"go-{uuid.uuid4().hex}"
    request = json.dumps(
        {
            "business": BUSINESS,
            "idempotency_key": key,
            "cells": [
                {"cell": "update_quality_level", "payload": {"content_id": key, "level": 3}},
                {
                    "cell": "notify_owner",
                    "payload": {"owner_id": "user-7", "message": "label raised"},
                    "depends_on": ["update_quality_level"],
                },
            ],
        }
    )
    code, out, err = await run(dispo_go, gateway, "submit", "-d", request, DISPO_TOKEN=token)
    assert code == 0, err
    [submitted] = lines(out)
    assert submitted["status"] == "TASK_STATUS_ACCEPTED" and submitted["duplicate"] is False
    task_id = submitted["task_id"]

    # the same key again: the same task, a duplicate (the request from standard input)
    again = await asyncio.to_thread(
        subprocess.run,
        [str(dispo_go), "-address", gateway, "submit", "-d", "@-"],
        input=request,
        capture_output=True,
        text=True,
        timeout=90,
        env={"PATH": os.environ["PATH"], "DISPO_TOKEN": token},
    )
    assert again.returncode == 0, again.stderr
    [repeated] = lines(again.stdout)
    assert repeated["task_id"] == task_id and repeated["duplicate"] is True

    code, out, err = await run(dispo_go, gateway, "watch", task_id, DISPO_TOKEN=token)
    assert code == 0, err  # 0: the task SUCCEEDED
    changes = lines(out)
    assert {change["task_id"] for change in changes} == {task_id}
    watched = changes[-1]
    assert watched["status"] == "TASK_STATUS_SUCCEEDED"
    assert node_states(watched) == dict.fromkeys(NODES, "NODE_STATUS_SUCCEEDED")

    code, out, err = await run(dispo_go, gateway, "get", task_id, DISPO_TOKEN=token)
    assert code == 0, err
    [got] = lines(out)
    assert got["task"]["status"] == "TASK_STATUS_SUCCEEDED"
    assert got["task"]["business"] == BUSINESS and got["task"]["idempotency_key"] == key
    assert node_states(got["task"]) == node_states(watched)
    assert got["task"]["version"] == watched["version"]
    assert got["completion"]["finished_at"] is not None


async def test_a_bad_submission_through_the_go_client_names_the_field_and_records_nothing(
    dispo_go, stack, token
):
    key = f"go-bad-{uuid.uuid4().hex}"
    request = {
        "business": BUSINESS,
        "idempotency_key": key,
        "cells": [{"cell": "delete_everything", "payload": {}}],
    }
    code, out, err = await run(
        dispo_go, stack.gateway.address, "submit", "-d", json.dumps(request), DISPO_TOKEN=token
    )
    assert (code, out) == (4, ""), err  # 4: refused
    refused = json.loads(err)
    assert refused["code"] == "INVALID_ARGUMENT"
    assert refused["violations"] == [
        {"field": "cells[0].cell", "description": "unknown cell 'delete_everything'"}
    ]
    async with AsyncClient(stack.gateway.address, token=token) as client:
        counts = await client.count(business=BUSINESS, idempotency_key=key)
    assert sum(counts.values()) == 0


async def test_the_go_client_speaks_tls_to_a_tls_gateway_with_its_token(
    dispo_go, stack, module_services, token, tmp_path_factory
):
    """TLS verified against the stack's CA, the token sent over it; a plaintext client is
    refused at the handshake, and TLS without a token is UNAUTHENTICATED."""
    certificates = local_certificates(tmp_path_factory.mktemp("tls") / "tls", ["127.0.0.1"])
    gateway = await module_services.start(
        "gateway",
        {
            "DISPO_CATALOGUE": str(stack.catalogue),
            "DISPO_TLS_CERT_FILE": str(certificates.cert_file),
            "DISPO_TLS_KEY_FILE": str(certificates.key_file),
            "DISPO_TLS_CA_FILE": str(certificates.ca_file),
        },
    )
    ca = {"DISPO_TLS_CA_FILE": str(certificates.ca_file)}

    code, out, err = await run(dispo_go, gateway.address, "cells", DISPO_TOKEN=token, **ca)
    assert code == 0, err
    assert "update_quality_level" in {cell["name"] for cell in lines(out)[0]["cells"]}

    code, _, err = await run(dispo_go, gateway.address, "cells", DISPO_TOKEN=token)
    assert code == 3 and json.loads(err)["code"] == "UNAVAILABLE", err

    code, _, err = await run(dispo_go, gateway.address, "cells", **ca)
    assert code == 4 and json.loads(err)["code"] == "UNAUTHENTICATED", err
