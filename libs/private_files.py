"""Files only their owner may read: the secrets, state and logs ``dispo up`` keeps in its data
folder, and the pool's registry of local crons.

:func:`write_private` writes one whole (never readable by others, not even briefly, and never
seen half-written); :func:`open_private` opens one to append to (a log, a lock) and
:func:`private_folder` makes a folder only its owner may enter; :func:`kept_secrets` keeps a
JSON object of named secrets, making the ones it lacks. A file or folder an earlier version
left readable by others is narrowed when it is next opened.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def private_folder(path: Path) -> Path:
    """``path`` made (with its parents) if missing, and left owner-only (0700)."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
    path.chmod(PRIVATE_FOLDER)
    return path


def open_private(path: Path) -> BinaryIO:
    """``path`` opened to append to, made with mode 0600 (never readable by others, not even
    briefly); an existing file with a wider mode is narrowed to 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    return os.fdopen(fd, "ab")


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the start (written beside it under a
    name of this process, then moved over it); a folder it makes for it is 0700."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
    written = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    with os.fdopen(fd, "w") as out:
        os.fchmod(
            out.fileno(), PRIVATE_FILE
        )  # a leftover of an earlier write may have had other bits
        out.write(text)
    written.replace(path)


def kept_secrets(path: Path, names: Iterable[str], make: Callable[[], str]) -> dict[str, str]:
    """Every secret the JSON file at ``path`` keeps, with one from ``make`` for each of
    ``names`` it lacks (then the file is rewritten whole); the file is left owner-only."""
    kept: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    missing = [name for name in names if not kept.get(name)]
    if missing:
        kept |= {name: make() for name in missing}
        write_private(path, json.dumps(kept, indent=2) + "\n")
    else:
        path.chmod(PRIVATE_FILE)
    return kept
