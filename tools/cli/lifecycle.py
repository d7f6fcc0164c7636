"""A stack's life from the command line beyond one terminal: what a second ``dispo up``
says, ``dispo up --detach`` and ``dispo down``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispo.libs.auth.caller import ADMIN_TOKEN_FILE
from dispo.libs.private_files import open_private, private_folder
from dispo.libs.settings import CommonSettings
from dispo.tools.stack.ownership import (
    FolderLock,
    Recorded,
    StackRunning,
    owner,
    recorded,
    wait_exit,
)
from dispo.tools.stack.state import STOP_ORDER, read_state, stop_stale

if TYPE_CHECKING:
    from dispo.tools.stack.stack import StackOptions

# How long `dispo down` lets dispo up stop everything in order before it kills it.
DOWN_TIMEOUT_SECONDS = 120.0
UP_LOG = "up.log"


def _dispo(data_dir: Path, command: str) -> str:
    """``command`` as a user types it for the stack in ``data_dir``."""
    default = Path(CommonSettings().data_dir).resolve()
    where = "" if data_dir == default else f"--data-dir {data_dir} "
    return f"dispo {where}{command}"


def banner(
    options: StackOptions, addresses: dict[str, str], metrics: dict[str, str] | None = None
) -> list[str]:
    """What ``dispo up`` prints once the stack is up: each service's address and where it
    serves its metrics."""
    data = options.data_dir
    metrics = metrics or {}
    lines = [f"Dispo is up (data in {data}, logs in {data / 'logs'}):"]
    lines += [
        f"  {name:<16} {address:<22} {('metrics ' + metrics[name]) if name in metrics else ''}".rstrip()
        for name, address in addresses.items()
    ]
    if options.demo_port and "executor" in options.services:
        lines.append(f"  {'demo downstream':<16} http://{options.host}:{options.demo_port}")
    if options.console_port and "gateway" in options.services:
        lines.append(
            f"  {'console':<16} http://{options.host}:{options.console_port}"
            " (sign in with the admin token below, or a business token)"
        )
    token = data / ADMIN_TOKEN_FILE
    lines.append(
        f"The admin token is in {token} (owner-only); the dispo CLI reads it from there,"
        f" grpcurl and the SDK take it from DISPO_TOKEN: export DISPO_TOKEN=$(cat {token})"
    )
    if (tls := options.certificates) is not None:
        lines.append(
            f"TLS only: the local CA is {tls.ca_file}, the servers' certificate {tls.cert_file},"
            f" a client certificate {tls.client_cert_file} (keys beside them, owner-only); the"
            " dispo CLI finds them, the SDK takes them from DISPO_TLS_CA_FILE (and"
            " DISPO_TLS_CLIENT_CERT_FILE / DISPO_TLS_CLIENT_KEY_FILE for mTLS), grpcurl from"
            f" -cacert {tls.ca_file} instead of -plaintext (and -cert/-key of the client"
            " certificate for mTLS)"
        )
    return lines


def describe_running(running: StackRunning) -> str:
    """What is running in a folder a second ``dispo up`` was asked to use, and how to stop it."""
    data = running.data_dir
    lines = [f"A stack is already running in {data} (dispo up, pid {running.pid}); not starting."]
    state = running.state
    if state is None:
        lines.append("  (it is still starting)")
    else:
        where = {name: info["address"] for name, info in state.get("services", {}).items()}
        where |= {"postgres": state.get("database_url", ""), "nats": state.get("nats_url", "")}
        where |= {"console": state.get("console") or ""}
        for process in recorded(state, STOP_ORDER):
            lines.append(
                f"  {process.name:<16} {where.get(process.name, ''):<40} pid {process.pid}"
            )
    lines.append(
        f"Stop it with `{_dispo(data, 'down')}` (or Ctrl-C where it runs); "
        f"`{_dispo(data, 'status')}` shows its health."
    )
    return "\n".join(lines)


def _stopped_lines(processes: list[Recorded]) -> list[str]:
    return [f"  {p.name:<16} pid {p.pid}" for p in processes]


def down(data_dir: Path, timeout: float = DOWN_TIMEOUT_SECONDS) -> int:
    """Stop the stack running in ``data_dir``: its ``dispo up`` stops everything in order
    (SIGTERM, as a Ctrl-C); killed if it has not within ``timeout``, which its processes
    do not outlive. A stale stack's leftovers are stopped here. Prints what it did."""
    pid = owner(data_dir)
    state = read_state(data_dir)
    if pid is None:
        return _down_stale(data_dir)
    print(f"stopping the stack in {data_dir} (dispo up, pid {pid})…", flush=True)
    os.kill(pid, signal.SIGTERM)
    code = 0
    if not wait_exit(pid, timeout):
        print(f"dispo up did not stop within {timeout:g} s; killing it", flush=True)
        os.kill(pid, signal.SIGKILL)
        wait_exit(pid, 30)
        code = 1
    processes = list(recorded(state or {}, STOP_ORDER))
    deadline = time.monotonic() + 30  # what dies with a killed dispo up takes a moment
    for process in processes:
        if process.alive():
            wait_exit(process.pid, max(0.0, deadline - time.monotonic()))
    left = [p for p in processes if p.alive()]
    if left:
        print("still running:", flush=True)
        print("\n".join(_stopped_lines(left)))
        return 1
    print("stopped:" if processes else "stopped", flush=True)
    if processes:
        print("\n".join(_stopped_lines(processes)), flush=True)
    return code


