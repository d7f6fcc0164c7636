"""The built-in agent: calls an evaluation's target for one test case and scores the answer."""

from __future__ import annotations

import time

import httpx
from dispo.libs.egress import EgressRefused, join
from dispo.pool.domain import RunResult, TestCase
from dispo.pool.scoring import Answer, error_result, score


async def run_case(client: httpx.AsyncClient, target_url: str, case: TestCase) -> RunResult:
    started = time.monotonic()
    try:  # the target's origin whatever the case's path holds; redirects are not followed
        url = join(target_url, case.path)
    except EgressRefused as refused:
        return error_result(f"not sent: {refused}", 0)
    try:
        if case.method == "POST":
            response = await client.post(
                url,
                content=case.body.encode(),
                headers={"content-type": "application/json"},
                follow_redirects=False,
            )
        else:
            response = await client.get(url, follow_redirects=False)
    except httpx.HTTPError as error:
        return error_result(
            f"{type(error).__name__}: {error}", int((time.monotonic() - started) * 1000)
        )
    latency_ms = int((time.monotonic() - started) * 1000)
    return score(case.rules, Answer(response.status_code, response.text, latency_ms))
