"""structlog set-up: JSON lines for services, readable key-value for people.

Every line about a task carries ``task_id`` (and ``node_id``, ``business`` where they
apply): :func:`bind_ids` binds them once where a message or a call for a task is handled,
for every line logged until that handling ends. A consumer handles each message on an
asyncio task of its own and gRPC each call, so a binding ends with its message or call
(and :mod:`dispo.libs.grpcserver` binds the ids a request names). Work shared by many
tasks (a batcher's flush) runs with none bound.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO, cast

import structlog


class _CurrentStderr:
    """Standard error as it is when a line is written, not when logging was set up: a
    stream replaced since (a test's capture, a daemon's redirection) and closed is never
    written to."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(fmt: str = "json", level: str = "INFO", service: str | None = None) -> None:
    renderer: structlog.typing.Processor
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    if service:
        processors.insert(0, _add_service(service))
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=True,
    )


def _add_service(service: str) -> structlog.typing.Processor:
    def add(
        _logger: structlog.typing.WrappedLogger, _method: str, event: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        event.setdefault("service", service)
        return event

    return add


def bind_ids(**ids: object) -> None:
    """Bind the non-empty ``ids`` (``task_id=…, business=…, node_id=…``) to every line the
    current asyncio task logs from now on, and the tasks it starts."""
    structlog.contextvars.bind_contextvars(**{k: v for k, v in ids.items() if v})


def get_logger(name: str | None = None, **initial: object) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name, **initial)
    return logger
