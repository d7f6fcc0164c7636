"""Talking to downstreams and callers over HTTP: health checks, effect probes and signed
webhook deliveries (with the current trace context, :mod:`dispo.libs.tracing`). Each returns a plain result; none raises for a network problem.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import httpx
from dispo.libs.auth.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature_header
from dispo.libs.egress import EgressRefused, join
from dispo.libs.error_text import truncate_error
from dispo.libs.tracing import inject


@dataclass(frozen=True)
class ProbeResult:
    """``done`` True / False when the downstream answered; None when it could not say.
    ``fenced``: with done False, the downstream will refuse every request under the key up
    to the attempt the probe named, so "not done" stays true (docs/recovery.md)."""

    done: bool | None
    detail: str = ""
    fenced: bool = False


# A probe's answer is a small JSON object: what is longer is not read.
PROBE_ANSWER_LIMIT = 64 * 1024


async def probe_effect(
    client: httpx.AsyncClient,
    base_url: str,
    probe_path: str,
    idempotency_key: str,
    timeout: float,
    attempt: int = 0,
) -> ProbeResult:
    """GET the action's status probe: 200 with JSON {"done": true|false}, and optionally
    "fenced": true. It names the key (``Idempotency-Key``) and the newest attempt that may
    be under way (``X-Dispo-Attempt``), which a fencing downstream fences. The whole probe
    has one deadline (``timeout``); at most :data:`PROBE_ANSWER_LIMIT` bytes of its answer
    are read."""
    try:
        url = join(base_url, probe_path)
    except EgressRefused as refused:
        return ProbeResult(None, truncate_error(f"probe not sent: {refused}"))
    headers = {"Idempotency-Key": idempotency_key, "X-Dispo-Attempt": str(attempt)}
    try:
        async with asyncio.timeout(timeout):
            async with client.stream(
                "GET", url, timeout=timeout, headers=headers, follow_redirects=False
            ) as response:
                if response.status_code != 200:
                    return ProbeResult(None, f"probe answered HTTP {response.status_code}")
                body = await read_prefix(response, PROBE_ANSWER_LIMIT + 1)
    except TimeoutError:
        return ProbeResult(None, f"probe failed: no answer within {timeout:g}s")
    except (httpx.HTTPError, OSError) as error:
        return ProbeResult(None, truncate_error(f"probe failed: {error!r}"))
    if len(body) > PROBE_ANSWER_LIMIT:
        return ProbeResult(None, f"probe answer longer than {PROBE_ANSWER_LIMIT} bytes")
    return probe_answer(body)


def probe_answer(body: bytes) -> ProbeResult:
    """What a probe's 200 answer says (None: nonsense, it says nothing)."""
    try:
        answer = json.loads(body)
    except ValueError:
        return ProbeResult(None, "probe answer is not JSON with a 'done' field")
    if not isinstance(answer, dict):
        return ProbeResult(None, "probe answer is not JSON with a 'done' field")
    done, fenced = answer.get("done"), answer.get("fenced", False)
    if not isinstance(done, bool):
        return ProbeResult(None, "probe answer has no boolean 'done'")
    if not isinstance(fenced, bool):
        return ProbeResult(None, "probe answer's 'fenced' is not a boolean")
    if done:
        return ProbeResult(True, "probe reports done=true")
    if fenced:
        return ProbeResult(False, "probe reports done=false, fenced", fenced=True)
    return ProbeResult(False, "probe reports done=false")


async def read_prefix(response: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of ``response``'s body (a streamed response): the rest is
    never read into memory."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk[: limit - len(body)]
        if len(body) >= limit:
            break
    return bytes(body)


@dataclass(frozen=True)
class DeliveryResult:
    ok: bool
    status_code: int | None = None
    error: str = ""


async def deliver_webhook(
    client: httpx.AsyncClient,
    url: httpx.URL,
    body: bytes,
    *,
    task_id: str,
    attempt: int,
    secrets: list[str],
    timestamp: str,
    timeout: float,
) -> DeliveryResult:
    headers = {
        "Content-Type": "application/json",
        "X-Dispo-Task-Id": task_id,
        "X-Dispo-Delivery-Attempt": str(attempt),
        TIMESTAMP_HEADER: timestamp,
        # One signature per valid secret of the business, newest first (two during a
        # rotation); a receiver accepts the body if one matches a secret it holds.
        SIGNATURE_HEADER: signature_header(secrets, timestamp, body),
        # The same on every attempt: a receiver that saw it already can ignore a repeat.
        "Idempotency-Key": f"{task_id}/completion",
    }
    inject(headers)  # the callback's traceparent: a span of the task's own trace
    try:
        # A redirect is never followed: its target was not checked against the allow-list.
        response = await client.post(
            url, content=body, headers=headers, timeout=timeout, follow_redirects=False
        )
    except (httpx.HTTPError, OSError) as error:
        return DeliveryResult(False, None, truncate_error(f"delivery failed: {error!r}"))
    if 200 <= response.status_code < 300:
        return DeliveryResult(True, response.status_code)
    if response.is_redirect:
        location = response.headers.get("Location", "")
        return DeliveryResult(
            False,
            response.status_code,
            truncate_error(f"HTTP {response.status_code}: redirect to {location!r} not followed"),
        )
    return DeliveryResult(
        False, response.status_code, truncate_error(f"HTTP {response.status_code}: {response.text}")
    )
