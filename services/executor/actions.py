"""Running one node's action: the ``http`` and ``noop`` kinds, and result classification.

Every http call carries the node's stable ``Idempotency-Key`` (the same on every attempt).
2xx is success; 4xx a permanent failure except 408 and 429; 5xx, timeouts and connection
errors are retryable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import httpx
from dispo.executor.domain import ActionSpec
from dispo.libs.catalogue import Downstream
from dispo.libs.error_text import truncate_error


class CallOutcome(enum.Enum):
    SUCCESS = "success"
    PERMANENT = "permanent"
    RETRYABLE = "retryable"


@dataclass(frozen=True)
class Result:
    outcome: CallOutcome
    detail: str = ""


def classify_status(code: int) -> CallOutcome:
    if 200 <= code < 300:
        return CallOutcome.SUCCESS
    if code in (408, 429) or code >= 500:
        return CallOutcome.RETRYABLE
    return CallOutcome.PERMANENT


@dataclass(frozen=True)
class Call:
    task_id: str
    node_id: str
    idempotency_key: str
    spec: ActionSpec
    # The cell's payload: canonical JSON bytes, sent as they are.
    body: bytes


async def run_action(
    client: httpx.AsyncClient, call: Call, downstream: Downstream | None
) -> Result:
    if call.spec.kind == "noop":
        return Result(CallOutcome.SUCCESS)
    if call.spec.kind != "http":
        return Result(CallOutcome.PERMANENT, f"unknown action kind {call.spec.kind!r}")
    if downstream is None:
        return Result(
            CallOutcome.RETRYABLE,
            f"downstream {call.spec.downstream!r} is not in this executor's registry",
        )
    timeout = (call.spec.timeout_ms or downstream.timeout_ms) / 1000
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": call.idempotency_key,
        "X-Dispo-Task-Id": call.task_id,
        "X-Dispo-Node-Id": call.node_id,
    }
    try:
        response = await client.request(
            call.spec.method,
            downstream.base_url.rstrip("/") + call.spec.path,
            content=call.body,
            headers=headers,
            timeout=timeout,
        )
    except httpx.TimeoutException:
        return Result(CallOutcome.RETRYABLE, f"timeout after {timeout:g}s")
    except (httpx.TransportError, OSError) as error:
        return Result(CallOutcome.RETRYABLE, truncate_error(f"connection error: {error!r}"))
    outcome = classify_status(response.status_code)
    detail = (
        ""
        if outcome is CallOutcome.SUCCESS
        else truncate_error(f"HTTP {response.status_code}: {response.text}")
    )
    return Result(outcome, detail)
