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


def require_declared(subject: str) -> None:
    """Raise :class:`UndeclaredSubject` unless a declared stream carries ``subject``."""
    if not declared(subject):
        raise UndeclaredSubject(
            f"subject {subject!r} is carried by no stream declared in dispo.libs.contracts"
        )


__all__ = [
    "BUS_SERVICES",
    "Durable",
    "FLOWS",
    "STREAMS",
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
