"""The wire contracts, declared once: every stream, subject, message-id format and stream
setting that a Dispo service publishes or consumes. Publishers and consumers import them
from here; the shared outbox refuses a subject that no declared stream carries.

    from dispo.libs.contracts import tasks
    await tasks.ensure_task_streams(bus)
    await outbox_add(conn, outbox, tasks.TASK_CREATE, tasks.create_id(task_id, 0), data, now)
"""

from __future__ import annotations

import re

from dispo.libs.contracts import evaluations, tasks
from dispo.libs.contracts._streams import (
    Stream,
    UndeclaredSubject,
    subject_matches,
    subject_regex,
)

# Every JetStream stream of the platform.
STREAMS: tuple[Stream, ...] = (
    tasks.TASKS,
    tasks.TASK_STATUS,
    tasks.CALLBACKS,
    evaluations.EVALUATIONS,
)


# Every declared subject pattern as one expression: the outbox checks each row it writes.
_DECLARED = re.compile(
    "|".join(f"(?:{subject_regex(p)})" for stream in STREAMS for p in stream.subjects)
)


def declared(subject: str) -> bool:
    """True when a declared stream carries ``subject``."""
    return _DECLARED.fullmatch(subject) is not None


def require_declared(subject: str) -> None:
    """Raise :class:`UndeclaredSubject` unless a declared stream carries ``subject``."""
    if not declared(subject):
        raise UndeclaredSubject(
            f"subject {subject!r} is carried by no stream declared in dispo.libs.contracts"
        )


__all__ = [
    "STREAMS",
    "Stream",
    "UndeclaredSubject",
    "declared",
    "evaluations",
    "require_declared",
    "subject_matches",
    "tasks",
]
