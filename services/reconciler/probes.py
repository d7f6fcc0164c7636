"""Talking to downstreams and callers over HTTP: health checks, effect probes and signed
webhook deliveries (with the current trace context, :mod:`dispo.libs.tracing`); and the
probes of worker nodes, which the executor asks the workers of their queues (ADR-0100,
:class:`WorkerProber`). Each returns a plain result; none raises for a network problem.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import grpc
import httpx
from dispo.auth.signing import SIGNATURE_HEADER, TIMESTAMP_HEADER, signature_header
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.egress import EgressRefused, join
from dispo.libs.error_text import ERROR_TEXT_LIMIT, truncate_error
from dispo.libs.tracing import inject
from dispo.reconciler.http_client import ANSWER_LIMIT, read_prefix


@dataclass(frozen=True)
class ProbeResult:
    """``done`` True / False when the downstream answered; None when it could not say.
    ``fenced``: with done False, the downstream will refuse every request under the key up
    to the attempt the probe named, so "not done" stays true (docs/recovery.md)."""

    done: bool | None
    detail: str = ""
    fenced: bool = False


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
    has one deadline (``timeout``); the client reads a bounded prefix of its answer
    (:mod:`dispo.reconciler.http_client`)."""
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
                body = await read_prefix(response, ANSWER_LIMIT + 1)  # past it: AnswerTooLong
    except TimeoutError:
        return ProbeResult(None, f"probe failed: no answer within {timeout:g}s")
    except (httpx.HTTPError, OSError) as error:
        return ProbeResult(None, truncate_error(f"probe failed: {error!r}"))
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


class WorkerProber:
    """``ExecutorService.ProbeWorkerNode`` on ``channel`` (carrying the reconciler's service
    token): the executor offers a probe run on the node's queue and waits up to ``wait``
    seconds for a worker's answer; the call's deadline leaves it a margin."""

    MARGIN = 5.0

    def __init__(self, channel: grpc.aio.Channel, wait: float) -> None:
        self.stub = executor_pb2_grpc.ExecutorServiceStub(channel)
        self.wait = wait

    async def probe(self, task_id: str, node_id: str) -> ProbeResult:
        try:
            reply = await self.stub.ProbeWorkerNode(
                executor_pb2.ProbeWorkerNodeRequest(
                    task_id=task_id, node_id=node_id, wait_ms=int(self.wait * 1000)
                ),
                timeout=self.wait + self.MARGIN,
            )
        except grpc.aio.AioRpcError as error:
            return ProbeResult(
                None,
                truncate_error(
                    f"probe not answered: the executor's ProbeWorkerNode answered"
                    f" {error.code().name}: {error.details()}"
                ),
            )
        if reply.answer == executor_pb2.PROBE_ANSWER_DONE:
            return ProbeResult(True, reply.detail)
        if reply.answer == executor_pb2.PROBE_ANSWER_NOT_DONE:
            return ProbeResult(False, reply.detail, fenced=reply.fenced)
        return ProbeResult(None, truncate_error(reply.detail))


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
