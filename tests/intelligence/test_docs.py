"""The grpcurl walk-through in docs/intelligence.md, run as written against the real process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support import eventually

DOC = Path(__file__).resolve().parents[2] / "docs" / "intelligence.md"
GRPCURL = str(Path(sys.executable).parent / "grpcurl")


def walkthrough_commands() -> list[tuple[str, str | None]]:
    """``(command, expected error code or None)`` for every grpcurl command of the walk-through."""
    text = DOC.read_text().split("## Walk-through", 1)[1].split("\n## ", 1)[0]
    commands: list[tuple[str, str | None]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        expect, current = None, ""
        for line in block.splitlines():
            if line.startswith("# fails: "):
                expect = line.removeprefix("# fails: ").strip()
                continue
            current += line + "\n"
            if line.endswith("\\") or current.count("'") % 2:
                continue
            commands.append((current.strip(), expect))
            expect, current = None, ""
    return commands


async def test_the_walkthrough_runs_as_written(start_service, tokens):
    service = await start_service("intelligence")
    commands = walkthrough_commands()
    assert len(commands) >= 12
    outputs = []
    for command, expect in commands:
        shell = command.replace("localhost:50054", service.address).replace(
            "grpcurl ", f"{GRPCURL} ", 1
        )
        # Jobs run in the background: read again until they settle.
        done = await eventually(
            lambda shell=shell: subprocess.run(
                ["bash", "-c", shell],
                capture_output=True,
                text=True,
                env={**os.environ, "DISPO_TOKEN": tokens.admin},
            ),
            lambda done, command=command: (
                "Trigger" in command
                or not re.search(r"JOB_STATUS_(QUEUED|GENERATING)", done.stdout)
            ),
            timeout=30,
            interval=0.1,
            wanted=f"settled jobs for {command!r}",
            describe=lambda done: done.stdout,
        )
        if expect:
            assert done.returncode != 0 and f"Code: {expect}" in done.stderr, (command, done.stderr)
        else:
            assert done.returncode == 0, (command, done.stderr)
        outputs.append(done.stdout)

    joined = "\n".join(outputs)
    assert "no baseline for evaluation 'nightly-w01'" in joined
    assert (
        '"baselineEvaluationId": "nightly-w01"' in joined
        or '"baseline_evaluation_id": "nightly-w01"' in joined
    )
    assert "DIRECTION_IMPROVED" in joined
    assert '"started": true' in joined
