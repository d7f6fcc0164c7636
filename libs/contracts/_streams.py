"""What a declared stream is, who publishes and consumes each subject, and whether a
subject is declared."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from dispo.libs.bus import Bus


class UndeclaredSubject(ValueError):
    """A publisher tried to write a subject that no declared stream carries."""


def subject_regex(pattern: str) -> str:
    """The regular expression of a NATS subject pattern: ``*`` is one token, a final ``>``
    one or more tokens; tokens are never empty."""
    tokens = pattern.split(".")
    parts = []
    for i, token in enumerate(tokens):
        if token == ">" and i == len(tokens) - 1:
            parts.append(r"[^.]+(?:\.[^.]+)*")
        elif token == "*":
            parts.append(r"[^.]+")
        else:
            parts.append(re.escape(token))
    return r"\.".join(parts)


@functools.lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(subject_regex(pattern))


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a final ``>`` one or more tokens."""
    return _compiled(pattern).fullmatch(subject) is not None


@dataclass(frozen=True)
class Stream:
    """A JetStream stream: its name, the subjects it carries and its limits."""

    name: str
    subjects: tuple[str, ...]
    # Seconds a message is kept; None keeps it until the stream's other limits apply.
    max_age: float | None = None
    # Seconds within which a second publication of one message id is dropped.
    duplicate_window: float = 120.0

    def carries(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.subjects)

    async def ensure(self, bus: Bus) -> None:
        """Create the stream or bring its subjects to this declaration (idempotent)."""
        await bus.ensure_stream(
            self.name,
            list(self.subjects),
            max_age=self.max_age,
            duplicate_window=self.duplicate_window,
        )


@dataclass(frozen=True)
class Flow:
    """One subject pattern's traffic: the services that publish it and those that consume
    it, from ``stream`` (a JetStream stream) or, when ``stream`` is None, as plain NATS
    messages. Each service's bus user is allowed exactly this (ADR-0037); a subject no
    service of Dispo consumes is read by callers outside it."""

    subject: str
    publishers: tuple[str, ...]
    consumers: tuple[str, ...]
    stream: Stream | None = None
    # Consumers that also read the stream's stored messages back (Bus.read_subject): their
    # bus users may delete the stream's consumers (each read's ephemeral one, after it).
    readers: tuple[str, ...] = ()
