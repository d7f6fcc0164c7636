"""The OpenClaw driver: each cron is one OpenClaw automation, driven through the
``openclaw cron`` CLI (ADR-0032).

- create: ``cron add --declaration-key dispo-pool:<namespace>:<cron> --every <tick>s
  --command <wake>`` — or, agent payload, ``--message <prompt> --model <provider/model>
  --tools exec``, a turn of the OpenClaw agent asked to run the same command — (an upsert: a second add with the same key updates the same automation;
  a disabled one is enabled again), then the cron state into the automation's scratch.
- remove: ``cron rm <job>``; an absent automation is not an error.
- list: ``cron list --all --json``, this pool's automations by their declaration key, each
  with its scratch (``cron scratch <job> --json``); a disabled automation is not a live cron,
  so the drift check sees it missing and its repair enables it again.
- state: the scratch holds ``{"status", "eval_id"}``, written with ``--expected-revision``;
  a lost race re-reads the cron in the pool's database and decides again.
- trigger: ``cron run <job>``.

State writes and wake-ups run in the background (one writer per cron, the newest state
wins), so the cron protocol never waits for a CLI call; :meth:`OpenClawDriver.drain` waits
for them. Every call is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from dispo.libs.logging import get_logger
from dispo.pool.domain import DriverCron
from dispo.pool.drivers.base import DriverError, encode_state

log = get_logger(__name__)

KEY_PREFIX = "dispo-pool"
# Scratch reads of a listing in flight at once.
LIST_CONCURRENCY = 4
# Compare-and-set attempts of one state write before it is left to the drift check.
WRITE_ATTEMPTS = 4
# How long OpenClaw lets one wake command run.
COMMAND_TIMEOUT_SECONDS = 300


class NotFoundError(DriverError):
    """OpenClaw has no such automation."""


class StateConflict(DriverError):
    """The scratch changed since the revision the write expected."""


class OpenClawCli:
    """Runs ``<argv> <args> <connection>`` and parses its JSON answer."""

    def __init__(
        self,
        argv: Sequence[str],
        connection: Sequence[str],
        env: dict[str, str],
        timeout: float,
    ) -> None:
        self.argv = list(argv)
        self.connection = list(connection)
        self.env = env
        self.timeout = timeout

    async def __call__(self, *args: str, connect: bool = True) -> dict[str, Any]:
        """``connect=False``: a local command (``config set``) takes no gateway address."""
        what = " ".join(args[:2])
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv,
                *args,
                *(self.connection if connect else []),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, **self.env},
            )
        except OSError as error:
            raise DriverError(f"cannot run {self.argv[0]}: {error}") from None
        try:
            out, err = await asyncio.wait_for(process.communicate(), self.timeout)
        except TimeoutError:
            await _end(process)
            raise DriverError(f"openclaw {what} took over {self.timeout:.0f} s") from None
        except asyncio.CancelledError:  # abandoned (a deadline of the caller): no process left
            await asyncio.shield(_end(process))
            raise
        try:
            answer = json.loads(out) if out.strip() else {}
        except ValueError:
            answer = {}
        if process.returncode != 0 or (isinstance(answer, dict) and answer.get("ok") is False):
            message = ""
            if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
                message = str(answer["error"].get("message", ""))
            message = message or (err or out).decode(errors="replace").strip()[-500:]
            if "not found" in message.lower():
                raise NotFoundError(f"openclaw {what}: {message}")
            if "changed concurrently" in message:
                raise StateConflict(f"openclaw {what}: {message}")
            raise DriverError(f"openclaw {what} exited {process.returncode}: {message}")
        if not isinstance(answer, dict):
            raise DriverError(f"openclaw {what}: unreadable answer {out[:200]!r}")
        return answer


async def _end(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    await process.wait()


def wake_command(pool_address: str, token_file: Path | None = None) -> Callable[[str], str]:
    """The command payload of a cron's automation: this Python running the pool's wake
    entry point (``dispo-pool-wake``) against ``pool_address``, with the pool's own token
    read from ``token_file`` (owner-only; the command names the file, never the secret)."""
    token = ["--token-file", str(token_file)] if token_file is not None else []

    def command(cron_id: str) -> str:
        return shlex.join(
            [
                sys.executable,
                *("-m", "dispo.pool.wake", "--cron", cron_id, "--pool", pool_address),
                *token,
            ]
        )

    return command


# The provider id the pool registers its model under in the gateway's configuration.
PROVIDER = "dispo-pool"


def agent_message(cron_id: str, command: str) -> str:
    """The agent payload's prompt: plan the cron's next step by running its wake command."""
    return (
        f"You are the planner of cron {cron_id} of a Dispo evaluation pool. Plan the next step"
        f" of the evaluation this cron holds or takes: run exactly this command, once, with the"
        f" exec tool: `{command}`. It takes or continues the evaluation through the pool's gRPC"
        " API and prints what it did as one JSON line. Reply with that line only."
    )


def provider_config(base_url: str, model: str, api_key: str) -> str:
    """``models.providers.dispo-pool`` of the gateway's configuration: an OpenAI-compatible
    endpoint serving ``model``."""
    return json.dumps(
        {
            "baseUrl": base_url,
            "apiKey": api_key,
            "api": "openai-completions",
            "models": [{"id": model, "name": model, "input": ["text"]}],
        }
    )


class OpenClawDriver:
    name = "openclaw"

    def __init__(
        self,
        cli: OpenClawCli,
        *,
        namespace: str,
        tick_seconds: float,
        command: Callable[[str], str],
        state_of: Callable[[str], Awaitable[dict | None]] | None = None,
        agent_model: str = "",
        agent_provider: str = "",
    ) -> None:
        self.cli = cli
        self.prefix = f"{KEY_PREFIX}:{namespace}:"
        self.tick_seconds = tick_seconds
        self.command = command
        # Agent payload: the model (``<provider>/<model>``) whose turn runs the command; "":
        # the command payload.
        self.agent_model = agent_model
        # Its provider entry (JSON), written into the gateway's configuration before the
        # first automation is added.
        self.agent_provider = agent_provider
        self._configured: asyncio.Future[dict[str, Any]] | None = None
        # The cron's state in the pool's database now (None: the cron is gone), read again
        # after a lost compare-and-set; set by the pool service.
        self.state_of = state_of
        self._jobs: dict[str, str] = {}  # cron id -> OpenClaw job id
        # cron id -> (revision, content) of its scratch as last read or written here
        self._scratch: dict[str, tuple[int, str]] = {}
        self._pending: dict[str, dict] = {}  # cron id -> state to write
        self._writers: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        # The `cron list` in flight for crons whose job id is not known here yet (after a
        # restart every cron's first write or wake-up asks at once): one call serves them.
        self._listing: asyncio.Future[dict[str, dict]] | None = None

    def key(self, cron_id: str) -> str:
        return self.prefix + cron_id

    # --- the driver port ---------------------------------------------------------------

    async def create(self, cron_id: str, state: dict) -> None:
        if self.agent_provider:
            await self._configure()
        answer = await self.cli(
            "cron", "add",
            "--name", cron_id,
            "--description", "a cron of the Dispo pool; its scratch is the pool's state",
            "--declaration-key", self.key(cron_id),
            "--every", f"{max(1, int(self.tick_seconds))}s",
            *self._payload(cron_id),
            "--timeout-seconds", str(COMMAND_TIMEOUT_SECONDS),
            "--no-deliver",
        )  # fmt: skip
        job = answer.get("job") or {}
        if not job.get("id"):
            raise DriverError(f"openclaw cron add answered no job: {answer}")
        self._jobs[cron_id] = job["id"]
        if answer.get("created") is True:  # a new automation: its scratch is known empty
            self._scratch[cron_id] = (0, "")
        if job.get("enabled") is False:
            await self.cli("cron", "enable", job["id"])
        await self._write(cron_id, state)

    async def remove(self, cron_id: str) -> None:
        job = await self._job(cron_id)
        if job is None:
            return
        with contextlib.suppress(NotFoundError):
            await self.cli("cron", "rm", job)
        self._jobs.pop(cron_id, None)
        self._scratch.pop(cron_id, None)

    async def list(self) -> list[DriverCron]:
        jobs = await self._jobs_listed()
        live = {cron: job["id"] for cron, job in jobs.items() if job.get("enabled", True)}
        gate = asyncio.Semaphore(LIST_CONCURRENCY)

        async def state(cron_id: str) -> DriverCron | None:
            async with gate:
                return await self._cron(cron_id, live[cron_id])

        found = await asyncio.gather(*(state(c) for c in sorted(live)))
        return [c for c in found if c is not None]

    async def find(self, cron_id: str) -> DriverCron | None:
        """One cron as :meth:`list` would have it: one listing and one scratch read."""
        job = (await self._jobs_listed()).get(cron_id)
        if job is None or not job.get("enabled", True):
            return None
        return await self._cron(cron_id, job["id"])

    async def write_state(self, cron_id: str, state: dict) -> None:
        """Queued for this cron's writer (the newest state wins); returns at once."""
        encode_state(state)  # refuse an oversized state here, not in the background
        self._pending[cron_id] = state
        if cron_id not in self._writers:
            task = asyncio.create_task(self._writer(cron_id), name=f"openclaw state {cron_id}")
            self._writers[cron_id] = task

    async def trigger(self, cron_id: str) -> None:
        """``cron run`` in the background; returns at once."""
        task = asyncio.create_task(self._run(cron_id), name=f"openclaw run {cron_id}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Until every state write and wake-up asked for so far is done."""
        while self._writers or self._background:
            await asyncio.gather(*self._writers.values(), *self._background, return_exceptions=True)

    # --- parts -------------------------------------------------------------------------

    async def _configure(self) -> None:
        """Once (again after a failure): the agent's model as the gateway's provider
        ``dispo-pool``, a local ``config set`` under the CLI's HOME — the gateway watches
        that file and applies a change to ``models`` without a restart."""
        if self._configured is None or (
            self._configured.done() and self._configured.exception() is not None
        ):
            self._configured = asyncio.ensure_future(
                self.cli(
                    "config",
                    "set",
                    f"models.providers.{PROVIDER}",
                    self.agent_provider,
                    "--strict-json",
                    "--merge",
                    connect=False,
                )  # fmt: skip
            )
        await asyncio.shield(self._configured)

    def _payload(self, cron_id: str) -> tuple[str, ...]:
        if not self.agent_model:
            return ("--command", self.command(cron_id))
        return (
            "--message", agent_message(cron_id, self.command(cron_id)),
            "--model", self.agent_model,
            "--tools", "exec",
        )  # fmt: skip

    async def _jobs_listed(self) -> dict[str, dict]:
        answer = await self.cli("cron", "list", "--all", "--json")
        jobs = {}
        for job in answer.get("jobs") or []:
            key = job.get("declarationKey") or ""
            if key.startswith(self.prefix) and job.get("id"):
                jobs[key.removeprefix(self.prefix)] = job
        self._jobs.update({cron: job["id"] for cron, job in jobs.items()})
        return jobs

    async def _job(self, cron_id: str) -> str | None:
        if cron_id in self._jobs:
            return self._jobs[cron_id]
        if self._listing is not None:  # join the listing in flight
            await asyncio.shield(self._listing)
            if cron_id in self._jobs:
                return self._jobs[cron_id]
        # A listing of our own: the one joined may have begun before this job existed.
        listing = self._listing = asyncio.ensure_future(self._jobs_listed())
        try:
            await asyncio.shield(listing)
        finally:
            if self._listing is listing:
                self._listing = None
        return self._jobs.get(cron_id)

    async def _cron(self, cron_id: str, job: str) -> DriverCron | None:
        """The cron with the state its scratch holds (None: the job is gone)."""
        try:
            revision, content = await self._read(cron_id, job)
        except NotFoundError:  # removed meanwhile
            return None
        self._scratch[cron_id] = (revision, content)
        try:
            parsed = json.loads(content) if content else {}
        except ValueError:
            parsed = {"unreadable": content[:100]}
        return DriverCron(cron_id, parsed if isinstance(parsed, dict) else {})

    async def _read(self, cron_id: str, job: str) -> tuple[int, str]:
        """The scratch's (revision, content); revision 0 and "" when it has none."""
        answer = await self.cli("cron", "scratch", job, "--json")
        scratch = answer.get("scratch") or {}
        revision = scratch.get("revision", answer.get("currentRevision", 0)) or 0
        return int(revision), str(scratch.get("content") or "")

    async def _writer(self, cron_id: str) -> None:
        try:
            while cron_id in self._pending:
                state = self._pending.pop(cron_id)
                try:
                    await self._write(cron_id, state)
                except Exception as error:  # the drift check rewrites it
                    log.warning("openclaw state write failed", cron_id=cron_id, error=str(error))
        finally:
            self._writers.pop(cron_id, None)

    async def _write(self, cron_id: str, state: dict) -> None:
        """Compare-and-set the scratch; a lost race reads the pool's state again. A state
        the scratch already holds (as last seen here) is not written again."""
        for _ in range(WRITE_ATTEMPTS):
            job = await self._job(cron_id)
            if job is None:
                raise NotFoundError(f"openclaw has no automation for cron {cron_id}")
            raw = encode_state(state)
            if cron_id not in self._scratch:
                self._scratch[cron_id] = await self._read(cron_id, job)
            revision, content = self._scratch[cron_id]
            if content == raw:
                return
            try:
                answer = await self.cli(
                    "cron", "scratch", job, "--set", raw, "--expected-revision", str(revision)
                )
            except StateConflict:
                self._scratch.pop(cron_id, None)
                if self.state_of is not None:
                    fresh = await self.state_of(cron_id)
                    if fresh is None:
                        return  # the cron is gone from the pool
                    state = fresh
                continue
            except NotFoundError:
                self._jobs.pop(cron_id, None)
                self._scratch.pop(cron_id, None)
                raise
            written = (answer.get("scratch") or {}).get("revision")
            if isinstance(written, int):
                self._scratch[cron_id] = (written, raw)
            else:
                self._scratch.pop(cron_id, None)
            return
        raise DriverError(f"cron {cron_id}: scratch kept changing ({WRITE_ATTEMPTS} attempts)")

    async def _run(self, cron_id: str) -> None:
        try:
            job = await self._job(cron_id)
            if job is None:
                raise NotFoundError(f"openclaw has no automation for cron {cron_id}")
            await self.cli("cron", "run", job)
        except Exception as error:
            log.warning("openclaw wake-up failed", cron_id=cron_id, error=str(error))
