"""One child process: started from a spec with its output appended to a log, ready once its
health answers (a process that exits first fails the wait at once), stopped gracefully
(SIGTERM, then SIGKILL after a grace) or killed outright.

The stack's :class:`~dispo.tools.stack.supervisor.Supervisor` runs its children with it, and
the tests start their service processes with it, so both start, wait for and stop a process
the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from dispo.libs.health import wait_until_serving
from dispo.libs.logging import get_logger
from dispo.libs.private_files import PRIVATE_FOLDER, open_private
from dispo.libs.settings import TLSSettings

log = get_logger(__name__)


@dataclass
class ProcessSpec:
    name: str
    argv: list[str]
    # Added to this process's own environment.
    env: dict[str, str]
    # Where its gRPC health answers; None for a process without gRPC.
    address: str | None
    log_path: Path
    # An HTTP URL answering 200 once a process without gRPC is ready (None: ready when started).
    http_health: str | None = None
    # In a session of its own, so a Ctrl-C meant for the parent does not reach it directly.
    new_session: bool = False
    # Awaited with the timeout until a process with neither gRPC nor HTTP health is ready
    # (None: ready when started).
    ready: Callable[[float], Awaitable[None]] | None = None
    # Asks it to stop gracefully.
    stop_signal: int = signal.SIGTERM
    # Sent to it by the kernel when the thread that spawned it ends, the parent process
    # included, however it ends (Linux; None: it outlives its parent).
    parent_death_signal: int | None = None
    # The system user it runs as (None: this process's).
    user: str | None = None
    # Where it serves Prometheus metrics (None: it does not).
    metrics: str | None = None


def python_module(module: str) -> list[str]:
    return [sys.executable, "-m", module]


async def wait_tcp(host: str, port: int, timeout: float, interval: float = 0.05) -> None:
    """Until something accepts connections on ``host:port``."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                _, writer = await asyncio.open_connection(host, port)
            except OSError:
                await asyncio.sleep(interval)
                continue
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return


PR_SET_PDEATHSIG = 1


