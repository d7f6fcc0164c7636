"""What a downstream call's outcome says about its effect, and what that means for its node.

Every answer and every transport error of an action's call falls in one class
(:class:`CallOutcome`); the class and the action's ``idempotent`` flag give the node's next
move (:func:`verdict`). The question each class answers is whether the effect may have
happened:

| class | what happened | examples | node |
|---|---|---|---|
| ``SUCCESS`` | the call succeeded | 2xx | ``SUCCEEDED`` |
| ``NOT_SENT`` | nothing reached the downstream | connection refused, DNS failure, connect or pool timeout, breaker open | short retry (breaker open: ``DEMOTED``) |
| ``REFUSED`` | answered, without effect | 429, 503 (after ``Retry-After``), 408 | short retry |
| ``DEFINITE`` | answered, the call failed | any other 4xx, 3xx, 501, 505 | ``FAILED`` |
| ``AMBIGUOUS`` | sent, effect unknown | read or write timeout, connection reset or closed before the answer, 500, 502, 504, other 5xx | idempotent: short retry under the same idempotency key; otherwise ``UNKNOWN`` |

An ``UNKNOWN`` node is never sent again by the executor: the reconciler settles it by the
action's status probe, or an operator does (docs/recovery.md). Pure: the transport errors
are classified by their type, nothing here does I/O.
"""

from __future__ import annotations

import enum
import random
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta

import aiohttp
from dispo.executor.domain import RetryPolicy
from dispo.libs.backoff import retry_after_seconds
from dispo.libs.error_text import truncate_error


class CallOutcome(enum.StrEnum):
    SUCCESS = "success"
    NOT_SENT = "not sent"
    REFUSED = "refused"
    DEFINITE = "definite failure"
    AMBIGUOUS = "ambiguous"


def failure_text(outcome: CallOutcome, detail: str) -> str:
    """A failed call's ``last_error``: its class first, then what happened
    (``ambiguous: timeout after 2s …``)."""
    return truncate_error(f"{outcome}: {detail}")


class Verdict(enum.Enum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"  # a short retry under the same idempotency key
    FAILED = "failed"  # permanently
    UNKNOWN = "unknown"  # settled by the status probe or an operator, never re-sent


# Answers that refuse the request without acting on it.
REFUSED_STATUSES = frozenset({408, 429, 503})
# Server errors that say the server cannot do this at all (no effect).
DEFINITE_SERVER_STATUSES = frozenset({501, 505})

# Transport errors raised before any byte of the request could reach the downstream.
_NOT_SENT_ERRORS: tuple[type[BaseException], ...] = (
    # No free connection or no connection within the timeout (a TimeoutError too: checked
    # before the ambiguous ones).
    aiohttp.ConnectionTimeoutError,
    # Connection refused, DNS failure, unreachable, a TLS handshake refused: all before a
    # byte of the request was written.
    aiohttp.ClientConnectorError,
    aiohttp.InvalidURL,  # the request could not be formed
    ConnectionRefusedError,
    socket.gaierror,
)


def classify_status(code: int) -> CallOutcome:
    """The class of an HTTP answer."""
    if 200 <= code < 300:
        return CallOutcome.SUCCESS
    if code in REFUSED_STATUSES:
        return CallOutcome.REFUSED
    if code >= 500 and code not in DEFINITE_SERVER_STATUSES:
        return CallOutcome.AMBIGUOUS
    return CallOutcome.DEFINITE


def classify_error(error: BaseException) -> CallOutcome:
    """The class of a call that raised instead of answering: ``NOT_SENT`` only when the
    error comes before the request can have been written, else ``AMBIGUOUS`` (a read or
    write timeout, a reset, a disconnect, an error nobody expected)."""
    if isinstance(error, _NOT_SENT_ERRORS):
        return CallOutcome.NOT_SENT
    return CallOutcome.AMBIGUOUS


def verdict(outcome: CallOutcome, idempotent: bool) -> Verdict:
    """The node's next move after a call of this class (before the retry budget is
    counted: a ``RETRY`` with the short retries spent is ``FAILED``, retryable)."""
    if outcome is CallOutcome.SUCCESS:
        return Verdict.SUCCEEDED
    if outcome is CallOutcome.DEFINITE:
        return Verdict.FAILED
    if outcome is CallOutcome.AMBIGUOUS and not idempotent:
        return Verdict.UNKNOWN
    return Verdict.RETRY


# The longest wait a downstream's Retry-After is honoured for, in seconds.
MAX_RETRY_AFTER = 3600.0


@dataclass(frozen=True)
class Move:
    """What to record for a finished call: ``verdict`` with its retry budget counted;
    for FAILED whether a redrive may run it again (``retryable``); for RETRY the moment it
    may go out again (``not_before``). ``unknown``: the call may have had its effect, so
    the node goes through UNKNOWN (and stays there unless the action is idempotent)."""

    verdict: Verdict
    retryable: bool = False
    not_before: datetime | None = None
    unknown: bool = False


def next_move(
    outcome: CallOutcome,
    idempotent: bool,
    round_attempts: int,
    policy: RetryPolicy,
    now: datetime,
    retry_after: str = "",
    rng: random.Random | None = None,
) -> Move:
    """The move for a call of this class, as attempt ``round_attempts`` of its round: a
    short retry waits its backoff, or what the downstream's ``Retry-After`` asks for when
    that is longer (at most :data:`MAX_RETRY_AFTER`); a retry over the budget is FAILED,
    retryable (a redrive may run it again)."""
    move = verdict(outcome, idempotent)
    ambiguous = outcome is CallOutcome.AMBIGUOUS
    if move is Verdict.RETRY and policy.exhausted(round_attempts):
        return Move(Verdict.FAILED, retryable=True)
    if move is Verdict.RETRY:
        delay = policy.delay(round_attempts, rng)
        asked = retry_after_seconds(retry_after, now)
        if asked is not None:
            delay = max(delay, min(asked, MAX_RETRY_AFTER))
        return Move(Verdict.RETRY, True, now + timedelta(seconds=delay), unknown=ambiguous)
    return Move(move, unknown=move is Verdict.UNKNOWN)


def breaker_counts(outcome: CallOutcome) -> bool | None:
    """What the call says about the downstream's health, for its breaker: True a success,
    False a failure, None nothing (a definite failure is the request's fault)."""
    if outcome is CallOutcome.SUCCESS:
        return True
    if outcome is CallOutcome.DEFINITE:
        return None
    return False
