"""The `dispo` CLI as a user runs it (a subprocess) against one real stack for the module:
its tables, its --json shape and its exit codes (0 ok, 1 the task ended failed or cancelled,
2 usage, 3 unreachable, 4 refused)."""

from __future__ import annotations

import asyncio
import functools
import io
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.bus import Bus
from dispo.libs.contracts import tasks
from dispo.libs.process import ManagedProcess, free_port
from dispo.tools.cli._common import progress_bar
from dispo.tools.cli.main import app
from pipeline_fixtures import EXECUTOR_TEST_ENV, TEST_CATALOGUE, Downstream
from rich.console import Console
from support import eventually

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
    "dispo.tools.stack.stack",
)


@pytest.fixture(scope="module")
async def downstream(tmp_path_factory):
    d = Downstream(free_port(), tmp_path_factory.mktemp("downstream") / "downstream.log")
    d.spawn()
    await d.wait_ready(15)
    yield d
    d.kill()


@pytest.fixture(scope="module")
def catalogue(downstream, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("catalogue") / "catalogue.yaml"
    path.write_text(TEST_CATALOGUE.format(url=downstream.url))
    return path


@pytest.fixture(scope="module")
async def cli_env(module_services, downstream, catalogue, tokens, tmp_path_factory):
    """The environment the CLI finds the module's gateway and executor and the admin token in."""
    folder = tmp_path_factory.mktemp("cli")
    executor_port = free_port()  # where the gateway reads the outputs of its views
    gateway, executor = await asyncio.gather(
        module_services.start(
            "gateway",
            {
                "DISPO_CATALOGUE": str(catalogue),
                "DISPO_GATEWAY_WATCH_POLL_INTERVAL_SECONDS": "0.2",
                "DISPO_EGRESS_ALLOW": downstream.url,
                "DISPO_GATEWAY_EXECUTOR_ADDRESS": f"127.0.0.1:{executor_port}",
            },
        ),
        module_services.start(
            "executor",
            {**EXECUTOR_TEST_ENV, "DISPO_CATALOGUE": str(catalogue)},
            port=executor_port,
        ),
    )
    return {
        "PATH": os.environ["PATH"],
        "DISPO_DATA_DIR": str(folder / "data"),  # no stack there: the addresses from settings
        "DISPO_TOKEN": tokens.admin,
        **addresses(gateway=gateway, executor=executor),
    }


def addresses(**services: ManagedProcess) -> dict[str, str]:
    """The DISPO_<SERVICE>_HOST/PORT settings a command finds ``services`` by."""
    found = {}
    for name, process in services.items():
        host, port = process.address.rsplit(":", 1)
        found[f"DISPO_{name.upper()}_HOST"], found[f"DISPO_{name.upper()}_PORT"] = host, port
    return found


@pytest.fixture(scope="module")
async def operators_env(module_services, cli_env, downstream, catalogue, tmp_path_factory):
    """:func:`cli_env` with the reconciler, the pool (no worker: its queue stays as made)
    and the intelligence service of the module too."""
    folder = tmp_path_factory.mktemp("operators")
    common = {"DISPO_CATALOGUE": str(catalogue), "DISPO_EGRESS_ALLOW": downstream.url}
    reconciler, pool, intelligence = await asyncio.gather(
        module_services.start("reconciler", common),
        module_services.start(
            "pool",
            {
                **common,
                "DISPO_POOL_LOCAL_REGISTRY": str(folder / "registry.sqlite"),
                "DISPO_POOL_SPAWN_WORKER": "false",
            },
        ),
        module_services.start("intelligence", common),
    )
    return {**cli_env, **addresses(reconciler=reconciler, pool=pool, intelligence=intelligence)}


def run(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPO, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120
    )


def at_a_terminal(env: dict[str, str], *args: str) -> str:
    """What ``dispo args`` prints (errors too) with a terminal, a pseudo-terminal, as its
    output; the command must succeed."""
    main, side = pty.openpty()
    with subprocess.Popen(
        [DISPO, *args], stdout=side, stderr=side, stdin=subprocess.DEVNULL, env=env
    ) as process:
        os.close(side)
        printed = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the command ended and closed its side: all read
                break
            if not chunk:
                break
            printed += chunk
        os.close(main)
        assert process.wait(timeout=120) == 0, printed
    return printed.decode()


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
    assert set(reply) == {"task", "completion", "labels"} and reply["labels"] == {}
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

    # The task's history: each snapshot, what it changed, the last one SUCCEEDED.
    history, table = await asyncio.gather(
        dispo(cli_env, "tasks", "events", reply["task"]["task_id"], "--json"),
        dispo(cli_env, "tasks", "events", reply["task"]["task_id"]),
    )
    assert history.returncode == 0, history.stderr
    events = json.loads(history.stdout)
    assert set(events) == {"events", "page", "more"} and events["more"] is False
    assert events["events"][-1]["status"] == "TASK_STATUS_SUCCEEDED"
    assert [c["node_id"] for e in events["events"] for c in e["changes"]][0] == "only.noop"
    assert table.returncode == 0, table.stderr
    assert "only.noop" in table.stdout and "SUCCEEDED" in table.stdout


async def test_tasks_show_prints_each_nodes_output_and_the_result(cli_env, downstream):
    """At a terminal a long output shows its first 200 characters; in a pipe, and with
    --json as JSON values, every output and the result are whole."""
    long = "x" * 500
    await downstream.control(answer={"path": "/step/long", "body": {"blob": long}})
    submitted = await dispo(
        cli_env,
        "submit",
        "-",
        "--wait",
        "--json",
        stdin=submission(
            "cli-out",
            {"cell": "ticket", "ref": "t", "payload": {"name": "cli"}},
            {"cell": "step", "ref": "s", "payload": {"name": "long"}},
        ),
    )
    assert submitted.returncode == 0, submitted.stderr
    reply = json.loads(submitted.stdout)  # submit --wait --json: the same form
    task_id = reply["task"]["task_id"]
    nodes = {n["node_id"]: n for n in reply["task"]["nodes"]}
    ticket = nodes["t.open"]["output"]
    assert ticket["ticket_id"].startswith("T-") and nodes["s.call"]["output"] == {"blob": long}
    assert reply["task"]["result"] == {"s.call": {"blob": long}, "t.open": ticket}
    assert reply["task"]["outputs_unavailable"] is False

    shown = await dispo(cli_env, "tasks", "show", task_id, "--json")
    assert json.loads(shown.stdout)["task"]["result"] == reply["task"]["result"]
    # watch --json: one line per change, its last the terminal view, outputs as JSON values
    watched = await dispo(cli_env, "tasks", "watch", task_id, "--json")
    last = json.loads(watched.stdout.splitlines()[-1])
    assert last["result"] == reply["task"]["result"]
    assert [n["output"] for n in last["nodes"]] == [n["output"] for n in reply["task"]["nodes"]]
    piped = await dispo(cli_env, "tasks", "show", task_id)
    assert piped.returncode == 0, piped.stderr
    assert ticket["ticket_id"] in piped.stdout and long in piped.stdout
    assert "result" in piped.stdout
    seen = await asyncio.to_thread(
        at_a_terminal, {**cli_env, "COLUMNS": "400"}, "tasks", "show", task_id
    )
    [line] = [line for line in seen.splitlines() if line.startswith("s.call") and "blob" in line]
    assert '{"blob":"' + "x" * 190 in line and long not in line and line.rstrip().endswith("…")
    assert ticket["ticket_id"] in seen


async def test_tasks_are_found_by_idempotency_key_and_counted_by_status(cli_env):
    keyed = json.dumps(
        {"business": "cli-k", "idempotency_key": "cli-key-1", "cells": [{"cell": "noop"}]}
    )
    submitted = await asyncio.gather(
        dispo(cli_env, "submit", "-", "--wait", "--json", stdin=keyed),
        dispo(cli_env, "submit", "-", "--wait", stdin=submission("cli-k", {"cell": "noop"})),
    )
    assert [s.returncode for s in submitted] == [0, 0], [s.stderr for s in submitted]
    task_id = json.loads(submitted[0].stdout)["task"]["task_id"]

    found, table, counted, shown, too_long = await asyncio.gather(
        dispo(cli_env, "tasks", "list", "--idempotency-key", "cli-key-1", "--json"),
        dispo(cli_env, "tasks", "list", "--key", "cli-key-1"),
        dispo(cli_env, "tasks", "count", "--business", "cli-k", "--json"),
        dispo(cli_env, "tasks", "count", "--business", "cli-k", "--key", "cli-key-1"),
        dispo(cli_env, "tasks", "count", "--key", "k" * 129),
    )
    assert [t["task_id"] for t in json.loads(found.stdout)["tasks"]] == [task_id], found.stderr
    assert table.returncode == 0 and task_id in table.stdout
    reply = json.loads(counted.stdout)
    assert reply["total"] == "2"  # int64 in proto JSON is a string
    counts = {c["status"]: int(c["count"]) for c in reply["counts"]}
    assert counts == {
        name: 2 if name == "TASK_STATUS_SUCCEEDED" else 0
        for name in common_pb2.TaskStatus.keys()[1:]
    }
    assert shown.returncode == 0
    assert [line.split() for line in shown.stdout.splitlines()][1:] == [
        ["ACCEPTED", "0"], ["RUNNING", "0"], ["SUCCEEDED", "1"], ["FAILED", "0"],
        ["CANCELLED", "0"], ["RETRY_EXHAUSTED", "0"], ["DEMOTED", "0"], ["total", "1"],
    ]  # fmt: skip
    assert too_long.returncode == 4 and "idempotency_key: longer than 128" in too_long.stderr


async def test_a_delayed_task_is_listed_scheduled_and_cancelled_before_its_start(cli_env):
    """``--delay`` submits a delayed start: the task is listed as scheduled (``--scheduled``,
    and its start in the table and in ``tasks show``) and a cancel ends it before it
    starts; a start beyond the gateway's horizon is refused naming ``not_before``."""
    body = submission("cli-delay", {"cell": "noop"})
    submitted = await dispo(cli_env, "submit", "-", "--delay", "1h", "--json", stdin=body)
    assert submitted.returncode == 0, submitted.stderr
    task_id = json.loads(submitted.stdout)["task_id"]
    listed, table, shown = await asyncio.gather(
        dispo(cli_env, "tasks", "list", "--business", "cli-delay", "--scheduled", "--json"),
        dispo(cli_env, "tasks", "list", "--business", "cli-delay"),
        dispo(cli_env, "tasks", "show", task_id, "--json"),
    )
    [row] = json.loads(listed.stdout)["tasks"]
    assert row["task_id"] == task_id and row["status"] == "TASK_STATUS_ACCEPTED"
    assert "not_before" in row, row
    assert "scheduled" in table.stdout, table.stdout
    assert json.loads(shown.stdout)["task"]["not_before"] == row["not_before"]

    cancelled = await dispo(cli_env, "tasks", "cancel", task_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["task"]["status"] == "TASK_STATUS_CANCELLED"
    after = await dispo(
        cli_env, "tasks", "list", "--business", "cli-delay", "--scheduled", "--json"
    )
    assert json.loads(after.stdout).get("tasks", []) == []

    refused = await dispo(cli_env, "submit", "-", "--delay", "400d", stdin=body)
    assert refused.returncode == 4 and "not_before" in refused.stderr, refused.stderr


async def test_tasks_are_submitted_with_labels_and_listed_and_counted_by_them(cli_env):
    """``labels`` in the file and ``--label`` on submit; ``--label`` (repeatable, all must
    match) on list and count; ``tasks show`` prints them; a bad one is refused naming it."""
    body = json.dumps(
        {"business": "cli-lab", "labels": {"campaign": "c-7"}, "cells": [{"cell": "noop"}]}
    )
    submitted = await asyncio.gather(
        dispo(cli_env, "submit", "-", "--label", "wave=1", "--json", stdin=body),
        dispo(cli_env, "submit", "-", "--json", stdin=body),
        dispo(cli_env, "submit", "-", "--json", stdin=submission("cli-lab", {"cell": "noop"})),
    )
    assert [s.returncode for s in submitted] == [0, 0, 0], [s.stderr for s in submitted]
    first, second, _ = (json.loads(s.stdout)["task_id"] for s in submitted)

    both, campaign, counted, table, shown, bad = await asyncio.gather(
        dispo(cli_env, "tasks", "list", "--label", "campaign=c-7", "--label", "wave=1", "--json"),
        dispo(cli_env, "tasks", "list", "--label", "campaign=c-7", "--json"),
        dispo(cli_env, "tasks", "count", "--label", "campaign=c-7", "--json"),
        dispo(cli_env, "tasks", "list", "--business", "cli-lab"),
        dispo(cli_env, "tasks", "show", first),
        dispo(cli_env, "tasks", "count", "--label", "Campaign=c-7"),
    )
    assert [t["task_id"] for t in json.loads(both.stdout)["tasks"]] == [first], both.stderr
    rows = json.loads(campaign.stdout)["tasks"]
    assert {t["task_id"] for t in rows} == {first, second}
    assert {t["task_id"]: t["labels"] for t in rows}[first] == {"campaign": "c-7", "wave": "1"}
    assert json.loads(counted.stdout)["total"] == "2"
    assert "campaign=c-7, wave=1" in table.stdout and "labels" in table.stdout, table.stdout
    assert "labels campaign=c-7, wave=1" in shown.stdout, shown.stdout
    assert bad.returncode == 4 and "labels.Campaign" in bad.stderr, bad.stderr
    malformed = await dispo(cli_env, "tasks", "list", "--label", "campaign")
    assert malformed.returncode != 0 and "key=value" in malformed.stderr, malformed.stderr


async def test_tasks_are_listed_counted_and_cancelled_by_priority(cli_env):
    """``--priority`` (repeatable: any of them) on tasks list, count and cancel-all, and
    ``--label`` on cancel-all; a priority outside 1..5 is a usage error before any call. The
    tasks start in an hour: they stay ACCEPTED, for the cancel to count."""
    body = submission("cli-pri", {"cell": "noop"})
    submitted = await asyncio.gather(
        *(
            dispo(
                cli_env,
                "submit",
                "-",
                "--priority",
                str(p),
                "--label",
                f"p={p}",
                "--delay",
                "1h",
                "--json",
                stdin=body,
            )
            for p in (1, 2, 5, 5)
        )
    )
    assert [s.returncode for s in submitted] == [0] * 4, [s.stderr for s in submitted]
    first, second, *lowest = (json.loads(s.stdout)["task_id"] for s in submitted)

    urgent, two, counted, dry, bad = await asyncio.gather(
        dispo(cli_env, "tasks", "list", "--business", "cli-pri", "--priority", "1", "--json"),
        dispo(
            cli_env,
            "tasks",
            "list",
            "--business",
            "cli-pri",
            "--priority",
            "1",
            "--priority",
            "2",
            "--json",
        ),
        dispo(cli_env, "tasks", "count", "--business", "cli-pri", "--priority", "5", "--json"),
        dispo(
            cli_env,
            "tasks",
            "cancel-all",
            "--business",
            "cli-pri",
            "--priority",
            "5",
            "--dry-run",
            "--json",
        ),
        dispo(cli_env, "tasks", "list", "--priority", "6"),
    )
    rows = json.loads(urgent.stdout)["tasks"]
    assert [(t["task_id"], t["priority"]) for t in rows] == [(first, 1)], urgent.stderr
    assert {t["task_id"] for t in json.loads(two.stdout)["tasks"]} == {first, second}
    assert json.loads(counted.stdout)["total"] == "2"
    assert int(json.loads(dry.stdout)["matched"]) == len(lowest), dry.stderr
    assert bad.returncode == 2 and "--priority" in bad.stderr, bad.stderr
    by_label = [
        dispo(
            cli_env,
            "tasks",
            "cancel-all",
            "--business",
            "cli-pri",
            "--label",
            f"p={p}",
            "--dry-run",
            "--json",
        )  # fmt: skip
        for p in (5, 1, 3)
    ]
    matched = [int(json.loads(r.stdout).get("matched", 0)) for r in await asyncio.gather(*by_label)]
    assert matched == [2, 1, 0], matched


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


async def test_tasks_signal_ends_a_wait_is_a_no_op_repeated_and_names_a_bad_field(cli_env):
    submitted = json.loads(
        (
            await dispo(
                cli_env,
                "submit",
                "-",
                "--json",
                stdin=submission("cli-w", {"cell": "review", "payload": {"name": "w"}}),
            )
        ).stdout
    )
    task_id = submitted["task_id"]
    mistyped = await dispo(
        cli_env, "tasks", "signal", task_id, "verdict", "--payload", '{"verdict": 1}'
    )
    assert mistyped.returncode == 4 and "payload: not as the wait declares" in mistyped.stderr
    undeclared = await dispo(cli_env, "tasks", "signal", task_id, "approval")
    assert undeclared.returncode == 4 and "signal: no wait node" in undeclared.stderr
    not_json = await dispo(cli_env, "tasks", "signal", task_id, "verdict", "--payload", "{")
    assert not_json.returncode == 2 and "--payload is not JSON" in not_json.stderr

    args = ("tasks", "signal", task_id, "verdict", "--payload", '{"verdict": "approved"}')
    sent = await dispo_json(cli_env, *args, "--signal-id", "cli-1")
    assert sent == {"task_id": task_id, "signal_id": "cli-1", "duplicate": False}
    again = await dispo(cli_env, *args, "--signal-id", "cli-1")
    assert again.returncode == 0 and "duplicate" in again.stdout
    shown = await eventually(
        lambda: dispo_json(cli_env, "tasks", "show", task_id),
        lambda reply: reply["task"]["status"] == "TASK_STATUS_SUCCEEDED",
        wanted="the task SUCCEEDED",
    )
    assert shown["task"]["nodes"][0]["output"] == {"verdict": "approved"}


async def test_a_file_of_requests_is_submitted_by_one_call_all_or_none(cli_env):
    many = json.dumps(
        {
            "requests": [
                {"business": "cli-m", "idempotency_key": "m-1", "cells": [{"cell": "noop"}]},
                {"business": "cli-m", "cells": [{"cell": "noop"}]},
                {"business": "cli-m", "idempotency_key": "m-1", "cells": [{"cell": "noop"}]},
            ]
        }
    )
    bad = json.dumps(
        {"requests": [{"business": "cli-m", "cells": [{"cell": "noop"}]}, {"business": "cli-m"}]}
    )
    invalid = json.dumps(
        {
            "requests": [
                {"business": "cli-m", "cells": [{"cell": "noop"}]},
                {"business": "cli-m", "cells": [{"cell": "delete_everything"}]},
            ]
        }
    )
    accepted, waited, bad_file, refused = await asyncio.gather(
        dispo(cli_env, "submit", "-", "--json", stdin=many),
        dispo(cli_env, "submit", "-", "--wait", stdin=many),
        dispo(cli_env, "submit", "-", stdin=bad),
        dispo(cli_env, "submit", "-", stdin=invalid),
    )
    assert accepted.returncode == 0, accepted.stderr
    responses = json.loads(accepted.stdout)["responses"]
    assert responses[2]["task_id"] == responses[0]["task_id"] and responses[2]["duplicate"]
    assert waited.returncode == 0, waited.stderr
    assert waited.stdout.count("SUCCEEDED") == 3 and responses[0]["task_id"] in waited.stdout
    assert bad_file.returncode == 2 and "requests[1]: cells must be a list" in bad_file.stderr
    assert refused.returncode == 4 and "requests[1].cells[0].cell" in refused.stderr
    counted = await dispo(cli_env, "tasks", "count", "--business", "cli-m", "--json")
    # m-1 once, and the keyless task of each of the two calls that were accepted.
    assert int(json.loads(counted.stdout)["total"]) == 3


async def test_catalogue_export_then_apply_shows_the_difference_first_and_dry_run_records_nothing(
    cli_env, tmp_path
):
    exported = await dispo(cli_env, "catalogue", "export")
    assert exported.returncode == 0, exported.stderr
    document = yaml.safe_load(exported.stdout)
    assert "ticket" in document["cells"]
    before = int((await dispo_json(cli_env, "catalogue", "show"))["catalogue"]["version"])
    document["cells"]["greet_cli"] = {
        "fields": {"name": "string"},
        "actions": {"hello": {"kind": "http", "downstream": "demo", "path": "/hi"}},
    }
    changed = tmp_path / "catalogue.yaml"
    changed.write_text(yaml.safe_dump(document))

    tried = await dispo(cli_env, "catalogue", "apply", str(changed), "--dry-run")
    assert tried.returncode == 0, tried.stderr
    assert "+  greet_cli:" in tried.stdout and f"--- version {before}" in tried.stdout
    assert (await dispo_json(cli_env, "catalogue", "show"))["catalogue"]["version"] == str(before)

    document["cells"]["greet_cli"]["actions"]["hello"]["kind"] = "carrier-pigeon"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(document))
    refused = await dispo(cli_env, "catalogue", "apply", str(broken))
    assert refused.returncode == 4 and "cells.greet_cli.actions.hello.kind" in refused.stderr
    assert (await dispo_json(cli_env, "catalogue", "show"))["catalogue"]["version"] == str(before)

    applied = await dispo_json(cli_env, "catalogue", "apply", str(changed))
    assert applied["catalogue"]["version"] == str(before + 1)  # int64 as JSON: a string
    assert (
        "greet_cli" in yaml.safe_load((await dispo(cli_env, "catalogue", "export")).stdout)["cells"]
    )
    shown = await dispo_json(cli_env, "catalogue", "diff", str(before))
    assert "+  greet_cli:" in shown["diff"]
    again = await dispo(cli_env, "catalogue", "apply", str(changed))
    assert again.returncode == 0 and "no difference" in again.stdout


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


@functools.cache
def dispo_command() -> Any:
    """The ``dispo`` command, built once from its app."""
    return typer.main.get_command(app)


def in_process(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``dispo argv`` run in this process (for what needs no stack): exit code, out, err."""
    with pytest.raises(SystemExit) as end:
        dispo_command().main(args=list(argv), prog_name="dispo")
    printed = capsys.readouterr()
    return int(end.value.code or 0), printed.out, printed.err


def test_bench_help_is_its_own_and_a_benchmarks_options_go_to_the_benchmark(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # a benchmark parses sys.argv
    code, own, _ = in_process(capsys, "bench", "--help")
    assert code == 0 and own.startswith("Usage: dispo bench") and "submit|pool|faults" in own
    code, theirs, _ = in_process(capsys, "bench", "pool", "--help")  # its own parser's help
    assert code == 0 and theirs.startswith("usage: dispo bench pool") and "--crons" in theirs
    code, _, why = in_process(capsys, "bench", "poetry")
    assert code == 2 and "'poetry' is not one of" in why


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Each leaf command of ``dispo``, as the words that name it."""
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield path
        return
    for name, sub in subcommands.items():
        yield from commands(sub, (*path, name))


# The commands that call no stack's RPC, or run as a process until stopped (a worker), so
# have no reply to print as JSON.
NO_REPLY = {("up",), ("down",), ("bench",), ("worker", "run")}


def test_every_command_has_help_with_only_its_own_options_and_json_for_a_reply(capsys):
    every = list(commands(dispo_command()))
    assert ("pool", "evaluations", "pause") in every and len(every) > 30
    for words in every:
        code, shown, why = in_process(capsys, *words, "--help")
        assert code == 0 and shown.startswith(f"Usage: dispo {' '.join(words)} "), (words, why)
        options = [line.split()[0] for line in shown.splitlines() if line.startswith("  -")]
        assert not [o for o in options if o.startswith("---")], (words, options)  # internal
        assert ("--json" in options) == (words not in NO_REPLY), (words, options)


def test_resolve_without_a_reason_is_usage_before_any_call(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("DISPO_DATA_DIR", str(tmp_path))  # no stack: a call would exit 3
    monkeypatch.setenv("DISPO_RECONCILER_PORT", str(free_port()))
    code, _, why = in_process(capsys, "failed", "resolve", "t-1", "n-1", "--done")
    assert code == 2 and "--reason" in why
    code, _, why = in_process(capsys, "failed", "resolve", "t-1", "n-1", "--done", "--reason", "x")
    assert code == 3, why  # with a reason it is sent (and nothing answers)


def test_a_progress_bar_counts_its_steps_at_a_terminal_and_draws_nothing_in_a_pipe():
    terminal, pipe = io.StringIO(), io.StringIO()
    for stream, is_terminal in ((terminal, True), (pipe, False)):
        drawn_on = Console(file=stream, force_terminal=is_terminal, width=80)
        with progress_bar(3, "resuming", console=drawn_on) as advance:
            for _ in range(3):
                advance()
    assert "resuming" in terminal.getvalue() and "3/3" in terminal.getvalue()
    assert pipe.getvalue().strip() == ""  # no bar, no count


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
        "from dispo.tools.cli.main import main\n"
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
    assert codes == [0, 3, 3, 3, 3]  # each ran: ok, then unreachable (3), status included
    assert imported == []


# ---- the operators' commands, against the reconciler, the pool and the intelligence service


async def dispo_json(env: dict[str, str], *args: str, stdin: str = "") -> Any:
    """The ``--json`` reply of a command that must succeed."""
    done = await dispo(env, *args, "--json", stdin=stdin)
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


async def test_failed_work_is_listed_shown_resumed_and_refused_with_the_codes(
    operators_env, downstream
):
    env = operators_env
    await downstream.control(fail={"path": "/step/refused", "status": 400, "times": 1})
    ended = await dispo(
        env,
        "submit", "-", "--wait", "--json",
        stdin=submission("cli-failed", {"cell": "step", "payload": {"name": "refused"}}),
    )  # fmt: skip
    assert ended.returncode == 1, ended.stderr  # it ended FAILED
    task_id = json.loads(ended.stdout)["task"]["task_id"]

    page = await eventually(
        lambda: dispo_json(env, "failed", "list", "--business", "cli-failed"),
        lambda page: page["work"],
        wanted="the failed task held by the reconciler",
    )
    assert set(page) == {"work", "page"}
    [work] = page["work"]
    assert (work["task"]["task_id"], work["kind"]) == (task_id, "WORK_KIND_FAILED")
    assert work["task"]["state"] == "RECOVERY_STATE_FAILED"
    # piped, the table is neither folded nor cut: the id and the whole reason (longer than
    # 80 characters, the downstream's answer in it) on one line, as docs/cli.md says
    reason = work["task"]["reason"]
    assert len(reason) > 80 and reason.endswith('{"error": "injected"}'), reason
    listed = await dispo(env, "failed", "list", "--business", "cli-failed")
    assert listed.returncode == 0, listed.stderr
    [line] = [line for line in listed.stdout.splitlines() if task_id in line]
    assert "FAILED" in line and reason in line, listed.stdout
    # at a terminal (wide enough not to fold it) the row shows the reason's beginning
    seen = await asyncio.to_thread(
        at_a_terminal, {**env, "COLUMNS": "400"}, "failed", "list", "--business", "cli-failed"
    )
    [line] = [line for line in seen.splitlines() if task_id in line]
    assert reason[:79] + "…" in line and reason not in line, seen
    shown = await dispo(env, "failed", "show", task_id)
    assert shown.returncode == 0 and task_id in shown.stdout
    assert "RECOVERY_STATE_FAILED" in shown.stdout and "cli-failed" in shown.stdout

    # usage (2) and a refusal (4), each saying why
    neither, undecided, not_unknown = await asyncio.gather(
        dispo(env, "failed", "resume"),
        dispo(env, "failed", "resolve", task_id, "step.call"),
        dispo(env, "failed", "resolve", task_id, "step.call", "--done", "--reason", "seen"),
    )
    assert neither.returncode == 2 and "--all" in neither.stderr
    assert undecided.returncode == 2 and "--done or --retry" in undecided.stderr
    assert not_unknown.returncode == 4, not_unknown.stderr

    # resumed, the call answers this time: the task succeeds, and is no longer the
    # reconciler's to abandon
    resumed = await dispo_json(env, "failed", "resume", task_id, "--reason", "fixed")
    [item] = resumed["items"]
    assert (item["task"]["task_id"], item["task"]["state"]) == (task_id, "RECOVERY_STATE_REDRIVEN")
    await eventually(
        lambda: dispo_json(env, "failed", "show", task_id),
        lambda held: held["task"]["state"] == "RECOVERY_STATE_RESOLVED",
        wanted="the resumed task resolved",
    )
    abandoned = await dispo(env, "failed", "abandon", task_id)
    assert abandoned.returncode == 4 and "FAILED_PRECONDITION" in abandoned.stderr


async def test_downstreams_are_listed_paused_and_resumed(operators_env):
    env = operators_env
    listed = await dispo_json(env, "downstreams", "list")
    assert {d["name"] for d in listed["downstreams"]} >= {"demo", "narrow"}
    paused = await dispo_json(env, "downstreams", "pause", "narrow", "--reason", "maintenance")
    assert (paused["downstream"]["name"], paused["downstream"]["paused"]) == ("narrow", True)
    table = await dispo(env, "downstreams", "list")
    [line] = [line for line in table.stdout.splitlines() if line.startswith("narrow")]
    assert "paused: maintenance" in line, table.stdout
    resumed = await dispo_json(env, "downstreams", "resume", "narrow")
    assert resumed["downstream"]["paused"] is False
    unknown = await dispo(env, "downstreams", "pause", "nowhere")
    assert unknown.returncode == 4, unknown.stderr


def evaluation(evaluation_id: str, target_url: str) -> str:
    return json.dumps(
        {
            "evaluation_id": evaluation_id,
            "series": "cli-bot",
            "line": "LINE_FORMAL",
            "period": "2026-12",
            "target_url": target_url,
            "window_seconds": 60,
            "slot_count": 1,
            "runs_per_slot": 1,
            "cases": [
                {
                    "id": "health",
                    "path": "/healthz",
                    "rules": [{"kind": "RULE_KIND_STATUS", "value": "200"}],
                }
            ],
        }
    )


async def test_pool_and_jobs_commands_show_and_change_the_pool(operators_env, downstream):
    env = operators_env
    bounds = await dispo_json(env, "pool", "bounds", "6", "9")
    assert (bounds["min_size"], bounds["max_size"]) == (6, 9)
    backwards = await dispo(env, "pool", "bounds", "9", "3")
    assert backwards.returncode == 4 and "INVALID_ARGUMENT" in backwards.stderr

    created = await dispo_json(
        env, "pool", "evaluations", "create", "-", stdin=evaluation("cli-eval-1", downstream.url)
    )
    assert created["id"] == "cli-eval-1" and created["status"] == "EVALUATION_STATUS_QUEUED"
    boosted = await dispo_json(env, "pool", "boost", "cli-eval-1", "7")
    assert boosted["priority_boost"] == 7
    queue = await dispo_json(env, "pool", "queue")
    assert [(i["evaluation_id"], i["priority_boost"]) for i in queue["items"]] == [
        ("cli-eval-1", 7)
    ]
    drawn = await dispo(env, "pool", "queue")
    [line] = [line for line in drawn.stdout.splitlines() if "cli-eval-1" in line]
    assert "QUEUED" in line and " 7 " in f"{line} "
    shown = await dispo(env, "pool", "evaluations", "show", "cli-eval-1")
    assert shown.returncode == 0 and "cli-bot" in shown.stdout
    missing = await dispo(env, "pool", "evaluations", "show", "no-such-evaluation")
    assert missing.returncode == 4 and "NOT_FOUND" in missing.stderr

    jobs = await dispo_json(env, "jobs", "list")
    assert set(jobs) >= {"jobs", "page"}
    no_job, bad_kind = await asyncio.gather(
        dispo(env, "jobs", "show", "no-such-evaluation"),
        dispo(env, "jobs", "list", "--kind", "poetry"),
    )
    assert no_job.returncode == 4 and "NOT_FOUND" in no_job.stderr
    assert bad_kind.returncode == 2 and "analysis, comparison" in bad_kind.stderr


async def test_quarantine_commands_list_show_and_discard_a_message(operators_env, infra):
    env = operators_env
    bus = await Bus.connect([infra.nats_url], name="test", credentials=infra.nats_credentials())
    try:
        await bus.publish(tasks.TASK_CREATE, b"\xff\x00garbage", msg_id="cli-garbage")
    finally:
        await bus.close()
    listed = await eventually(
        lambda: dispo_json(env, "quarantine", "list", "--service", "executor"),
        lambda page: page["messages"],
        wanted="the garbage quarantined by the executor",
    )
    [message] = listed["messages"]
    assert message["subject"] == tasks.TASK_CREATE and listed["total"] == "1"  # an int64
    drawn = await dispo(env, "quarantine", "list")  # the executor's by default
    assert "1 in quarantine" in drawn.stdout and tasks.TASK_CREATE in drawn.stdout
    shown = await dispo_json(env, "quarantine", "show", str(message["id"]))
    assert (shown["id"], shown["subject"]) == (message["id"], tasks.TASK_CREATE)
    discarded = await dispo_json(env, "quarantine", "discard", str(message["id"]))
    assert discarded["message"]["id"] == message["id"]
    gone, bad_service = await asyncio.gather(
        dispo(env, "quarantine", "show", str(message["id"])),
        dispo(env, "quarantine", "list", "--service", "nowhere"),
    )
    assert gone.returncode == 4 and "NOT_FOUND" in gone.stderr
    assert bad_service.returncode == 2


async def test_downstreams_limits_shows_each_limit_and_what_the_executors_hold(cli_env):
    """``dispo downstreams limits``: the executor's ListDownstreams, each downstream's limits
    across the cluster with what every executor holds of them (ADR-0108)."""
    reply = await eventually(
        lambda: dispo_json(cli_env, "downstreams", "limits"),
        lambda r: any(d.get("slots_share") for d in r["downstreams"]),
        wanted="a share held by the executor",
    )
    demo = {d["name"]: d for d in reply["downstreams"]}["demo"]
    assert demo["max_concurrency"] == demo["slots_share"] == demo["cluster_slots"] > 0
    shown = await dispo(cli_env, "downstreams", "limits")
    assert shown.returncode == 0, shown.stderr
    assert "demo" in shown.stdout and "max at once" in shown.stdout
