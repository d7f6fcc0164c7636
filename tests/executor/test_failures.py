"""The classification of a failed call (dispo.executor.failures) on its own: the table of
answers, what each class means for a node, and the transport errors as real sockets and a
real HTTP server produce them."""

from __future__ import annotations

import asyncio
import random
import socket
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import pytest
from aiohttp import web
from dispo.executor.actions import Call, http_session, run_action
from dispo.executor.demo_downstream.app import reset_connection
from dispo.executor.domain import ActionSpec, RetryPolicy
from dispo.executor.failures import (
    MAX_RETRY_AFTER,
    CallOutcome,
    Verdict,
    breaker_counts,
    classify_status,
    next_move,
    verdict,
)
from dispo.libs.catalogue import Downstream

NOW = datetime(2026, 1, 1, tzinfo=UTC)
C = CallOutcome


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (200, C.SUCCESS),
        (201, C.SUCCESS),
        (204, C.SUCCESS),
        (301, C.DEFINITE),
        (400, C.DEFINITE),
        (401, C.DEFINITE),
        (404, C.DEFINITE),
        (409, C.DEFINITE),
        (422, C.DEFINITE),
        (408, C.REFUSED),
        (429, C.REFUSED),
        (503, C.REFUSED),
        (500, C.AMBIGUOUS),
        (502, C.AMBIGUOUS),
        (504, C.AMBIGUOUS),
        (507, C.AMBIGUOUS),
        (501, C.DEFINITE),
        (505, C.DEFINITE),
    ],
)
def test_answers_are_classified_by_what_they_say_about_the_effect(code, outcome):
    assert classify_status(code) is outcome


@pytest.mark.parametrize(
    ("outcome", "idempotent", "expected"),
    [
        (C.SUCCESS, False, Verdict.SUCCEEDED),
        (C.SUCCESS, True, Verdict.SUCCEEDED),
        (C.NOT_SENT, False, Verdict.RETRY),
        (C.NOT_SENT, True, Verdict.RETRY),
        (C.REFUSED, False, Verdict.RETRY),
        (C.REFUSED, True, Verdict.RETRY),
        (C.DEFINITE, False, Verdict.FAILED),
        (C.DEFINITE, True, Verdict.FAILED),
        (C.AMBIGUOUS, True, Verdict.RETRY),
        (C.AMBIGUOUS, False, Verdict.UNKNOWN),
    ],
)
def test_only_an_ambiguous_call_of_a_non_idempotent_action_is_unknown(
    outcome, idempotent, expected
):
    assert verdict(outcome, idempotent) is expected


def test_a_definite_failure_says_nothing_about_the_downstreams_health():
    assert breaker_counts(C.SUCCESS) is True
    assert breaker_counts(C.DEFINITE) is None
    assert all(breaker_counts(o) is False for o in (C.NOT_SENT, C.REFUSED, C.AMBIGUOUS))


POLICY = RetryPolicy(max_retries=3, base_delay=0.5, max_delay=30.0, jitter=0.0)


def test_a_retry_waits_its_backoff_or_the_longer_retry_after():
    def wait(retry_after: str, attempt: int = 1) -> float:
        move = next_move(C.REFUSED, False, attempt, POLICY, NOW, retry_after)
        assert move.verdict is Verdict.RETRY and move.retryable and not move.unknown
        assert move.not_before is not None
        return (move.not_before - NOW).total_seconds()

    assert wait("") == 0.5  # no Retry-After: the backoff
    assert wait("", attempt=3) == 2.0
    assert wait("7") == 7.0  # seconds, longer than the backoff
    assert wait("0", attempt=3) == 2.0  # shorter: the backoff still holds
    assert wait(format_datetime(NOW + timedelta(seconds=90), usegmt=True)) == 90.0  # a date
    assert wait(format_datetime(NOW - timedelta(seconds=90), usegmt=True)) == 0.5  # past
    assert wait("soon") == 0.5  # unreadable: ignored
    assert wait(str(10**9)) == MAX_RETRY_AFTER  # bounded


def test_retries_over_the_budget_fail_retryable_and_a_definite_failure_is_permanent():
    for outcome, idempotent in ((C.NOT_SENT, False), (C.REFUSED, True), (C.AMBIGUOUS, True)):
        move = next_move(outcome, idempotent, POLICY.max_retries + 1, POLICY, NOW)
        assert (move.verdict, move.retryable, move.unknown) == (Verdict.FAILED, True, False)
    move = next_move(C.DEFINITE, False, 1, POLICY, NOW)
    assert (move.verdict, move.retryable) == (Verdict.FAILED, False)