def _down_stale(data_dir: Path) -> int:
    lock = FolderLock(data_dir)
    try:
        lock.acquire()
    except StackRunning:  # a dispo up has just started there: stop that one
        return down(data_dir)
    try:
        state = read_state(data_dir)
        if state is None:
            print(f"no stack is running in {data_dir}")
            return 0
        stopped = stop_stale(data_dir, state)
    finally:
        lock.release()
    print(f"the stack in {data_dir} had lost its dispo up (pid {state.get('pid')})", end="")
    if not stopped:
        print("; nothing of it was running")
        return 0
    print("; stopped what was left of it:")
    print("\n".join(_stopped_lines(stopped)))
    return 0


def detach(options: StackOptions, up_argv: list[str]) -> int:
    """Start ``dispo up`` (with ``up_argv``) in the background, in a session of its own and
    with its output in ``logs/up.log``; return once the stack is up, or it failed."""
    data = options.data_dir
    if (pid := owner(data)) is not None:
        print(describe_running(StackRunning(data, pid, read_state(data))), file=sys.stderr)
        return 1
    output = data / "logs" / UP_LOG
    private_folder(output.parent)
    argv = [sys.executable, "-m", "dispo.tools.cli", "--data-dir", str(data), *up_argv]
    with open_private(output) as out:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        state = _until_up(child, data)
    except KeyboardInterrupt:
        child.terminate()
        return 130
    if state is None:
        print(f"dispo up ended before the stack was up; its output ({output}):", file=sys.stderr)
        print(_tail(output), file=sys.stderr)
        return child.returncode or 1
    addresses = {name: info["address"] for name, info in state["services"].items()}
    print("\n".join(banner(options, addresses)))
    print(
        f"Running in the background (dispo up, pid {child.pid}; its output in {output}). "
        f"`{_dispo(data, 'down')}` stops it.",
        flush=True,
    )
    return 0


def _until_up(child: subprocess.Popen[bytes], data_dir: Path) -> dict[str, Any] | None:
    """The stack's state once ``child`` reports it up; None if ``child`` ended first."""
    while child.poll() is None:
        state = read_state(data_dir)
        if state is not None and state.get("pid") == child.pid and state.get("ready"):
            return state
        time.sleep(0.1)
    return None


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
