"""The consumer side of the quarantine: a wrapper around a consumer's handler.

    guard = Guard(store, RetryBound(max_failures=5, base_seconds=1.0, max_seconds=30.0))
    consumer = bus.consumer(STREAM, durable=name, subject=..., handler=guard.wrap(handle))

What counts as a failure of a message: its handler raised (anything but the database or
NATS being unreachable, or a deadlock or serialization failure with a concurrent
transaction, which say nothing about the message), or refused it for good
(:class:`~dispo.libs.bus.Term`: malformed or contradictory). A raise is redelivered after
an exponential backoff, until the message has failed ``max_failures`` times; then, as at
once for a refusal, the message is written to the service's quarantine and terminated, so
it never holds up the messages behind it. A handler's own :class:`~dispo.libs.bus.Nak`
("not yet", with the delay it chose) is not a failure: it is how the executor waits out a
retry backoff or a lease, and each such wait is bounded by its own policy.

Failures are counted per stream message in the process that saw them (a message that
moves between replicas of a service may fail up to ``max_failures`` times in each). If
the quarantine cannot be written (the database is down) the message is redelivered after
the backoff and quarantined at its next failure.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

import asyncpg
import nats.errors
from dispo.libs.backoff import backoff
from dispo.libs.bus import Disposition, Handler, Nak, Term
from dispo.libs.db import database_unreachable, error_chain
from dispo.libs.errors import Unavailable
from dispo.libs.logging import get_logger
from dispo.libs.quarantine.store import (
    FIRST_SEEN_HEADER,
    REPLAYS_HEADER,
    Poisoned,
    QuarantineStore,
)
from nats.aio.msg import Msg

log = get_logger(__name__)

# Messages whose failures one process remembers at most (the oldest are forgotten first).
TRACKED_MESSAGES = 10_000


@dataclass(frozen=True)
class RetryBound:
    """How often a message may fail, and how long it waits before each redelivery."""

    max_failures: int = 5
    base_seconds: float = 1.0
    max_seconds: float = 30.0
    jitter: float = 0.2

    def delay(self, failures: int) -> float:
        return backoff(self.base_seconds, self.max_seconds, self.jitter, failures)


@dataclass
class _Failing:
    failures: int
    first_seen: datetime


# PostgreSQL errors that a concurrent transaction caused: the same message passes next time.
_CONTENDED = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
    asyncpg.exceptions.LockNotAvailableError,
)


def not_the_messages_fault(error: BaseException) -> bool:
    """The database or NATS cannot be reached, or a concurrent transaction got in the way
    (deadlock, serialization failure): the message is not at fault."""
    if isinstance(error, Unavailable | nats.errors.Error) or database_unreachable(error):
        return True
    return any(isinstance(current, _CONTENDED) for current in error_chain(error))


class Guard:
    """Bounds the failures of every message a service's consumers handle and quarantines
    what exceeds them (one per service, shared by its consumers)."""

    def __init__(
        self, store: QuarantineStore, bound: RetryBound, *, later_delay: float = 1.0
    ) -> None:
        if bound.max_failures < 1:
            raise ValueError("max_failures must be at least 1")
        self.store = store
        self.bound = bound
        self.later_delay = later_delay
        self._failing: OrderedDict[tuple[str, int], _Failing] = OrderedDict()

    def wrap(self, handler: Handler) -> Handler:
        async def guarded(message: Msg) -> Disposition:
            return await self.handle(handler, message)

        return guarded

    async def handle(self, handler: Handler, message: Msg) -> Disposition:
        try:
            outcome = await handler(message)
        except Exception as error:
            if not_the_messages_fault(error):
                log.warning(
                    "handler failed for a reason outside the message; later",
                    subject=message.subject,
                    error=repr(error),
                )
                return Nak(self.later_delay)
            key = _key(message)
            log.exception("handler failed", subject=message.subject, consumer=key[0])
            failing = self._failed(key)
            if failing.failures < self.bound.max_failures:
                return Nak(self.bound.delay(failing.failures))
            why = f"{type(error).__name__}: {error}"
        else:
            if not isinstance(outcome, Term):
                # Only a message that failed before has a count to forget. The key is read
                # from the message's metadata (its reply subject parsed, some microseconds):
                # a stream where nothing fails does not pay for it on every message.
                if self._failing and not isinstance(outcome, Nak):
                    self._failing.pop(_key(message), None)
                return outcome
            key = _key(message)
            failing = self._failed(key)
            why = outcome.reason
        return await self._quarantine(message, key, failing, why)

    def _failed(self, key: tuple[str, int]) -> _Failing:
        failing = self._failing.pop(key, None) or _Failing(0, self.store.clock.now())
        failing.failures += 1
        self._failing[key] = failing
        while len(self._failing) > TRACKED_MESSAGES:
            self._failing.popitem(last=False)
        return failing

    async def _quarantine(
        self, message: Msg, key: tuple[str, int], failing: _Failing, why: str
    ) -> Disposition:
        meta = message.metadata
        headers = message.headers or {}
        poisoned = Poisoned(
            consumer=key[0],
            stream=meta.stream or "",
            subject=message.subject,
            stream_sequence=meta.sequence.stream,
            payload=message.data,
            error=why,
            deliveries=meta.num_delivered or 1,
            replays=_int(headers.get(REPLAYS_HEADER)),
            first_seen=_moment(headers.get(FIRST_SEEN_HEADER)) or failing.first_seen,
        )
        try:
            await self.store.hold(poisoned)
        except Exception as error:
            log.warning(
                "could not quarantine a message; it comes back",
                subject=message.subject,
                consumer=key[0],
                error=repr(error),
            )
            return Nak(self.bound.delay(failing.failures))
        self._failing.pop(key, None)
        log.warning(
            "message quarantined",
            subject=message.subject,
            consumer=key[0],
            stream_sequence=poisoned.stream_sequence,
            deliveries=poisoned.deliveries,
            error=why,
        )
        return Term(f"quarantined: {why}")


def _key(message: Msg) -> tuple[str, int]:
    """A message's failures are counted per consumer and stream sequence."""
    meta = message.metadata
    return (meta.consumer or "", meta.sequence.stream)


def _int(value: str | None) -> int:
    try:
        return max(0, int(value or 0))
    except ValueError:
        return 0


def _moment(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo else None
