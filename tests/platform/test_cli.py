"""The `dispo` CLI as a user runs it (a subprocess) against one real stack for the module:
its tables, its --json shape and its exit codes (0 ok, 1 the task ended failed or cancelled,
2 usage, 3 unreachable, 4 refused)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dispo.libs.stack.nats import free_port
from pipeline_fixtures import EXECUTOR_TEST_ENV, TEST_CATALOGUE, Downstream

DISPO = str(Path(sys.executable).parent / "dispo")
TASK_KEYS = {"task_id", "business", "status", "nodes", "version", "cancel_requested"}
# What starts, serves or logs for a stack, which no command that calls one needs to import.
SERVER_SIDE = (
    "structlog",
    "sqlalchemy",
    "alembic",
    "asyncpg",
    "nats",
    "dispo.libs.db",
    "dispo.libs.bus",
    "dispo.libs.service",
    "dispo.libs.stack.stack",
)


@pytest.fixture(scope="module")
async def downstream(tmp_path_factory):
    d = Downstream(free_port(), tmp_path_factory.mktemp("downstream") / "downstream.log")
    d.spawn()
    await d.wait_ready(15)
    yield d
    d.kill()


@pytest.fixture(scope="module")
async def cli_env(module_services, downstream, tokens, tmp_path_factory):
    """The environment the CLI finds the module's gateway and the admin token in."""
    folder = tmp_path_factory.mktemp("cli")
    catalogue = folder / "catalogue.yaml"
    catalogue.write_text(TEST_CATALOGUE.format(url=downstream.url))
    gateway, _ = await asyncio.gather(
        module_services.start(
            "gateway",
            {
                "DISPO_CATALOGUE": str(catalogue),
                "DISPO_GATEWAY_WATCH_POLL_INTERVAL_SECONDS": "0.2",
                "DISPO_EGRESS_ALLOW": downstream.url,
            },
        ),
        module_services.start("executor", {**EXECUTOR_TEST_ENV, "DISPO_CATALOGUE": str(catalogue)}),
    )
    host, port = gateway.address.rsplit(":", 1)
    return {
        "PATH": os.environ["PATH"],
        "DISPO_DATA_DIR": str(folder / "data"),  # no stack there: the address from settings
        "DISPO_GATEWAY_HOST": host,
        "DISPO_GATEWAY_PORT": port,
        "DISPO_TOKEN": tokens.admin,
    }


def run(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPO, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120
    )


