"""Clients in other languages: the Node.js example (examples/node) against a real stack —
gateway, executor and reconciler processes on the example catalogue and the demo downstream,
called with a business's own token."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path

import pytest
from dispo.libs.catalogue import EXAMPLE
from dispo.pool.openclaw import OpenClawUnavailable
from pipeline_fixtures import Pipeline
from support.auth import business_token
from support.node import EXAMPLE_DIR, example_node

BUSINESS = "node-example"


@pytest.fixture(scope="module")
def node() -> Path:
    try:
        return example_node()
    except OpenClawUnavailable as missing:
        pytest.skip(f"no Node.js: {missing}")


@pytest.fixture(scope="module")
async def stack(module_services, module_downstream, tmp_path_factory):
    catalogue = tmp_path_factory.mktemp("node-client") / "catalogue.yaml"
    catalogue.write_text(
        EXAMPLE.read_text().replace("http://127.0.0.1:8181", module_downstream.url)
    )
    pipeline = Pipeline(module_services.start, catalogue, module_downstream.url)
    _, _, reconciler = await asyncio.gather(
        pipeline.start_gateway(),
        pipeline.start_executor(),
        module_services.start("reconciler", {"DISPO_CATALOGUE": str(catalogue)}),
    )
    return pipeline.gateway, reconciler, module_downstream


async def run_client(node: Path, token: str, gateway, reconciler, downstream) -> str:
    """What one run of the example printed (run ``RUN`` = r1, so its keys are the same each
    time); it must end without error. The cancelled task's review call is held open, and the
    failing task's first label call refused with a 400 (a permanent failure: the task ends
    FAILED), its resume succeeds."""
    await downstream.control(release=True)
    await downstream.control(hold={"path": "/reviews/held-"})
    await downstream.control(fail={"status": 400, "times": 1, "path": "/labels/fails-"})
    ran = await asyncio.to_thread(
        subprocess.run,
        [str(node), "client.mjs"],
        cwd=EXAMPLE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ["PATH"],
            "DISPO_TOKEN": token,
            "GATEWAY": gateway.address,
            "RECONCILER": reconciler.address,
            "BUSINESS": BUSINESS,
            "RUN": "r1",
        },
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    out = ran.stdout
    assert "submitted again: same task true duplicate=true" in out
    assert (
        "to TASK_STATUS_SUCCEEDED: update_quality_level.set_label=NODE_STATUS_SUCCEEDED"
        " update_quality_level.audit=NODE_STATUS_SUCCEEDED notify_owner.send=NODE_STATUS_SUCCEEDED"
    ) in out
    assert re.search(r"^cancel requested for [0-9a-f]+: true$", out, re.M), out
    assert " to TASK_STATUS_FAILED\n" in out
    assert "resumed " in out and "RECOVERY_STATE_REDRIVEN" in out
    assert "to TASK_STATUS_SUCCEEDED after the resume" in out
    assert "refused: INVALID_ARGUMENT:" in out
    assert "  idempotency_key: longer than 128 characters\n" in out
    assert "  cells[0].cell: unknown cell 'delete_everything'\n" in out
    # SubmitEach: the bad item refused in its place, naming its own field; the others recorded
    assert re.search(r"^each\[0\] accepted [0-9a-f]{32} duplicate=(true|false)$", out, re.M), out
    assert re.search(r"^each\[1\] refused: INVALID_ARGUMENT: .*\n  cells\[0\]\.cell: ", out, re.M)
    assert re.search(r"^each\[2\] accepted [0-9a-f]{32} duplicate=false$", out, re.M), out
    return out


async def test_the_node_client_submits_watches_lists_cancels_resumes_and_reads_errors_twice(
    node, stack, module_database
):
    """The example run twice against the same stack with the same keys: the second run's
    keyed task is the first run's (a duplicate), its other tasks are new, and every step
    works again."""
    gateway, reconciler, downstream = stack
    _, token = await business_token(module_database, BUSINESS)

    first = await run_client(node, token, gateway, reconciler, downstream)
    [keyed] = re.findall(
        r"^submitted ([0-9a-f]{32}) TASK_STATUS_ACCEPTED duplicate=false$", first, re.M
    )
    assert f"listed 3 tasks of {BUSINESS}, this run's among them: true" in first

    second = await run_client(node, token, gateway, reconciler, downstream)
    assert re.search(rf"^submitted {keyed} TASK_STATUS_[A-Z]+ duplicate=true$", second, re.M), (
        second
    )
    # the keyed task once, the cancelled and the resumed task of each run,
    # ... and the first run's two SubmitEach tasks
    assert f"listed 7 tasks of {BUSINESS}, this run's among them: true" in second
    [each] = re.findall(r"^each\[0\] accepted ([0-9a-f]{32}) duplicate=false$", first, re.M)
    assert f"each[0] accepted {each} duplicate=true" in second  # its key: the same task
