"""The openclaw driver against a real OpenClaw gateway (installed on demand, one per session):
automations created idempotently, their scratch written with compare-and-set (a lost race
asks the database again), a disabled automation seen as missing and enabled again."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from dispo.libs.stack.openclaw import OpenClawGateway
from dispo.pool.drivers.openclaw import OpenClawCli, OpenClawDriver

# A CLI call starts a Node process loading a large bundle: seconds each on a busy machine.
SLOW = 600.0
pytestmark = [pytest.mark.timeout(1500), pytest.mark.long_file]

IDLE = {"status": "idle", "eval_id": ""}


def cli_for(gateway: OpenClawGateway) -> OpenClawCli:
    return OpenClawCli(
        gateway.install.argv(),
        ["--port", str(gateway.port), "--token", gateway.token],
        gateway.install.env(gateway.home),
        timeout=SLOW,
    )


class CountingCli(OpenClawCli):
    """The real CLI, each call kept in ``calls`` as its first two words (and ``--set``)."""

    def __init__(self, cli: OpenClawCli) -> None:
        super().__init__(cli.argv, cli.connection, cli.env, cli.timeout)
        self.calls: list[str] = []

    async def __call__(self, *args: str) -> dict[str, Any]:
        self.calls.append(" ".join([*args[:2], *(["--set"] if "--set" in args else [])]))
        return await super().__call__(*args)


def namespace() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


async def automations(cli: OpenClawCli, space: str) -> dict[str, dict]:
    """This namespace's automations, disabled ones too, by cron id."""
    prefix = f"dispo-pool:{space}:"
    listed = await cli("cron", "list", "--all", "--json")
    return {
        job["declarationKey"].removeprefix(prefix): job
        for job in listed["jobs"]
        if (job.get("declarationKey") or "").startswith(prefix)
    }


async def test_driver_keeps_one_automation_per_cron_and_its_state_in_the_scratch(
    openclaw_gateway,
):
    cli = cli_for(openclaw_gateway)
    space = namespace()
    database = {"cron-a": {"status": "idle", "eval_id": ""}}
    asked: list[str] = []

    async def state_of(cron_id: str) -> dict | None:
        asked.append(cron_id)
        return database.get(cron_id)

    counted = CountingCli(cli)
    driver = OpenClawDriver(
        counted, namespace=space, tick_seconds=3600, command=lambda c: "true", state_of=state_of
    )
    await driver.create("cron-a", IDLE)
    # A new automation's scratch is empty: written at once, not read first.
    assert counted.calls == ["cron add", "cron scratch --set"]
    await driver.create("cron-a", IDLE)  # the same declaration key: the same automation
    [job] = (await automations(cli, space)).values()
    assert job["enabled"] and job["schedule"] == {**job["schedule"], "everyMs": 3_600_000}
    assert [(c.id, c.state) for c in await driver.list()] == [("cron-a", IDLE)]

    # Someone else writes the scratch: the driver's compare-and-set loses, asks the
    # database again and writes what the database says now.
    await cli("cron", "scratch", job["id"], "--set", '{"status":"busy","eval_id":"other"}')
    database["cron-a"] = {"status": "busy", "eval_id": "ev-1"}
    await driver.write_state("cron-a", {"status": "busy", "eval_id": "stale"})
    await driver.drain()
    assert asked == ["cron-a"]
    scratch = await cli("cron", "scratch", job["id"], "--json")
    assert json.loads(scratch["scratch"]["content"]) == {"status": "busy", "eval_id": "ev-1"}
    assert scratch["scratch"]["revision"] == 3  # create, the other writer, the retry

    # A driver that knows no job ids yet (a restarted pool): a state write and a wake-up of
    # the same cron at once look the job up with one listing.
    restarted = CountingCli(cli)
    fresh = OpenClawDriver(restarted, namespace=space, tick_seconds=3600, command=lambda c: "true")
    await fresh.write_state("cron-a", database["cron-a"])
    await fresh.trigger("cron-a")
    await fresh.drain()
    assert sorted(restarted.calls) == ["cron list", "cron run", "cron scratch"]

    # Disabled behind the pool's back: not a live cron any more; creating it enables it.
    await cli("cron", "disable", job["id"])
    assert await driver.list() == []
    await driver.create("cron-a", database["cron-a"])
    [again] = (await automations(cli, space)).values()
    assert again["id"] == job["id"] and again["enabled"]

    await driver.remove("cron-a")
    await driver.remove("cron-a")  # absent: not an error
    assert await automations(cli, space) == {}
