"""The stack's logs, bounded: ``dispo up`` rotates every log in its ``logs/`` folder by size.

Each process of the stack appends its output to its own file (opened ``O_APPEND``, see
:func:`dispo.libs.private_files.open_private`) and keeps it open for its whole life, so the
file is rotated by copy and truncate (ADR-0106): a file over ``DISPO_LOG_MAX_BYTES`` is copied
to ``<name>.log.1`` (``.1`` to ``.2`` and so on first, the oldest beyond
``DISPO_LOG_BACKUPS`` dropped) and then truncated; the process writes on at the new end of
the same file, and whoever tails it by name keeps reading the one file. The few lines a
process writes between the last copied byte and the truncation are lost: the copy reads
up to the end again right before truncating, which narrows that to microseconds.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from dispo.libs.clock import Clock
from dispo.libs.logging import get_logger
from dispo.libs.periodic import Periodic
from dispo.libs.private_files import PRIVATE_FILE
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

log = get_logger(__name__)

MIB = 1024**2
CHUNK = MIB


class LogSettings(BaseSettings):
    """How ``dispo up`` bounds its processes' logs (``<data dir>/logs/*.log``)."""

    model_config = SettingsConfigDict(env_prefix="DISPO_LOG_", extra="ignore")

    max_bytes: int = Field(
        default=64 * MIB,
        ge=0,
        description="Size past which `dispo up` rotates a log of its `logs/` folder: the file"
        " is copied to `<name>.log.1` (older copies shifted to `.2`…) and emptied, while its"
        " process writes on (0: never rotate). The folder holds at most"
        " (1 + `DISPO_LOG_BACKUPS`) × this per process, plus what is written between checks",
    )
    backups: int = Field(
        default=5,
        ge=0,
        description="Rotated copies `dispo up` keeps of each log (`<name>.log.1` the newest);"
        " the oldest beyond them is deleted",
    )
    check_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between `dispo up`'s checks of its logs' sizes",
    )


def backup(path: Path, k: int) -> Path:
    """The ``k``-th rotated copy of the log at ``path`` (1: the newest)."""
    return path.with_name(f"{path.name}.{k}")


def rotate(path: Path, max_bytes: int, backups: int) -> bool:
    """Rotate the log at ``path`` if it holds more than ``max_bytes`` (0: never); True when
    it did. Its writers keep their file: it is copied, then truncated (the module doc)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if max_bytes <= 0 or size <= max_bytes:
        return False
    backup(path, backups + 1).unlink(missing_ok=True)  # one a lowered setting left
    for k in range(backups - 1, 0, -1):  # .1 -> .2, …, the oldest replaced
        if (older := backup(path, k)).exists():
            older.replace(backup(path, k + 1))
    with open(path, "rb") as source:
        if backups > 0:
            newest = backup(path, 1)
            fd = os.open(newest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
            os.fchmod(fd, PRIVATE_FILE)  # a log may quote what a caller sent
            with os.fdopen(fd, "wb") as copy:
                while chunk := source.read(CHUNK):  # to the end, as it is now
                    copy.write(chunk)
        os.truncate(path, 0)
    return True


def rotate_folder(folder: Path, max_bytes: int, backups: int) -> list[str]:
    """Rotate every ``*.log`` of ``folder`` over ``max_bytes``; the names of those rotated."""
    rotated = []
    for path in sorted(folder.glob("*.log")):
        try:
            if rotate(path, max_bytes, backups):
                rotated.append(path.name)
        except OSError as error:  # one file that cannot be rotated holds up no other
            log.warning("log rotation failed", log=str(path), error=str(error))
    return rotated


def log_rotation(folder: Path, settings: LogSettings, clock: Clock) -> Periodic:
    """The periodic part rotating the logs of ``folder`` every ``check_seconds``."""

    async def check() -> None:  # off the event loop, which runs the stack's processes
        await asyncio.to_thread(rotate_folder, folder, settings.max_bytes, settings.backups)

    return Periodic("log rotation", check, settings.check_seconds, clock)
