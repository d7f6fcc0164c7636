"""Running one node's action: the ``http`` and ``noop`` kinds.

Every http call carries the node's stable ``Idempotency-Key`` (the same on every attempt),
and the node run's ``traceparent`` where a trace is under way (:mod:`dispo.libs.tracing`).
Its answer or transport error is classified by :mod:`dispo.executor.failures`: whether the
call may have had its effect decides whether it may be sent again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import aiohttp
from dispo.executor.domain import ActionSpec
from dispo.executor.failures import CallOutcome, classify_error, classify_status, failure_text
from dispo.libs.catalogue import Downstream
from dispo.libs.egress import EgressRefused, join
from dispo.libs.tracing import inject
from yarl import URL


@dataclass(frozen=True)
class Result:
    outcome: CallOutcome
    detail: str = ""
    # The answer's Retry-After header as sent (read against the clock when recorded).
    retry_after: str = ""


@dataclass(frozen=True)
class Call:
    task_id: str
    node_id: str
    idempotency_key: str
    spec: ActionSpec
    # The cell's payload: canonical JSON bytes, sent as they are.
    body: bytes


def failed(outcome: CallOutcome, detail: str, retry_after: str = "") -> Result:
    """A failed call's result; its detail starts with the class (``ambiguous: …``)."""
    return Result(outcome, failure_text(outcome, detail), retry_after)


def http_session(max_connections: int = 256) -> aiohttp.ClientSession:
    """The executor's client for action calls: a pool of keep-alive connections, no
    cookies kept between calls (each node's call stands alone), no proxy taken from the
    environment (the egress policy checks where a call goes, :mod:`dispo.libs.egress`)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=max_connections, limit_per_host=0),
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
    client: aiohttp.ClientSession, call: Call, downstream: Downstream | None
) -> Result:
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
    }
    inject(headers)  # the node run's `traceparent`, when a trace is under way
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
                await response.read()  # the connection goes back to the pool
                return Result(outcome)
            body = (await response.read()).decode("utf-8", "replace")
            retry_after = response.headers.get("Retry-After", "")
    except Exception as error:
        return failed(classify_error(error), describe_error(error, timeout))
    return failed(outcome, f"HTTP {response.status}: {body}", retry_after)


def describe_error(error: BaseException, timeout: float) -> str:
    """What went wrong with a call that raised, in words an operator reads in ``last_error``."""
    if isinstance(error, aiohttp.ConnectionTimeoutError):  # a free connection or a connect
        return f"connect timeout after {timeout:g}s"
    if isinstance(error, TimeoutError):  # asyncio's too
        return f"timeout after {timeout:g}s with the request under way"
    if isinstance(error, aiohttp.ClientError | OSError):
        return f"connection error: {error!r}"
    return f"action error: {error!r}"
