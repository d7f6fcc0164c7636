"""Running one node's action: the ``http`` and ``noop`` kinds.

Every http call carries the node's stable ``Idempotency-Key`` (the same on every attempt),
its attempt number ``X-Dispo-Attempt`` (the fencing token a downstream's status probe may
fence, docs/recovery.md) and the node run's ``traceparent`` where a trace is under way
(:mod:`dispo.libs.tracing`). Its answer or transport error is classified by
:mod:`dispo.executor.failures`: whether the call may have had its effect decides whether it
may be sent again.

A call is fenced by its pass's lease (ADR-0066): the caller's ``fence`` is asked once more
when the call's connection is in hand (:class:`FencedConnector`), right before its request
is written; a fence that no longer holds sends nothing (``NOT_SENT``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
from dispo.executor.domain import ActionSpec
from dispo.executor.failures import CallOutcome, classify_error, classify_status, failure_text
from dispo.libs.catalogue import Downstream
from dispo.libs.egress import EgressRefused, join
from dispo.libs.payload import PayloadError, canonical_json, fields_problem, parse_json_value
from dispo.libs.tracing import inject
from yarl import URL


@dataclass(frozen=True)
class Result:
    outcome: CallOutcome
    detail: str = ""
    # The answer's Retry-After header as sent (read against the clock when recorded).
    retry_after: str = ""
    # Not sent because its pass could not prove it holds the task's lease: says nothing
    # about the downstream (its breaker does not count it).
    fenced: bool = False
    # Not sent because its worker queue had no live worker (ADR-0101): the node is demoted,
    # as behind an open breaker.
    demoted: bool = False
    # What a successful call returned: its JSON body as canonical JSON (None: nothing).
    output: bytes | None = None


@dataclass(frozen=True)
class Call:
    task_id: str
    node_id: str
    idempotency_key: str
    spec: ActionSpec
    # The cell's payload: canonical JSON bytes, sent as they are.
    body: bytes
    # The node's attempt number as its claim counted it (``X-Dispo-Attempt``).
    attempt: int = 0


def failed(outcome: CallOutcome, detail: str, retry_after: str = "") -> Result:
    """A failed call's result; its detail starts with the class (``ambiguous: …``)."""
    return Result(outcome, failure_text(outcome, detail), retry_after)


def not_sent_without_lease() -> Result:
    """A call its pass did not send: it could not prove it still holds the task's lease."""
    return Result(
        CallOutcome.NOT_SENT,
        failure_text(CallOutcome.NOT_SENT, "the pass no longer holds the task's lease"),
        fenced=True,
    )


def not_sent_without_share() -> Result:
    """A call its executor did not send: it could not prove a share of its downstream's
    limits (ADR-0108) — no turn of its pace within a share lease, or a slot whose share
    runs out before the call's timeout would."""
    return Result(
        CallOutcome.NOT_SENT,
        failure_text(CallOutcome.NOT_SENT, "no share of the downstream's limits proven"),
        fenced=True,
    )


class LeaseNotHeld(Exception):
    """A call's fence no longer held once its connection was in hand: nothing was sent."""


# The fence of the call being made in this asyncio task (set by :func:`run_action`).
_FENCE: ContextVar[Callable[[], bool] | None] = ContextVar("fence", default=None)


class FencedConnector(aiohttp.TCPConnector):
    """Asks the call's fence once its connection is in hand, reused or new: the last moment
    before aiohttp writes the request. A fence that fails gives the connection back unused
    and raises :class:`LeaseNotHeld`. (aiohttp's trace hooks could do the same, at about
    15 us more CPU per call.)"""

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        connection = await super().connect(req, traces, timeout)
        fence = _FENCE.get()
        if fence is not None and not fence():
            connection.release()
            raise LeaseNotHeld
        return connection


def http_session(max_connections: int = 256) -> aiohttp.ClientSession:
    """The executor's client for action calls: a pool of keep-alive connections, no
    cookies kept between calls (each node's call stands alone), no proxy taken from the
    environment (the egress policy checks where a call goes, :mod:`dispo.libs.egress`),
    each call's fence asked right before it is written."""
    return aiohttp.ClientSession(
        connector=FencedConnector(limit=max_connections, limit_per_host=0),
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
    )


@functools.lru_cache(maxsize=4096)
def call_url(base_url: str, path: str) -> URL:
    """The URL a call goes to: within the downstream's origin and path prefix whatever the
    path holds (a forged envelope included), else EgressRefused; ``encoded``, so it goes
    out exactly as the egress policy checked it. Kept for the paths seen last: parsed and
    checked anew for every call, it was about 5 % of a busy executor's CPU."""
    return URL(str(join(base_url, path)), encoded=True)


