"""The walk-through in docs/pipeline.md, run as written (grpcurl, curl, jq and the Python
example) against real gateway and executor processes and the demo downstream."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dispo.libs.catalogue import EXAMPLE

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "pipeline.md"
BIN = str(Path(sys.executable).parent)


def section(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0]


@pytest.mark.skipif(
    shutil.which("jq") is None,
    reason="the walk-through uses jq (Debian package jq; .ci/run installs it)",
)
async def test_the_walkthrough_runs_as_written(start_service, downstream, tmp_path, tokens):
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(EXAMPLE.read_text().replace("http://127.0.0.1:8181", downstream.url))
    gateway = await start_service("gateway", {"DISPO_CATALOGUE": str(catalogue)})
    await start_service(
        "executor",
        {"DISPO_CATALOGUE": str(catalogue), "DISPO_EXECUTOR_RETRY_BASE_DELAY_SECONDS": "0.05"},
    )
    text = DOC.read_text()
    walkthrough = section(text, "## Five minutes", "### From Python")
    blocks = re.findall(r"```sh\n(.*?)```", walkthrough, re.S)[1:]  # the first one is `dispo up`
    assert len(blocks) == 4
    script = (
        "\n".join(blocks)
        .replace("127.0.0.1:50051", gateway.address)
        .replace("127.0.0.1:8181", downstream.url.removeprefix("http://"))
    )

    result = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-u", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "DISPO_TOKEN": tokens.admin},
    )
    out = result.stdout + result.stderr

    assert '"duplicate": true' in out, out
    assert '"status": "TASK_STATUS_SUCCEEDED"' in out
    assert (
        '[{"label.set_label":"NODE_STATUS_FAILED"},{"label.audit":"NODE_STATUS_DEPENDENCY_FAILED"},'
        '{"start_review.open_ticket":"NODE_STATUS_SUCCEEDED"},'
        '{"notify_owner.send":"NODE_STATUS_DEPENDENCY_FAILED"}]'
    ) in out
    assert '["NODE_STATUS_CANCELLED","NODE_STATUS_CANCELLED"]' in out
    assert (
        "Code: InvalidArgument" in out and "cells[0].cell: unknown cell 'delete_everything'" in out
    )

    [example] = re.findall(
        r"```python\n(.*?)```", section(text, "### From Python", "## The catalogue"), re.S
    )
    ran = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", example.replace("127.0.0.1:50051", gateway.address)],
        env={**os.environ, "DISPO_TOKEN": tokens.admin},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.stdout.startswith("SUCCEEDED {"), ran.stdout + ran.stderr
