"""The OpenClaw driver: shells out to the ``openclaw`` CLI.

openclaw automations create <id> --every <seconds>s --state <json>
openclaw automations remove <id>
openclaw automations list --json          -> [{"id": ..., "state": {...}}, ...]
openclaw automations state set <id> <json>
openclaw automations run <id>
"""

from __future__ import annotations

import asyncio
import json

from dispo.pool.domain import DriverCron
from dispo.pool.drivers.base import DriverError, encode_state

NOT_FOUND_EXIT = 3
EXISTS_EXIT = 4


class OpenClawDriver:
    name = "openclaw"

    def __init__(self, executable: str, tick_seconds: float, timeout: float = 30.0) -> None:
        self.executable = executable
        self.tick_seconds = tick_seconds
        self.timeout = timeout

    async def _run(self, *args: str, ok_codes: tuple[int, ...] = (0,)) -> str:
        try:
            process = await asyncio.create_subprocess_exec(
                self.executable,
                "automations",
                *args,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as error:
            raise DriverError(f"cannot run {self.executable}: {error}") from None
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise DriverError(f"openclaw automations {args[0]} timed out") from None
        if process.returncode not in ok_codes:
            raise DriverError(
                f"openclaw automations {args[0]} exited {process.returncode}: {err.decode()[:300]}"
            )
        return out.decode()

    async def create(self, cron_id: str, state: dict) -> None:
        await self._run(
            "create",
            cron_id,
            "--every",
            f"{int(self.tick_seconds)}s",
            "--state",
            encode_state(state),
            ok_codes=(0, EXISTS_EXIT),
        )

    async def remove(self, cron_id: str) -> None:
        await self._run("remove", cron_id, ok_codes=(0, NOT_FOUND_EXIT))

    async def list(self) -> list[DriverCron]:
        out = await self._run("list", "--json")
        try:
            return [DriverCron(item["id"], item.get("state") or {}) for item in json.loads(out)]
        except (ValueError, KeyError, TypeError) as error:
            raise DriverError(f"unreadable openclaw list output: {error}") from None

    async def write_state(self, cron_id: str, state: dict) -> None:
        await self._run("state", "set", cron_id, encode_state(state))

    async def trigger(self, cron_id: str) -> None:
        await self._run("run", cron_id)
