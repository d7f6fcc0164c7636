"""Files only their owner may read: the secrets ``dispo up`` keeps in its data folder.

:func:`write_private` writes one whole (never readable by others, not even briefly, and never
seen half-written); :func:`kept_secrets` keeps a JSON object of named secrets, making the
ones it lacks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600 from the start (written beside it under a
    name of this process, then moved over it); a folder it makes for it is 0700."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # a leftover of an earlier write may have had other bits
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
        path.chmod(0o600)
    return kept