def test_an_ambiguous_call_goes_through_unknown_and_only_an_idempotent_one_is_retried():
    rng = random.Random(1)
    idempotent = next_move(C.AMBIGUOUS, True, 1, POLICY, NOW, rng=rng)
    assert idempotent.verdict is Verdict.RETRY and idempotent.unknown
    assert idempotent.not_before == NOW + timedelta(seconds=0.5)
    # Not idempotent: UNKNOWN whatever the budget says, never a retry.
    for attempt in (1, POLICY.max_retries + 1):
        other = next_move(C.AMBIGUOUS, False, attempt, POLICY, NOW, "1")
        assert (other.verdict, other.unknown, other.not_before) == (Verdict.UNKNOWN, True, None)


# ---- transport errors, as real sockets produce them -------------------------------------


def call(path: str = "/effect", timeout_ms: int = 2000) -> Call:
    spec = ActionSpec("http", "d", "POST", path, timeout_ms=timeout_ms)
    return Call("t", "n.call", "t/n.call", spec, b"{}")


def downstream(url: str) -> Downstream:
    return Downstream("d", url, timeout_ms=2000)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with http_session() as client:
        yield client


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def full_backlog() -> Iterator[int]:
    """A port that listens but whose accept queue is full: a connect never completes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    yield port
    for s in (*fillers, listener):
        s.close()


async def test_connection_refused_dns_failure_and_connect_timeout_are_not_sent(
    http, closed_port, full_backlog
):
    refused = await run_action(http, call(), downstream(f"http://127.0.0.1:{closed_port}"))
    assert refused.outcome is C.NOT_SENT and refused.detail.startswith("not sent: connection")
    dns = await run_action(http, call(), downstream("http://nowhere.invalid"))
    assert dns.outcome is C.NOT_SENT, dns.detail
    await asyncio.sleep(0.1)  # the fillers' handshakes are in the queue
    connect = await run_action(
        http, call(timeout_ms=300), downstream(f"http://127.0.0.1:{full_backlog}")
    )
    assert connect.outcome is C.NOT_SENT and "connect timeout" in connect.detail, connect.detail
    unregistered = await run_action(http, call(), None)
    assert unregistered.outcome is C.NOT_SENT


async def test_no_answer_after_the_request_went_out_is_ambiguous(http, fake_server):
    arrived: list[str] = []
    answer = asyncio.Event()  # set once the caller gave up: the server then stops at once

    async def late(request: web.Request) -> web.Response:
        arrived.append(request.path)
        await answer.wait()  # the effect is done; the answer comes too late
        return web.json_response({})

    async def reset(request: web.Request) -> web.StreamResponse:
        arrived.append(request.path)
        return reset_connection(request)  # RST before any answer

    async def closed(request: web.Request) -> web.StreamResponse:
        arrived.append(request.path)
        assert request.transport is not None
        request.transport.close()  # FIN before any answer
        return web.Response()

    server = await fake_server(
        {("POST", "/late"): late, ("POST", "/reset"): reset, ("POST", "/closed"): closed}
    )
    d = downstream(server.url)
    try:
        timed_out = await run_action(http, call("/late", timeout_ms=300), d)
    finally:
        answer.set()
    assert timed_out.outcome is C.AMBIGUOUS and "timeout after 0.3s" in timed_out.detail
    for path in ("/reset", "/closed"):
        result = await run_action(http, call(path), d)
        assert result.outcome is C.AMBIGUOUS, (path, result.detail)
        assert result.detail.startswith("ambiguous: connection error"), result.detail
    assert arrived == ["/late", "/reset", "/closed"]  # each request did reach the server


async def test_answers_carry_their_class_detail_and_retry_after(http, fake_server):
    async def busy(request: web.Request) -> web.Response:
        return web.json_response({"error": "busy"}, status=429, headers={"Retry-After": "12"})

    async def broken(request: web.Request) -> web.Response:
        return web.json_response({"error": "boom"}, status=502)

    async def fine(request: web.Request) -> web.Response:
        return web.json_response({})

    server = await fake_server(
        {("POST", "/busy"): busy, ("POST", "/broken"): broken, ("POST", "/fine"): fine}
    )
    d = downstream(server.url)
    refused = await run_action(http, call("/busy"), d)
    assert (refused.outcome, refused.retry_after) == (C.REFUSED, "12")
    assert refused.detail.startswith("refused: HTTP 429")
    ambiguous = await run_action(http, call("/broken"), d)
    assert ambiguous.outcome is C.AMBIGUOUS and ambiguous.detail.startswith("ambiguous: HTTP 502")
    assert (await run_action(http, call("/fine"), d)).outcome is C.SUCCESS
    kind = await run_action(http, Call("t", "n", "k", ActionSpec("ftp"), b""), d)
    assert kind.outcome is C.DEFINITE
