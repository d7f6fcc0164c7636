"""Talking to downstreams and callers over HTTP: health checks, effect probes and signed
webhook deliveries (with the current trace context, :mod:`dispo.libs.tracing`). Each returns a plain result; none raises for a network problem.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from dispo.libs.auth.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature_header
from dispo.libs.egress import EgressRefused, join
from dispo.libs.error_text import ERROR_TEXT_LIMIT, truncate_error
from dispo.libs.tracing import inject
from dispo.reconciler.http_client import read_prefix


@dataclass(frozen=True)
class ProbeResult:
    """``done`` True / False when the downstream answered; None when it could not say."""

    done: bool | None
    detail: str = ""


async def probe_effect(
    client: httpx.AsyncClient, base_url: str, probe_path: str, idempotency_key: str, timeout: float
) -> ProbeResult:
    """GET the action's status probe: 200 with JSON {"done": true|false}."""
    try:
        url = join(base_url, probe_path)
    except EgressRefused as refused:
        return ProbeResult(None, truncate_error(f"probe not sent: {refused}"))
    try:
        response = await client.get(
            url,
            timeout=timeout,
            headers={"Idempotency-Key": idempotency_key},
            follow_redirects=False,
        )
    except (httpx.HTTPError, OSError) as error:
        return ProbeResult(None, truncate_error(f"probe failed: {error!r}"))
    if response.status_code != 200:
        return ProbeResult(None, f"probe answered HTTP {response.status_code}")
    try:
        done = response.json().get("done")
    except (ValueError, AttributeError):
        return ProbeResult(None, "probe answer is not JSON with a 'done' field")
    if not isinstance(done, bool):
        return ProbeResult(None, "probe answer has no boolean 'done'")
    return ProbeResult(done, f"probe reports done={str(done).lower()}")


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
        # The answer is streamed: a 2xx one is not read at all (nothing in it is used), a
        # refusal's only up to what its recorded error can hold.
        async with client.stream(
            "POST", url, content=body, headers=headers, timeout=timeout, follow_redirects=False
        ) as response:
            if 200 <= response.status_code < 300:
                return DeliveryResult(True, response.status_code)
            if response.is_redirect:
                location = response.headers.get("Location", "")
                return DeliveryResult(
                    False,
                    response.status_code,
                    truncate_error(
                        f"HTTP {response.status_code}: redirect to {location!r} not followed"
                    ),
                )
            # UTF-8 takes at most 4 bytes a character: enough for the error text's limit.
            prefix = await read_prefix(response, 4 * ERROR_TEXT_LIMIT)
    except (httpx.HTTPError, OSError) as error:
        return DeliveryResult(False, None, truncate_error(f"delivery failed: {error!r}"))
    text = prefix.decode(response.encoding or "utf-8", errors="replace")
    return DeliveryResult(
        False, response.status_code, truncate_error(f"HTTP {response.status_code}: {text}")
    )