def parent_death_hook(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the child sent ``sig`` when its parent ends (None off Linux).

    The kernel sends it when the spawning *thread* ends, so spawn from a thread that lives
    as long as the child (an event loop's). The hook runs between fork and exec, so it only
    calls into libc, resolved beforehand; a parent that died before the hook ran is caught
    by comparing the parent's pid."""
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return hook


async def wait_http_ok(url: str, timeout: float, interval: float = 0.05) -> None:
    async with httpx.AsyncClient(timeout=1.0) as client, asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await client.get(url)).status_code == 200:
                    return
            await asyncio.sleep(interval)


class ExitedBeforeReady(RuntimeError):
    """A process ended while it was awaited to be ready: it names the process, how it ended
    and the end of its log (where a crash at start, e.g. a port it could not bind, shows)."""

    def __init__(self, name: str, code: int, log_path: Path | None, log_tail: str) -> None:
        self.name = name
        self.code = code
        self.log_path = log_path
        ended = (
            f"was killed by {signal.Signals(-code).name}"
            if code < 0
            else f"exited with code {code}"
        )
        super().__init__(
            f"{name} {ended} before it was ready\n--- {log_path or 'no log'} ---\n{log_tail}"
        )


class ManagedProcess:
    """A child process made from ``spec``; :meth:`spawn` again after it ended to restart it."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def address(self) -> str | None:
        return self.spec.address

    @property
    def log_path(self) -> Path:
        return self.spec.log_path

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self) -> None:
        spec = self.spec
        spec.log_path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
        with open_private(spec.log_path) as out:  # a log may quote what a caller sent
            self.process = subprocess.Popen(
                spec.argv,
                env={**os.environ, **spec.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=spec.new_session,
                user=spec.user,
                preexec_fn=(
                    parent_death_hook(spec.parent_death_signal)
                    if spec.parent_death_signal is not None
                    else None
                ),
            )

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Until its gRPC health is SERVING (or its HTTP health answers 200). If it exits
        first, :class:`ExitedBeforeReady` at once; on a timeout the error carries the end
        of its log. Health is asked over the TLS the process's own settings give its
        channels (its peers call it so)."""
        ready = asyncio.ensure_future(self._until_ready(timeout))
        if self.process is None:  # nothing of its own to watch
            return await ready
        exited = asyncio.ensure_future(self.wait())
        try:
            await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ready.cancel()
            exited.cancel()
            await asyncio.gather(ready, exited, return_exceptions=True)
        if not ready.cancelled():  # ready (or timed out) first, or as it exited
            return ready.result()
        raise ExitedBeforeReady(self.name, exited.result(), self.log_path, self.log_tail())

    async def _until_ready(self, timeout: float) -> None:
        try:
            if self.spec.address is not None:
                tls = TLSSettings.of({**os.environ, **self.spec.env}).client
                await wait_until_serving(self.spec.address, timeout, tls=tls)
            elif self.spec.http_health is not None:
                await wait_http_ok(self.spec.http_health, timeout)
            elif self.spec.ready is not None:
                await self.spec.ready(timeout)
        except TimeoutError as error:
            raise TimeoutError(
                f"{self.name}: {error or 'not ready'}\n--- {self.log_path} ---\n{self.log_tail()}"
            ) from None

    async def wait(self) -> int:
        """Until it exits (woken by the kernel through a pidfd, no polling); its exit code."""
        process = self.process
        assert process is not None, "spawn() first"
        if process.poll() is not None:
            return process.returncode
        try:
            fd = os.pidfd_open(process.pid)
        except ProcessLookupError:  # reaped meanwhile
            return process.wait()
        loop = asyncio.get_running_loop()
        exited = asyncio.Event()
        loop.add_reader(fd, exited.set)
        try:
            await exited.wait()
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        return process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash: no shutdown code runs. Returns once it is gone."""
        if self.running():
            assert self.process is not None
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    async def stop(self, timeout: float = 30.0) -> int | None:
        """Its stop signal (SIGTERM unless the spec says otherwise) and wait for a graceful
        exit, SIGKILL after ``timeout``; the exit code."""
        if self.process is None:
            return None
        if self.running():
            with contextlib.suppress(ProcessLookupError):  # exited on its own meanwhile
                self.process.send_signal(self.spec.stop_signal)
            try:
                await asyncio.wait_for(self.wait(), timeout)
            except TimeoutError:
                log.warning("did not stop in time; killing", service=self.name)
                self.kill()
        return self.process.returncode

    async def restart(self, timeout: float = 60.0) -> None:
        await self.stop()
        self.spawn()
        await self.wait_ready(timeout)

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


def log_tail(path: Path | None, lines: int = 40) -> str:
    """The last ``lines`` of the log at ``path`` ("" if there is none)."""
    if path is None or not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# Where free_port looks: from here to the start of the kernel's ephemeral range.
_PORT_FLOOR = 20_000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@functools.cache
def _ephemeral_start() -> int:
    """The first port the kernel gives outgoing connections (0 where it does not say)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A loopback port nothing listens on, for a server to be started on it next.

    Taken at random below the kernel's ephemeral range where there is one: a port the
    kernel hands out (bind to port 0) is the kind it also gives any outgoing connection, so
    between this answer and the server's bind a client socket of another process (a test
    worker's connection to PostgreSQL, say) could take it, and the server would fail to
    start. Below the range only another caller of this function can, one chance in
    thousands; and never this process's own: a port it handed out is not handed out again
    (two asked for in a row, a server's client and cluster ports say, were the same one
    when neither was bound yet)."""
    start = _ephemeral_start()
    if start > _PORT_FLOOR + 1000:
        for _ in range(100):
            port = random.randrange(_PORT_FLOOR, start)
            if port in _handed_out:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                _handed_out.add(port)
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
        return chosen


# Ports free_port gave this process: never given twice.
_handed_out: set[int] = set()
