"""The grpcurl walk-through in docs/recovery.md, run as written against real gateway,
executor and reconciler processes and the demo downstream."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from dispo.libs.catalogue import EXAMPLE
from support import eventually

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "recovery.md"
BIN = str(Path(sys.executable).parent)


def walkthrough_commands() -> list[tuple[str, str | None]]:
    """``(command, expected error code or None)`` for every command of the walk-through."""
    text = DOC.read_text().split("## Walk-through", 1)[1].split("\n## ", 1)[0]
    commands: list[tuple[str, str | None]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        expect = None
        for line in block.splitlines():
            if line.startswith("# fails: "):
                expect = line.removeprefix("# fails: ").strip()
            elif line.strip():
                commands.append((line, expect))
                expect = None
    return commands


# Until the command's output shows this, run it again (the work behind it is asynchronous).
WAIT_FOR = {
    "ListRecoveryTasks": "RECOVERY_STATE_PARKED_FAILED",
    "GatewayService/GetTask": "TASK_STATUS_SUCCEEDED",
    "GetCompletion": "TASK_STATUS_SUCCEEDED",
}


async def test_the_walkthrough_runs_as_written(start_service, downstream, tmp_path, tokens):
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(EXAMPLE.read_text().replace("http://127.0.0.1:8181", downstream.url))
    policy = yaml.safe_load((ROOT / "services/reconciler/recovery.yaml").read_text())
    policy["redrive"]["default"]["base_delay"] = 3600  # the walk-through redrives by hand
    (tmp_path / "recovery.yaml").write_text(yaml.safe_dump(policy))
    gateway = await start_service("gateway", {"DISPO_CATALOGUE": str(catalogue)})
    await start_service(
        "executor",
        {
            "DISPO_CATALOGUE": str(catalogue),
            "DISPO_EXECUTOR_RETRY_BASE_DELAY_SECONDS": "0.05",
            "DISPO_EXECUTOR_RETRY_MAX_DELAY_SECONDS": "0.2",
        },
    )
    reconciler = await start_service(
        "reconciler",
        {
            "DISPO_CATALOGUE": str(catalogue),
            "DISPO_RECONCILER_CONFIG": str(tmp_path / "recovery.yaml"),
            "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0.2",
        },
    )
    commands = walkthrough_commands()
    assert len(commands) >= 14
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "DISPO_TOKEN": tokens.admin}
    outputs = []
    for command, expect in commands:
        shell = (
            command.replace("127.0.0.1:50051", gateway.address)
            .replace("127.0.0.1:50053", reconciler.address)
            .replace("127.0.0.1:8181", downstream.url.removeprefix("http://"))
        )
        if shell.startswith("TASK=$("):
            shell += '; echo "$TASK"'
        wanted = next((v for k, v in WAIT_FOR.items() if k in command), None)
        done = await eventually(
            lambda shell=shell: subprocess.run(
                ["bash", "-c", shell], capture_output=True, text=True, env=env
            ),
            lambda done, wanted=wanted: wanted is None or wanted in done.stdout or done.returncode,
            timeout=45,
            interval=0.1,
            wanted=f"{wanted!r} from {command!r}",
            describe=lambda done: done.stdout,
        )
        if expect:
            assert done.returncode != 0 and f"Code: {expect}" in done.stderr, (command, done.stderr)
        else:
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            if wanted:
                assert wanted in done.stdout, (command, done.stdout)
        if shell.startswith("TASK=$("):
            env["TASK"] = done.stdout.strip().splitlines()[-1]
            assert re.fullmatch(r"[0-9a-f]{32}", env["TASK"]), done.stdout
        outputs.append(done.stdout)

    joined = "\n".join(outputs)
    assert "dispo.reconciler.v1.ReconcilerService" in joined
    assert '"error_class": "http_5xx"' in joined
    assert '"trigger": "REDRIVE_TRIGGER_MANUAL"' in joined or "RECOVERY_STATE_REDRIVEN" in joined
    assert '"paused": true' in joined
    calls = await downstream.calls()
    assert (
        calls[f"{env['TASK']}/update_quality_level.set_label"] == 5
    )  # 4 refused, 1 after the redrive
    assert calls[f"{env['TASK']}/update_quality_level.audit"] == 1
