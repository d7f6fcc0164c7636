"""The built-in agent: calls an evaluation's target for one test case and scores the answer.

One run has one deadline for the whole call (connect, request, every byte of the answer):
a target answering a byte at a time cannot hold a cron longer than that.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from dispo.libs.egress import EgressRefused, join
from dispo.pool.domain import RunResult, TestCase
from dispo.pool.scoring import Answer, error_result, score


async def run_case(
    client: httpx.AsyncClient, target_url: str, case: TestCase, deadline: float
) -> RunResult:
    """One run of ``case``; a call not answered in full within ``deadline`` seconds fails."""
    started = time.monotonic()

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:  # the target's origin whatever the case's path holds; redirects are not followed
        url = join(target_url, case.path)
    except EgressRefused as refused:
        return error_result(f"not sent: {refused}", 0)
    try:
        async with asyncio.timeout(deadline):
            if case.method == "POST":
                response = await client.post(
                    url,
                    content=case.body.encode(),
                    headers={"content-type": "application/json"},
                    follow_redirects=False,
                )
            else:
                response = await client.get(url, follow_redirects=False)
    except TimeoutError:
        return error_result(f"no complete answer within the {deadline:g} s deadline", elapsed_ms())
    except httpx.HTTPError as error:
        return error_result(f"{type(error).__name__}: {error}", elapsed_ms())
    latency_ms = elapsed_ms()
    return score(case.rules, Answer(response.status_code, response.text, latency_ms))