async def dispo(
    env: dict[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run, env, *args, stdin=stdin)


def submission(business: str, *cells: dict) -> str:
    return json.dumps({"business": business, "cells": list(cells)})


async def test_submit_wait_shows_the_task_and_exits_0_and_list_is_newest_first(cli_env, tmp_path):
    yaml_file = tmp_path / "task.yaml"
    yaml_file.write_text(
        "business: cli-a\ncells:\n  - {cell: step, payload: {name: first}}\n"
        "  - {cell: noop, depends_on: [step]}\n"
    )
    shown, as_json = await asyncio.gather(
        dispo(cli_env, "submit", str(yaml_file), "--wait"),
        dispo(
            cli_env,
            "submit",
            "-",
            "--wait",
            "--json",
            stdin=submission("cli-a", {"cell": "noop", "ref": "only"}),
        ),
    )
    assert shown.returncode == 0, shown.stderr
    assert "SUCCEEDED" in shown.stdout and "step.call" in shown.stdout
    assert "dependencies" in shown.stdout  # the tree: noop under step
    assert as_json.returncode == 0, as_json.stderr
    reply = json.loads(as_json.stdout)
    assert set(reply) == {"task", "completion"}
    assert TASK_KEYS <= set(reply["task"]) and reply["task"]["status"] == "TASK_STATUS_SUCCEEDED"
    assert {n["node_id"] for n in reply["task"]["nodes"]} == {"only.noop"}

    later = await dispo(
        cli_env, "submit", "-", "--json", stdin=submission("cli-a", {"cell": "noop"})
    )
    assert later.returncode == 0, later.stderr
    accepted = json.loads(later.stdout)
    assert set(accepted) == {"task_id", "status", "duplicate"}

    listed = await dispo(cli_env, "tasks", "list", "--business", "cli-a", "--limit", "2", "--json")
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert set(page) == {"tasks", "page", "more"} and page["more"] is True
    assert page["tasks"][0]["task_id"] == accepted["task_id"]  # newest first
    assert [t["created_at"] for t in page["tasks"]] == sorted(
        (t["created_at"] for t in page["tasks"]), reverse=True
    )
    rest = await dispo(
        cli_env, "tasks", "list", "--business", "cli-a", "--json",
        "--page-token", page["page"]["next_page_token"],
    )  # fmt: skip
    assert [t["business"] for t in json.loads(rest.stdout)["tasks"]] == ["cli-a"]

    show = await dispo(cli_env, "tasks", "show", reply["task"]["task_id"])
    assert show.returncode == 0 and "only.noop" in show.stdout and "SUCCEEDED" in show.stdout


async def test_a_cancelled_task_exits_1_for_submit_wait_and_watch(cli_env, downstream):
    await downstream.control(hold={"path": "/step/held"})
    waiting = asyncio.create_task(
        dispo(
            cli_env,
            "submit",
            "-",
            "--wait",
            "--json",
            stdin=submission(
                "cli-b",
                {"cell": "step", "ref": "first", "payload": {"name": "held"}},
                {
                    "cell": "step",
                    "ref": "second",
                    "payload": {"name": "after"},
                    "depends_on": ["first"],
                },
            ),
        )
    )
    await downstream.wait_held()
    newest = json.loads(
        (await dispo(cli_env, "tasks", "list", "--business", "cli-b", "--json")).stdout
    )
    task_id = newest["tasks"][0]["task_id"]

    cancelled = await dispo(cli_env, "tasks", "cancel", task_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["task"]["cancel_requested"] is True
    watching = asyncio.create_task(dispo(cli_env, "tasks", "watch", task_id))
    await downstream.control(release=True)

    ended, watched = await waiting, await watching
    assert ended.returncode == 1, ended.stderr
    assert json.loads(ended.stdout)["task"]["status"] == "TASK_STATUS_CANCELLED"
    assert watched.returncode == 1, watched.stderr
    assert "CANCELLED" in watched.stdout and "second.call" in watched.stdout
    again = await dispo(cli_env, "tasks", "cancel", task_id)  # already ended: refused
    assert again.returncode == 4 and "FAILED_PRECONDITION" in again.stderr


async def test_refused_unreachable_and_usage_errors_say_what_to_do(cli_env, tmp_path):
    bad_token, bad_cell, unreachable, bad_option, bad_file = await asyncio.gather(
        dispo({**cli_env, "DISPO_TOKEN": "dispo_not-a-token"}, "tasks", "list"),
        dispo(cli_env, "submit", "-", stdin=submission("cli-c", {"cell": "delete_everything"})),
        dispo({**cli_env, "DISPO_GATEWAY_PORT": str(free_port())}, "tasks", "show", "t-1"),
        dispo(cli_env, "tasks", "list", "--limit", "0"),
        dispo(cli_env, "submit", "-", stdin='{"business": "x", "cellz": []}'),
    )
    assert bad_token.returncode == 4 and "UNAUTHENTICATED" in bad_token.stderr
    assert "--token" in bad_token.stderr  # what to do
    assert bad_cell.returncode == 4 and "INVALID_ARGUMENT" in bad_cell.stderr
    assert "cells[0].cell: unknown cell 'delete_everything'" in bad_cell.stderr
    assert unreachable.returncode == 3 and "dispo up" in unreachable.stderr
    assert bad_option.returncode == 2
    assert bad_file.returncode == 2 and "'cellz'" in bad_file.stderr
    version = await dispo(cli_env, "--version")
    assert version.returncode == 0 and version.stdout.startswith("dispo ")


def test_the_commands_that_call_a_stack_import_neither_the_database_layer_nor_the_bus(tmp_path):
    """Each `dispo` call is a process of its own: what it imports it pays for every time."""
    commands = [
        ["--version"],
        ["tasks", "show", "t-1"],  # through the SDK's client
        ["failed", "list"],  # through a channel of the CLI's own
        ["tokens", "list"],
        ["status"],
    ]
    probe = (
        "import json, sys\n"
        "from dispo.libs.cli.main import main\n"
        "codes = []\n"
        f"for argv in {commands!r}:\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as end:\n"
        "        codes.append(end.code)\n"
        f"print(json.dumps([codes, [m for m in {SERVER_SIDE!r} if m in sys.modules]]))\n"
    )
    nothing = str(free_port())  # no stack anywhere: every call is unreachable
    env = {"PATH": os.environ["PATH"], "DISPO_DATA_DIR": str(tmp_path), "DISPO_TOKEN": "t"}
    env |= {f"DISPO_{s.upper()}_PORT": nothing for s in ("gateway", "reconciler")}
    ran = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    codes, imported = json.loads(ran.stdout.splitlines()[-1])
    assert codes == [0, 3, 3, 3, 1]  # each ran: ok, unreachable (3), and status not serving
    assert imported == []
