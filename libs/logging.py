"""structlog set-up: JSON lines for services, readable key-value for people.

Bind ``task_id`` (and other ids) with ``structlog.contextvars.bind_contextvars`` or
``log.bind`` so every line about a task carries it.
"""

from __future__ import annotations

import logging
import sys

import structlog


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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def _add_service(service: str) -> structlog.typing.Processor:
    def add(
        _logger: structlog.typing.WrappedLogger, _method: str, event: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        event.setdefault("service", service)
        return event

    return add


def get_logger(name: str | None = None, **initial: object) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name, **initial)
    return logger
