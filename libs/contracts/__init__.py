"""The wire contracts, declared once: every stream, subject, message-id format and stream
setting that a Dispo service publishes or consumes, and which service publishes and
consumes each subject (:data:`FLOWS`, from which each service's bus user gets its
permissions). Publishers and consumers import them from here; the shared outbox refuses a
subject that no declared stream carries.

    from dispo.libs.contracts import tasks
    await tasks.ensure_task_streams(bus)
    await outbox_add(conn, outbox, tasks.TASK_CREATE, tasks.create_id(task_id, 0), data, now)
"""

from __future__ import annotations

import re

from dispo.libs.contracts import catalogue, evaluations, tasks
from dispo.libs.contracts._streams import (
    Durable,
    Flow,
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


# Who publishes and who consumes every subject of the platform.
FLOWS: tuple[Flow, ...] = (*tasks.FLOWS, *evaluations.FLOWS, *catalogue.FLOWS)

# The services that publish or consume on the bus: one bus user each.
BUS_SERVICES: tuple[str, ...] = tuple(
    sorted({s for flow in FLOWS for s in (*flow.publishers, *flow.consumers)})
)


def consumes(service: str) -> tuple[Flow, ...]:
    """The flows ``service`` consumes."""
    return tuple(flow for flow in FLOWS if service in flow.consumers)


def publishes(service: str) -> tuple[str, ...]:
    """The subject patterns ``service`` may publish: those it publishes, and those it alone
    consumes, which its quarantine may replay (a replayed copy reaches no other service)."""
    return tuple(
        flow.subject for flow in FLOWS if service in flow.publishers or flow.consumers == (service,)
    )


def may_publish(service: str, subject: str) -> bool:
    """True when ``service``'s bus user may publish ``subject``."""
    return any(subject_matches(pattern, subject) for pattern in publishes(service))


def streams_of(service: str) -> tuple[Stream, ...]:
    """The streams ``service`` publishes to or consumes from (and ensures at start)."""
    used = {
        flow.stream.name
        for flow in FLOWS
        if flow.stream is not None and service in (*flow.publishers, *flow.consumers)
    }
    return tuple(stream for stream in STREAMS if stream.name in used)


# Every declared subject pattern as one expression: the outbox checks each row it writes.
_DECLARED = re.compile(
    "|".join(f"(?:{subject_regex(p)})" for stream in STREAMS for p in stream.subjects)
)


def declared(subject: str) -> bool:
    """True when a declared stream carries ``subject``."""
    return _DECLARED.fullmatch(subject) is not None


# The streams that keep a message for an age (``max_age``) whatever its consumers did: status
# snapshots and callbacks, copies for live views and callers. A message of any other stream
# is work a consumer must see (ADR-0092): the stream keeps it until that consumer has it.
AGING_STREAMS: tuple[str, ...] = tuple(s.name for s in STREAMS if s.max_age is not None)


def aging_subjects_pattern() -> str:
    """A regular expression (Python's and PostgreSQL's) matching the whole of a subject
    carried by one of :data:`AGING_STREAMS`: what a set-aside copy may be deleted for once
    it is far older than its stream would have kept it (ADR-0105)."""
    patterns = (p for s in STREAMS if s.name in AGING_STREAMS for p in s.subjects)
    return "^(?:" + "|".join(f"(?:{subject_regex(p)})" for p in patterns) + ")$"


def require_declared(subject: str) -> None:
    """Raise :class:`UndeclaredSubject` unless a declared stream carries ``subject``."""
    if not declared(subject):
        raise UndeclaredSubject(
            f"subject {subject!r} is carried by no stream declared in dispo.libs.contracts"
        )


__all__ = [
    "AGING_STREAMS",
    "BUS_SERVICES",
    "Durable",
    "FLOWS",
    "STREAMS",
    "aging_subjects_pattern",
    "Flow",
    "Stream",
    "UndeclaredSubject",
    "consumes",
    "declared",
    "evaluations",
    "may_publish",
    "publishes",
    "require_declared",
    "streams_of",
    "subject_matches",
    "tasks",
]