async def run_action(
    client: aiohttp.ClientSession,
    call: Call,
    downstream: Downstream | None,
    fence: Callable[[], bool] | None = None,
) -> Result:
    """Make ``call``; ``fence``, when given, is asked right before the request is written
    (False: nothing is sent, the result is ``NOT_SENT``)."""
    if call.spec.kind == "noop":
        return Result(CallOutcome.SUCCESS)
    if call.spec.kind != "http":
        return failed(CallOutcome.DEFINITE, f"unknown action kind {call.spec.kind!r}")
    if downstream is None:
        return failed(
            CallOutcome.NOT_SENT,
            f"downstream {call.spec.downstream!r} is not in this executor's registry",
        )
    try:
        url = call_url(downstream.base_url, call.spec.path)
    except EgressRefused as refused:
        return failed(CallOutcome.DEFINITE, f"not sent: {refused}")
    timeout = (call.spec.timeout_ms or downstream.timeout_ms) / 1000
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": call.idempotency_key,
        "X-Dispo-Task-Id": call.task_id,
        "X-Dispo-Node-Id": call.node_id,
        "X-Dispo-Attempt": str(call.attempt),
    }
    inject(headers)  # the node run's `traceparent`, when a trace is under way
    fenced = _FENCE.set(fence)
    try:
        # ``encoded``: the URL goes out exactly as the egress policy checked it.
        async with client.request(
            call.spec.method,
            url,
            data=call.body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, connect=timeout, sock_read=timeout),
            allow_redirects=False,
        ) as response:
            outcome = classify_status(response.status)
            if outcome is CallOutcome.SUCCESS:
                return await _succeeded(response, call.spec)
            body = (await response.read()).decode("utf-8", "replace")
            retry_after = response.headers.get("Retry-After", "")
    except LeaseNotHeld:
        return not_sent_without_lease()
    except Exception as error:
        return failed(classify_error(error), describe_error(error, timeout))
    finally:
        _FENCE.reset(fenced)
    return failed(outcome, f"HTTP {response.status}: {body}", retry_after)


# A JSON answer is read up to this many times its output's limit (its canonical form, with
# no whitespace, is what the limit bounds).
_RAW_FACTOR = 4


async def _succeeded(response: aiohttp.ClientResponse, spec: ActionSpec) -> Result:
    """A 2xx answer: its JSON body is the node's output (ADR-0093), bounded by the
    action's ``max_output_bytes`` and checked against its declared fields; any other
    content type is no output. An output over its limit, or not as declared, fails the
    node definitely, saying why."""
    if response.content_type != "application/json":
        await response.read()  # the connection goes back to the pool
        return Result(CallOutcome.SUCCESS)
    limit = spec.max_output_bytes
    raw = await _read_bounded(response, limit * _RAW_FACTOR)
    if raw is None:
        response.close()  # not read to its end: the connection is not reused
        size = response.content_length
        said = f"{size} bytes" if size is not None else f"over {limit * _RAW_FACTOR} bytes"
        return failed(CallOutcome.DEFINITE, f"output of {said} is over the limit of {limit} bytes")
    if not raw.strip():
        return Result(CallOutcome.SUCCESS)
    return output_result(raw, spec)


def output_result(raw: bytes, spec: ActionSpec) -> Result:
    """The result of a call that answered ``raw`` (JSON): its canonical output, or a
    definite failure when it is not JSON Dispo carries, over its limit, or not as its
    action declares."""
    try:
        value = parse_json_value(raw)
    except PayloadError as error:
        return failed(CallOutcome.DEFINITE, f"output is not JSON Dispo records: {error}")
    output = canonical_json(value)
    if len(output) > spec.max_output_bytes:
        return failed(
            CallOutcome.DEFINITE,
            f"output of {len(output)} bytes is over the limit of {spec.max_output_bytes} bytes",
        )
    if (problem := fields_problem(value, spec.output_fields)) is not None:
        return failed(CallOutcome.DEFINITE, f"output not as declared: {problem}")
    return Result(CallOutcome.SUCCESS, output=output)


async def _read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None once it is longer than ``limit`` bytes."""
    if response.content_length is not None and response.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def describe_error(error: BaseException, timeout: float) -> str:
    """What went wrong with a call that raised, in words an operator reads in ``last_error``."""
    if isinstance(error, aiohttp.ConnectionTimeoutError):  # a free connection or a connect
        return f"connect timeout after {timeout:g}s"
    if isinstance(error, TimeoutError):  # asyncio's too
        return f"timeout after {timeout:g}s with the request under way"
    if isinstance(error, aiohttp.ClientError | OSError):
        return f"connection error: {error!r}"
    return f"action error: {error!r}"
