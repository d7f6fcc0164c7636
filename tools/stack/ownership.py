"""Who runs the stack kept in a folder: one ``dispo up`` at a time.

The ``dispo up`` running a folder's stack holds an exclusive ``flock`` on ``stack.lock`` in
it for as long as it lives, and has written its pid there. The kernel releases the lock when
that process ends, however it ends, and the file is not inherited by its children, so a
held lock means a live stack and a free one beside a state file means a stale stack: one
whose ``dispo up`` was killed before it could clean up.

Processes named in a stale state file are stopped only when they are still the very
processes recorded (same pid *and* same start time), never a process that reused a pid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispo.libs.private_files import PRIVATE_FILE, PRIVATE_FOLDER

LOCK_FILE = "stack.lock"
# A probe holds the lock (shared) for an instant: a claim retries for this long.
CLAIM_PATIENCE_SECONDS = 1.0


class StackRunning(Exception):
    """A live ``dispo up`` (``pid``) runs the stack in ``data_dir``; ``state`` is its state
    file (None while it is still starting)."""

    def __init__(self, data_dir: Path, pid: int | None, state: dict[str, Any] | None) -> None:
        super().__init__(f"a stack is already running in {data_dir} (dispo up, pid {pid})")
        self.data_dir = data_dir
        self.pid = pid
        self.state = state


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, from /proc), None if it is not running.

    With the pid it identifies a process: a pid reused later has a later start."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # pid (comm) state ppid … starttime is the 22nd field; comm may hold spaces.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has ended
        return None
    return int(fields[19])


def wait_exit(pid: int, timeout: float) -> bool:
    """Whether ``pid`` (any process, not only a child) ended within ``timeout``."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        deadline = time.monotonic() + timeout
        while True:
            readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if readable:
                return True
            if start_ticks(pid) is None:  # a zombie whose parent has not reaped it
                return True
            if time.monotonic() >= deadline:
                return False
    finally:
        os.close(fd)


class FolderLock:
    """The exclusive lock on a stack folder, held while a ``dispo up`` runs it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock and write this process's pid in it; :class:`StackRunning` if a live
        ``dispo up`` holds it."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        os.fchmod(fd, PRIVATE_FILE)
        deadline = time.monotonic() + CLAIM_PATIENCE_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                os.close(fd)
                raise StackRunning(self.data_dir, owner(self.data_dir), None) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


def owner(data_dir: Path) -> int | None:
    """The pid of the live ``dispo up`` running the stack in ``data_dir``, None if none does."""
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # held: read who holds it
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Recorded:
    """A process a state file names: its part of the stack, pid and start time."""

    name: str
    pid: int
    started: int | None

    def alive(self) -> bool:
        """Whether the very process recorded still runs (not another that reused its pid)."""
        return self.started is not None and start_ticks(self.pid) == self.started


def recorded(state: dict[str, Any], order: list[str]) -> Iterator[Recorded]:
    """Every process ``state`` names in ``order``: services and companions before the
    infrastructure, a replica (``executor-2``, ``nats-1``) beside the name it extends,
    names ``order`` does not know after those it does."""
    found = [
        (group == "infrastructure", Recorded(name, info["pid"], info.get("started")))
        for group in ("services", "companions", "infrastructure")
        for name, info in state.get(group, {}).items()
        if info.get("pid") is not None
    ]

    def rank(name: str) -> int:
        if name in order:
            return order.index(name)
        extended = [i for i, known in enumerate(order) if name.startswith(f"{known}-")]
        return extended[0] if extended else len(order)

    for _, process in sorted(found, key=lambda f: (f[0], rank(f[1].name))):
        yield process


def stop_recorded(
    state: dict[str, Any],
    order: list[str],
    stop_signals: dict[str, int],
    timeout: float = 20.0,
) -> list[Recorded]:
    """Stop, in ``order``, the processes ``state`` names that still run (each with its
    signal from ``stop_signals``, SIGTERM by default, and SIGKILL after ``timeout``).

    Returns those it stopped."""
    stopped = []
    for process in recorded(state, order):
        if not process.alive():
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, stop_signals.get(process.name, signal.SIGTERM))
            if not wait_exit(process.pid, timeout) and process.alive():
                os.kill(process.pid, signal.SIGKILL)
                wait_exit(process.pid, timeout)
        stopped.append(process)
    return stopped
