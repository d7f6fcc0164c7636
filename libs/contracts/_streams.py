"""What a declared stream is, who publishes and consumes each subject, and whether a
subject is declared."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from dispo.libs.bus import Bus
from dispo.libs.settings import StreamSettings
from nats.js.api import DiscardPolicy, RetentionPolicy


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
class Durable:
    """A durable consumer that must see what a stream carries on its filters: declared with
    the stream, made by whichever service ensures the stream first, consumed by the service
    whose durable it is (under this name, its setting's default)."""

    name: str
    filters: tuple[str, ...]


@dataclass(frozen=True)
class Stream:
    """A JetStream stream: its name, the subjects it carries, how long it keeps a message and
    how much it may hold (ADR-0092).

    An ``interest`` stream keeps a message until every consumer on its subject has
    acknowledged it, and ``durables`` are the consumers that must (made before anything is
    published, so no message finds no one). A ``limits`` stream keeps a message for
    ``max_age`` whatever its consumers did. Either way a full stream (its byte limit, a
    setting of :class:`StreamSettings`) refuses new messages rather than dropping old ones:
    the publishers' outboxes hold them until there is room."""

    name: str
    subjects: tuple[str, ...]
    # Seconds a message is kept; None keeps it until the stream's other limits apply.
    max_age: float | None = None
    # Seconds within which a second publication of one message id is dropped.
    duplicate_window: float = 120.0
    retention: str = "limits"  # or "interest"
    durables: tuple[Durable, ...] = ()

    def carries(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.subjects)

    def max_bytes(self, settings: StreamSettings | None = None) -> int:
        """The stream's byte limit from ``settings`` (read from the environment without);
        0: none."""
        return (settings or StreamSettings()).max_bytes(self.name)

    async def ensure(
        self, bus: Bus, *, update: bool = True, settings: StreamSettings | None = None
    ) -> None:
        """Create the stream and its durables, or bring its subjects, retention and limits to
        this declaration (idempotent). A service that only consumes the stream passes
        ``update=False``: its bus user may not change it (ADR-0037)."""
        await bus.ensure_stream(
            self.name,
            list(self.subjects),
            max_age=self.max_age,
            duplicate_window=self.duplicate_window,
            retention=RetentionPolicy(self.retention),
            max_bytes=self.max_bytes(settings),
            discard=DiscardPolicy.NEW,
            durables=[(d.name, d.filters) for d in self.durables],
            update=update,
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
    # Services that purge one task's messages from the stream (Bus.purge_subject) when the
    # task is erased: their bus users may purge it.
    purgers: tuple[str, ...] = ()
