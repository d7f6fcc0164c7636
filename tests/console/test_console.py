"""The web console in a real browser (Debian's headless Chromium, driven by Playwright) against
real gateway, executor, reconciler, pool and intelligence processes and the console process in
front of them: signing in (and out, a revoked token signing the browser out of an open list),
the Tasks page kept live, a task's DAG as Cytoscape draws it, resuming a failed task from its
page, abandoning one from the Failed page and resuming parked ones by filter, pausing a
downstream, an evaluation running on the pool's one cron (its worker spawned by the pool,
calling a target the test holds open) and others queued, boosted, paused and cancelled on the
Cron pool page, analysis and comparison jobs on the Intelligence page (the intelligence
service runs on a stand-in model server). The run takes the screenshots of
docs/screenshots/, written to a scratch folder unless ``--screenshots docs/screenshots``
(``.ci/screenshots``) asks to refresh those."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from dispo.console.backend import Backend
from dispo.console.settings import ConsoleSettings
from dispo.libs.api.auth.v1 import auth_pb2, auth_pb2_grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import catalogue_pb2 as gpb_catalogue
from dispo.libs.api.gateway.v1 import catalogue_pb2_grpc as gpb_catalogue_grpc
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as ipb
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
from dispo.libs.api.pool.v1 import pool_pb2 as ppb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as rpb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.process import ManagedProcess, ProcessSpec, free_port, python_module
from dispo.sdk import CellSpec
from pipeline_fixtures import TEST_CATALOGUE, Pipeline
from playwright.async_api import Browser, BrowserContext, Page, expect
from support.auth import admin_channel, business_token
from support.browser import chromium
from support.http import FakeServer
from support.waiting import eventually

# Every task status, as the counts panel names them.
STATUSES = [common_pb2.TaskStatus.Name(v).removeprefix("TASK_STATUS_") for v in range(1, 8)]
# The documentation's pictures, which only a deliberate refresh rewrites (.ci/screenshots).
PICTURES = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
BUSINESS = "console-shop"
# What the stand-in analysis model answers every request with.
NARRATIVE = "Half the runs passed; c2 fails its rules."


class Console:
    def __init__(
        self,
        url: str,
        pipeline: Pipeline,
        downstream: Any,
        pool: str,
        intelligence: str,
        target: HeldTarget,
        reconciler: str = "",
    ) -> None:
        self.url = url
        self.pipeline = pipeline
        self.downstream = downstream
        self.pool = pool
        self.intelligence = intelligence
        self.target = target
        self.reconciler = reconciler


class HeldTarget:
    """A real HTTP server playing the system the pool's evaluations call (a party outside
    Dispo): it answers 200 at once, or, while held, keeps each call open until released."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.released.set()
        self.waiting = 0
        self.server = FakeServer({("*", "/{tail:.*}"): self._answer})

    @property
    def url(self) -> str:
        return self.server.url

    def hold(self) -> None:
        self.released = asyncio.Event()

    def release(self) -> None:
        self.released.set()

    async def _answer(self, request: web.Request) -> web.Response:
        released = self.released
        self.waiting += 1
        try:
            await released.wait()
        finally:
            self.waiting -= 1
        return web.json_response({"ok": True})


@pytest.fixture(scope="module")
async def analysis_model() -> AsyncIterator[str]:
    """An OpenAI-compatible model server (a party outside Dispo) answering :data:`NARRATIVE`;
    its base URL."""

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        message = {"role": "assistant", "content": NARRATIVE}
        choice = {"index": 0, "finish_reason": "stop", "message": message}
        return web.json_response({"id": "c-1", "model": body["model"], "choices": [choice]})

    server = FakeServer({("POST", "/v1/chat/completions"): completions})
    await server.start()
    yield f"{server.url}/v1"
    await server.stop()


@pytest.fixture(scope="module")
async def target() -> AsyncIterator[HeldTarget]:
    found = HeldTarget()
    await found.server.start()
    yield found
    found.release()
    await found.server.stop()


@pytest.fixture(scope="module")
async def console(
    module_services, module_downstream, analysis_model, target, tmp_path_factory
) -> Console:
    folder = tmp_path_factory.mktemp("console")
    catalogue = folder / "catalogue.yaml"
    # A declared worker queue no worker serves: the Downstreams page lists it.
    queues = "queues:\n  reviews:\n    max_concurrency: 3\n"
    catalogue.write_text(TEST_CATALOGUE.format(url=module_downstream.url) + queues)
    # Parked tasks wait an hour for their automatic redrive: only an operator redrives them.
    recovery = folder / "recovery.yaml"
    recovery.write_text(
        json.dumps({"redrive": {"default": {"base_delay": 3600, "max_delay": 3600, "jitter": 0}}})
    )
    pipeline = Pipeline(module_services.start, catalogue, module_downstream.url)
    model = {"name": "stand-in", "base_url": analysis_model, "model": "stand-in-1"}
    _, _, reconciler, pool, intelligence = await asyncio.gather(
        pipeline.start_gateway(),
        pipeline.start_executor(),
        module_services.start(
            "reconciler",
            {"DISPO_CATALOGUE": str(catalogue), "DISPO_RECONCILER_CONFIG": str(recovery)},
        ),
        # One cron, run by the worker the pool spawns: what it holds, the rest waits for.
        module_services.start(
            "pool",
            {
                "DISPO_EGRESS_ALLOW": f"{module_downstream.url},{target.url}",
                "DISPO_POOL_LOCAL_REGISTRY": str(folder / "registry.sqlite"),
                "DISPO_POOL_SPAWN_WORKER": "true",
                "DISPO_POOL_MIN_SIZE": "1",
                "DISPO_POOL_MAX_SIZE": "1",
            },
        ),
        module_services.start(
            "intelligence",
            {
                "DISPO_INTELLIGENCE_MODELS": json.dumps([model]),
                "DISPO_INTELLIGENCE_DEFAULT_ANALYSIS_MODEL": "stand-in",
            },
        ),
    )
    port = free_port()
    process = ManagedProcess(
        ProcessSpec(
            "console",
            python_module("dispo.console"),
            {
                "DISPO_CONSOLE_PORT": str(port),
                "DISPO_CONSOLE_GATEWAY_ADDRESS": pipeline.gateway.address,
                "DISPO_CONSOLE_RECONCILER_ADDRESS": reconciler.address,
                "DISPO_CONSOLE_EXECUTOR_ADDRESS": pipeline.executors[0].address,
                "DISPO_CONSOLE_POOL_ADDRESS": pool.address,
                "DISPO_CONSOLE_INTELLIGENCE_ADDRESS": intelligence.address,
                "DISPO_CONSOLE_REFRESH_SECONDS": "0.3",
            },
            None,
            folder / "console.log",
            http_health=f"http://127.0.0.1:{port}/healthz",
        )
    )
    process.spawn()
    module_services.started.append(process)  # killed with the services
    await process.wait_ready()
    return Console(
        f"http://127.0.0.1:{port}",
        pipeline,
        module_downstream,
        pool.address,
        intelligence.address,
        target,
        reconciler.address,
    )


@pytest.fixture(scope="module", autouse=True)
def pictures_before() -> dict[str, bytes]:
    """The documentation's pictures as the run found them (before its first test)."""
    return {p.name: p.read_bytes() for p in sorted(PICTURES.glob("*.png"))}


@pytest.fixture(scope="module")
def screenshots(request, tmp_path_factory, pictures_before) -> Path:
    """Where this run's screenshots go: a scratch folder, unless ``--screenshots`` names one
    (``docs/screenshots`` to refresh the documentation's pictures, ``.ci/screenshots``)."""
    chosen = request.config.getoption("screenshots")
    if not chosen:
        return tmp_path_factory.mktemp("screenshots")
    folder = Path(chosen).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as found:
        yield found


class Watched:
    """A page and what went wrong in it: console errors and uncaught exceptions."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.on("dialog", lambda d: asyncio.ensure_future(d.accept()))  # the confirmations


async def signed_in(browser: Browser, console: Console, token: str) -> BrowserContext:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    await context.add_cookies([{"name": "dispo_token", "value": token, "url": console.url}])
    return context


async def graph(page: Page) -> dict[str, Any]:
    """The DAG as the page's Cytoscape model holds it: each node's status, and the edges."""
    model: dict[str, Any] = await page.evaluate(
        """() => ({
            nodes: Object.fromEntries(window.dagGraph.nodes().map(n => [n.id(), n.data('status')])),
            edges: window.dagGraph.edges().map(e => [e.source().id(), e.target().id()]).sort(),
        })"""
    )
    return model


async def test_signing_in_with_a_token_and_out_and_a_refused_token(browser, console):
    context = await browser.new_context()
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/tasks")
    assert page.url == f"{console.url}/login"  # no token yet
    assert await page.locator("#problem").count() == 0  # nothing went wrong yet
    await page.fill("input[name=token]", "not-a-token")
    await page.click("button[type=submit]")
    # the gateway refused it: signed out again, and told so
    assert page.url == f"{console.url}/login?why=refused"
    await expect(page.locator("#problem")).to_contain_text("The services refused that token")
    assert not await context.cookies()

    await page.fill("input[name=token]", console.pipeline.token)
    await page.click("button[type=submit]")
    assert page.url == f"{console.url}/tasks"
    await page.wait_for_selector("#counts [data-status=SUCCEEDED]")
    await page.click("text=Sign out")
    assert page.url == f"{console.url}/login"  # signed out on purpose: nothing to say
    assert await page.locator("#problem").count() == 0
    assert watched.errors == []
    await context.close()


async def test_a_submitted_task_appears_live_and_its_graph_shows_its_nodes(
    browser, console, module_database, screenshots
):
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/tasks")
    searched = Watched(await context.new_page())  # a search by idempotency key, open before
    await searched.page.goto(f"{console.url}/tasks?key=k-1")
    assert await searched.page.locator("tr[data-task]").count() == 0
    first = CellSpec("step", {"name": "console-first"}, ref="first")
    second = CellSpec("step", {"name": "console-second"}, ref="second").after(first)
    done = CellSpec("noop", ref="done").after(first, second)
    async with console.pipeline.client() as client:
        submitted = await client.submit(BUSINESS, [first, second, done], idempotency_key="k-1")
        await client.wait(submitted.task_id)

    # The page was open before the task existed: it comes in on the live feed, SUCCEEDED.
    row = page.locator(f"tr[data-task='{submitted.task_id}']")
    await row.locator("text=SUCCEEDED").wait_for()
    succeeded = page.locator("#counts [data-status=SUCCEEDED]")
    assert int(await succeeded.get_attribute("data-count") or 0) >= 1
    await page.screenshot(path=screenshots / "tasks.png")
    # The key's search finds the task, live, and counts it exactly: one SUCCEEDED, no other.
    await expect(searched.page.locator(f"tr[data-task='{submitted.task_id}']")).to_have_count(1)
    await expect(searched.page.locator("tr[data-task]")).to_have_count(1)
    counted = searched.page.locator("#counts [data-status=SUCCEEDED]")
    await expect(counted).to_have_attribute("data-count", "1")
    counts = searched.page.locator("#counts [data-status]")
    assert {
        await c.get_attribute("data-status"): await c.get_attribute("data-count")
        for c in await counts.all()
    } == {s: "1" if s == "SUCCEEDED" else "0" for s in STATUSES}
    assert searched.errors == []
    await searched.page.close()

    await row.locator("a").click()
    await page.wait_for_function("() => window.dagGraph !== undefined")
    assert await graph(page) == {
        "nodes": {"first.call": "SUCCEEDED", "second.call": "SUCCEEDED", "done.noop": "SUCCEEDED"},
        "edges": [
            ["first.call", "done.noop"],
            ["first.call", "second.call"],
            ["second.call", "done.noop"],
        ],
    }
    assert await page.locator("#task-status").inner_text() == "SUCCEEDED"
    assert "k-1" in await page.locator("#detail").inner_text()  # the idempotency key
    # the gateway records the finish as the task's status reaches it: shown once it has
    await expect(page.locator("#facts")).to_contain_text("finished")
    await page.screenshot(path=screenshots / "task.png", full_page=True)

    # Searched by its id, by its business; another business's token sees none of it.
    await page.goto(f"{console.url}/tasks?q={submitted.task_id}")
    assert await page.locator("tr[data-task]").count() == 1
    assert await page.locator("#counts [data-count='1']").all_inner_texts() == ["SUCCEEDED 1"]
    await page.goto(f"{console.url}/tasks?q={BUSINESS}&status=FAILED")
    assert await page.locator(f"tr[data-task='{submitted.task_id}']").count() == 0
    assert watched.errors == []
    await context.close()

    _, other = await business_token(module_database, "console-other")
    context = await signed_in(browser, console, other)
    page = await context.new_page()
    await page.goto(f"{console.url}/tasks")
    assert await page.locator(f"tr[data-task='{submitted.task_id}']").count() == 0
    reply = await page.goto(f"{console.url}/tasks/{submitted.task_id}")
    assert reply is not None and reply.status in (403, 404)
    await context.close()


async def test_tasks_are_searched_by_label_and_a_tasks_labels_link_to_that_search(browser, console):
    async with console.pipeline.client() as client:
        labelled = [
            await client.submit(BUSINESS, [CellSpec("noop", {})], labels={"campaign": "c-9"})
            for _ in range(2)
        ]
        await client.submit(BUSINESS, [CellSpec("noop", {})], labels={"campaign": "c-10"})
    context = await signed_in(browser, console, console.pipeline.token)
    page = Watched(await context.new_page()).page
    await page.goto(f"{console.url}/tasks?labels=campaign%3Dc-9")
    rows = page.locator("#rows tr[data-task]")
    assert {await r.get_attribute("data-task") for r in await rows.all()} == {
        t.task_id for t in labelled
    }
    assert "campaign=c-9" in await rows.first.inner_text()
    assert await page.locator("input[name=labels]").input_value() == "campaign=c-9"

    await page.goto(f"{console.url}/tasks/{labelled[0].task_id}")
    await page.locator("#labels a", has_text="campaign=c-9").click()
    await page.wait_for_url("**/tasks?labels=campaign%3Dc-9")
    assert await page.locator("#rows tr[data-task]").count() == 2

    refused = await page.goto(f"{console.url}/tasks?labels=campaign")
    assert refused is not None and refused.status == 400
    assert "key=value" in await page.locator("main").inner_text()
    await context.close()


async def test_an_open_task_page_reads_the_history_again_only_when_the_task_moved(console):
    """The Task page's live feed looks at the task every refresh; it reads the status
    stream (ListTaskEvents) again only when the task's version moved since its last look."""
    backend = Backend(
        ConsoleSettings(
            gateway_address=console.pipeline.gateway.address,
            reconciler_address=console.reconciler,
            executor_address=console.pipeline.executors[0].address,
            pool_address=console.pool,
            intelligence_address=console.intelligence,
        )
    )
    reads: list[str] = []
    list_events = backend.gateway.ListTaskEvents

    def counted(request, **kwargs):
        reads.append(request.task_id)
        return list_events(request, **kwargs)

    backend.gateway.ListTaskEvents = counted
    token = console.pipeline.token
    try:
        async with console.pipeline.client() as client:
            task = await client.submit(BUSINESS, [CellSpec("noop", {})])
            await client.wait(task.task_id)
        first = await backend.task(token, task.task_id)
        again = await backend.task(token, task.task_id, first)
        assert reads == [task.task_id] and again.events is first.events
        assert again.task.version == first.task.version and first.events.events
        # A page that last saw an older version reads the history again.
        older = dataclasses.replace(
            first, task=dataclasses.replace(first.task, version=first.task.version - 1)
        )
        moved = await backend.task(token, task.task_id, older)
        assert reads == [task.task_id] * 2 and moved.events == first.events
    finally:
        await backend.close()


async def test_a_task_page_shows_each_nodes_output_folded_when_long_and_the_result(
    browser, console
):
    """What each node returned, and the task's result: a short output whole, a long one by
    its beginning, unfolded by a click (no script of the page's own: the CSP holds)."""
    long = "y" * 400
    await console.downstream.control(answer={"path": "/step/console-long", "body": {"blob": long}})
    async with console.pipeline.client() as client:
        task = await client.submit(
            BUSINESS,
            [
                CellSpec("ticket", {"name": "console"}, ref="t"),
                CellSpec("step", {"name": "console-long"}, ref="s"),
            ],
        )
        done = await client.wait(task.task_id)
    ticket = done.node("t.open").output["ticket_id"]
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/tasks/{task.task_id}")
    opened = page.locator("tr[data-node='t.open'] td.output")
    assert ticket in await opened.inner_text()
    folded = page.locator("tr[data-node='s.call'] td.output details")
    assert long not in await folded.inner_text()  # closed: its summary only
    await folded.locator("summary").click()
    await expect(folded.locator("pre")).to_contain_text(long)
    result = page.locator("#result details")  # longer than 200 characters: folded too
    assert ticket in (await result.text_content() or "")
    assert not watched.errors, watched.errors
    await context.close()


async def test_a_waiting_node_offers_its_choices_and_a_confirmed_one_ends_the_wait(
    browser, console
):
    """A review WAITING shows the choices its wait action declares (approve, reject) as
    buttons; a confirmed click sends the declared payload as a signal, once, and what
    follows the review runs with it."""
    async with console.pipeline.client() as client:
        task = await client.submit(
            BUSINESS,
            [
                CellSpec("review", {"name": "console-review"}, ref="review"),
                CellSpec("noop", {}, ref="after", depends_on=["review"]),
            ],
        )
        await eventually(
            lambda: client.get(task.task_id),
            lambda view: view.node("review.verdict").status == "WAITING",
            wanted="the review WAITING",
        )
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/tasks/{task.task_id}")
    buttons = page.locator("tr[data-node='review.verdict'] button.choice")
    assert await buttons.all_inner_texts() == ["approve", "reject"]
    assert await page.locator("tr[data-node='after.noop'] button.choice").count() == 0
    await buttons.filter(has_text="approve").click()  # confirmed (the dialog is accepted)
    await expect(page.locator("#notice")).to_have_text("signal: approve sent to review.verdict")
    async with console.pipeline.client() as client:
        done = await client.wait(task.task_id)
    assert done.status == "SUCCEEDED"
    assert done.node("review.verdict").output == {"verdict": "approved"}
    # A choice the node does not offer is refused, and said on the page.
    refused = await context.request.post(
        f"{console.url}/tasks/{task.task_id}/signal",
        form={"node_id": "review.verdict", "choice": "escalate"},
        headers=from_the_console(console),
    )
    assert "signal: INVALID_ARGUMENT" in await refused.text()
    assert watched.errors == []
    await context.close()


async def test_a_failed_task_is_resumed_from_its_page(browser, console):
    # The first call of this cell is refused with a 400: a permanent failure, the task FAILED.
    await console.downstream.control(fail={"status": 400, "times": 1, "path": "/step/resumed-"})
    async with console.pipeline.client() as client:
        submitted = await client.submit(BUSINESS, [CellSpec("step", {"name": "resumed-1"})])
        failed = await client.wait(submitted.task_id)
    assert failed.status == "FAILED"

    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/tasks/{submitted.task_id}")
    await page.wait_for_function("() => window.dagGraph !== undefined")
    assert (await graph(page))["nodes"] == {"step.call": "FAILED"}
    assert "HTTP 400" in await page.locator("#detail").inner_text()  # the node's last error
    # The offer to resume comes once the reconciler holds the failure (the live feed).
    await page.locator("#resume").click()  # confirmed (the dialog is accepted)
    await page.locator("#notice").wait_for()
    assert await page.locator("#notice").inner_text() == "resume: done"

    await eventually(
        lambda: graph(page),
        lambda model: model["nodes"] == {"step.call": "SUCCEEDED"},
        timeout=30,
        wanted="the graph to show the resumed node SUCCEEDED",
    )
    async with console.pipeline.client() as client:
        assert (await client.wait(submitted.task_id)).status == "SUCCEEDED"
    await expect(page.locator("#history")).to_contain_text("redriven (RESUME")
    # The history is the task's status snapshots, the reconciler's redrive among them: the
    # 400 ends the task FAILED, the redrive runs the node again, and it succeeds.
    await expect(page.locator("#history")).to_contain_text("SUCCEEDED (version")
    lines = await page.locator("#history tr").all_inner_texts()
    failed = next(i for i, line in enumerate(lines) if "FAILED (version" in line)
    redriven = next(i for i, line in enumerate(lines) if "redriven (RESUME" in line)
    succeeded = next(i for i, line in enumerate(lines) if "SUCCEEDED (version" in line)
    assert failed < redriven < succeeded, lines
    before, after = "\n".join(lines[: failed + 1]), "\n".join(lines[redriven:])
    # (a first snapshot of the node, or the one after a RUNNING published once the executor's
    # progress interval had passed: ADR-0059)
    said = r"step\.call (RUNNING → FAILED|FAILED, attempts 1): definite failure: HTTP 400"
    assert re.search(said, before), lines
    assert "step.call FAILED → " in after and ", attempts 2" in after, lines
    assert "→ SUCCEEDED" in after and "HTTP 400" not in after, lines  # said once, when it failed
    assert watched.errors == []
    await context.close()


async def test_a_finished_task_is_erased_from_its_page(browser, console):
    async with console.pipeline.client() as client:
        submitted = await client.submit(BUSINESS, [CellSpec("step", {"name": "erased-1"})])
        assert (await client.wait(submitted.task_id)).status == "SUCCEEDED"

    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/tasks/{submitted.task_id}")
    await page.locator("#erase").click()  # confirmed (the dialog is accepted)
    await page.locator("#notice").wait_for()
    assert await page.locator("#notice").inner_text() == "erase: done"
    await expect(page.locator("#erased")).to_contain_text("erased")
    await expect(page.locator("#erase")).to_have_count(0)  # nothing left to erase
    async with console.pipeline.client() as client:
        view = await client.get(submitted.task_id)
    assert view.erased_at is not None and view.status == "SUCCEEDED"
    assert watched.errors == []
    await context.close()


async def test_failed_work_is_listed_by_queue_and_resumed_and_a_downstream_paused(
    browser, console, screenshots
):
    await console.downstream.control(fail={"status": 400, "times": 1, "path": "/step/given-up-"})
    async with console.pipeline.client() as client:
        submitted = await client.submit(BUSINESS, [CellSpec("step", {"name": "given-up-1"})])
        assert (await client.wait(submitted.task_id)).status == "FAILED"

    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/failed")
    row = page.locator(f"#work tr[data-task='{submitted.task_id}']")  # once the reconciler has it
    await expect(row).to_contain_text("FAILED")
    await expect(row).to_contain_text("demo")
    await expect(page.locator("#groups")).to_contain_text("FAILED")
    await page.screenshot(path=screenshots / "failed.png", full_page=True)
    # held FAILED, it has ended: resumed, not abandoned
    assert await row.locator("button.abandon").count() == 0
    await row.locator("button.resume").click()  # confirmed
    await expect(page.locator("#notice")).to_have_text("resume: done")
    await expect(page.locator(f"#work tr[data-task='{submitted.task_id}']")).to_have_count(0)
    async with console.pipeline.client() as client:

        async def status() -> str:  # FAILED until the redrive reaches the view
            return (await client.get(submitted.task_id)).status

        await eventually(
            status, lambda s: s == "SUCCEEDED", timeout=60, wanted="the resumed task SUCCEEDED"
        )

    await page.goto(f"{console.url}/downstreams")
    demo = page.locator("tr[data-downstream=demo]")
    await expect(demo).to_contain_text("CLOSED")  # the executor's breaker
    await expect(demo.locator(".breaker")).to_have_attribute("data-tone", "good")  # green
    # The worker queues beside them (the executor's ListQueues): none serves "reviews".
    reviews = page.locator("#worker-queues tr[data-queue=reviews]")
    await expect(reviews.locator(".health")).to_have_text("no live worker")
    await expect(reviews.locator(".workers")).to_have_text("0")
    await expect(reviews).to_contain_text("3")  # its limit
    # A form sent from another site's page, or with no origin at all, is refused before
    # any route (the signed-in cookie rides along here): nothing is paused.
    for headers in ({"Origin": console.downstream.url}, {}):
        forged = await page.request.post(
            f"{console.url}/downstreams/demo/pause", headers=headers, max_redirects=0
        )
        assert forged.status == 403 and "another site" in await forged.text()
    await page.reload()
    await expect(demo.locator(".paused")).to_have_text("no")
    await demo.locator("button.pause").click()
    await expect(page.locator("#notice")).to_have_text("pause: done")
    await expect(demo.locator(".paused")).to_contain_text("paused")
    await page.screenshot(path=screenshots / "downstreams.png")
    await demo.locator("button.unpause").click()
    await expect(page.locator("#notice")).to_have_text("resume: done")
    await expect(demo.locator(".paused")).to_have_text("no")
    assert watched.errors == []
    await context.close()


async def test_a_business_is_paused_by_name_its_task_waits_and_runs_once_resumed(
    browser, console, screenshots
):
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/businesses")
    await page.locator("form.pause-business input[name=business]").fill("held-shop")
    await page.locator("form.pause-business button.pause").click()  # confirmed
    await expect(page.locator("#notice")).to_have_text("pause: done")
    row = page.locator("tr[data-business=held-shop]")
    await expect(row.locator(".paused")).to_contain_text("paused by")
    async with console.pipeline.client() as client:
        held = await client.submit("held-shop", [CellSpec("noop", {})])
        await expect(row.locator(".accepted")).to_have_text("1")  # its paused depth, live
        assert (await client.get(held.task_id)).status == "ACCEPTED"
        await row.locator("button.unpause").click()  # confirmed
        await expect(page.locator("#notice")).to_have_text("resume: done")
        await expect(row).to_have_count(0)  # neither paused, weighted nor waiting: not listed
        assert (await client.wait(held.task_id)).status == "SUCCEEDED"
    assert watched.errors == []
    await context.close()


def from_the_console(console: Console) -> dict[str, str]:
    """The Origin a browser sends with a form of the console's own pages."""
    return {"Origin": console.url}


def evaluation_request(console: Console, evaluation_id: str) -> ppb.CreateEvaluationRequest:
    """One run, due at once, against the test's target (a trial: nothing analyses it)."""
    request = ppb.CreateEvaluationRequest(
        evaluation_id=evaluation_id,
        series="console-bot",
        line=common_pb2.LINE_TRIAL,
        period="2026-12",
        target_url=console.target.url,
        window_seconds=60,
        slot_count=1,
        runs_per_slot=1,
    )
    request.cases.add(id="answer", path="/answer").rules.add(kind=ppb.RULE_KIND_STATUS, value="200")
    return request


async def evaluation_status(pool: pool_pb2_grpc.PoolServiceStub, evaluation_id: str) -> str:
    found = await pool.GetEvaluation(ppb.GetEvaluationRequest(evaluation_id=evaluation_id))
    return ppb.EvaluationStatus.Name(found.status)


async def test_a_running_evaluation_holds_its_cron_until_it_completes(browser, console):
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/pool")
    cron = page.locator("#crons tr[data-cron]")
    await expect(cron.locator(".cron-status")).to_have_text("IDLE")  # the one cron
    console.target.hold()  # the evaluation's call stays open until released
    async with admin_channel(console.pool) as channel:
        pool = pool_pb2_grpc.PoolServiceStub(channel)
        await pool.CreateEvaluation(evaluation_request(console, "console-run-1"))

        # The cron takes it at once; the page, open before, shows it busy with it.
        await expect(cron.locator(".cron-status")).to_have_text("BUSY")
        await expect(cron.locator(".cron-evaluation")).to_have_text("console-run-1")
        await expect(page.locator("#pool-status [data-figure=busy]")).to_have_text("busy 1")
        held = page.locator("#assignments tr[data-evaluation=console-run-1]").first
        await expect(held.locator(".end-reason")).to_have_text("held")
        await eventually(
            lambda: console.target.waiting >= 1, wanted="the evaluation's run in flight"
        )
        assert await evaluation_status(pool, "console-run-1") == "EVALUATION_STATUS_EXECUTING"

        console.target.release()  # its one run answers: the evaluation completes
        await expect(held.locator(".end-reason")).to_have_text("COMPLETED")
        await expect(cron.locator(".cron-status")).to_have_text("IDLE")
        await expect(cron.locator(".cron-evaluation")).to_have_text("")
        assert await evaluation_status(pool, "console-run-1") == "EVALUATION_STATUS_COMPLETED"
    assert watched.errors == []
    await context.close()


async def test_an_evaluation_is_queued_live_and_acted_on_from_the_cron_pool_page(
    browser, console, module_database, screenshots
):
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/pool")
    await expect(page.locator("#queue")).to_contain_text("Nothing queued.")
    console.target.hold()
    async with admin_channel(console.pool) as channel:
        pool = pool_pb2_grpc.PoolServiceStub(channel)
        # The one cron is held by the first; the second waits in the queue.
        await pool.CreateEvaluation(evaluation_request(console, "console-hold-1"))
        cron = page.locator("#crons tr[data-cron]")
        await expect(cron.locator(".cron-evaluation")).to_have_text("console-hold-1")
        await pool.CreateEvaluation(evaluation_request(console, "console-eval-1"))

        # The page was open before the evaluation existed: it comes in on the live feed.
        row = page.locator("#queue tr[data-evaluation=console-eval-1]")
        await expect(row).to_contain_text("QUEUED")
        await expect(row.locator(".boost")).to_have_text("0")
        await expect(page.locator("#pool-status [data-figure=queue_depth]")).to_have_attribute(
            "data-count", "1"
        )
        # The chart gains a point per update, the queue depth among them.
        await eventually(
            lambda: page.evaluate("() => window.poolChart.data.datasets[1].data"),
            lambda depths: len(depths) >= 2 and depths[-1] == 1,
            timeout=30,
            wanted="the chart to plot the queue depth of 1",
        )
        # Resizes: the pool's size is plotted (a step is a resize) and its latest resizes
        # listed with their reasons, as the pool's ListResizes has them.
        status = await pool.GetPoolStatus(ppb.GetPoolStatusRequest())
        sizes = await page.evaluate("() => window.poolChart.data.datasets[2].data")
        assert sizes[-1] == status.size
        resized = (await pool.ListResizes(ppb.ListResizesRequest(limit=20))).resizes
        assert resized, "the scaler brought the pool to its least size"
        shown = page.locator("#resizes tr[data-resize]")
        await expect(shown).to_have_count(len(resized))
        assert await shown.locator(".resize-reason").all_inner_texts() == [
            r.reason for r in resized
        ]
        await page.screenshot(path=screenshots / "pool.png", full_page=True)

        await row.locator("input[name=boost]").fill("7")
        await row.locator("button.boost-set").click()  # confirmed
        await expect(page.locator("#notice")).to_have_text(
            "boost: console-eval-1 at priority boost 7"
        )
        await expect(page.locator("#queue tr[data-evaluation=console-eval-1] .boost")).to_have_text(
            "7"
        )
        found = await pool.GetEvaluation(ppb.GetEvaluationRequest(evaluation_id="console-eval-1"))
        assert found.priority_boost == 7

        # Not a whole number (the form's own field allows none): refused naming the field.
        refused = await page.request.post(
            f"{console.url}/pool/console-eval-1/boost",
            form={"boost": "lots"},
            headers=from_the_console(console),
        )
        assert refused.url.startswith(f"{console.url}/pool?error=")
        assert "boost: INVALID_ARGUMENT: priority_boost" in await refused.text()
        found = await pool.GetEvaluation(ppb.GetEvaluationRequest(evaluation_id="console-eval-1"))
        assert found.priority_boost == 7

        # Paused from its row: out of the queue; resumed by its id: back in it.
        await row.locator("button.pause").click()  # confirmed
        await expect(page.locator("#notice")).to_have_text("pause: console-eval-1 PAUSED")
        await expect(row).to_have_count(0)
        assert await evaluation_status(pool, "console-eval-1") == "EVALUATION_STATUS_PAUSED"
        await page.fill("#evaluation-id", "console-eval-1")
        await page.locator("#evaluation-form button.resume").click()  # confirmed
        await expect(page.locator("#notice")).to_contain_text("resume: console-eval-1")
        await expect(row).to_contain_text("QUEUED")

        # The held one cancelled from its cron's row: ended for good, its cron let go.
        await cron.locator("button.cancel").click()  # confirmed
        await expect(page.locator("#notice")).to_have_text("cancel: console-hold-1 CANCELLED")
        assert await evaluation_status(pool, "console-hold-1") == "EVALUATION_STATUS_CANCELLED"
        # A cancelled evaluation is not paused: its resume is refused, and said on the page.
        await page.fill("#evaluation-id", "console-hold-1")
        await page.locator("#evaluation-form button.resume").click()  # confirmed
        await expect(page.locator("#problem")).to_contain_text("resume: FAILED_PRECONDITION")
        assert await evaluation_status(pool, "console-hold-1") == "EVALUATION_STATUS_CANCELLED"

        # Bounds the pool refuses (fewest above most): said on the page, nothing changed.
        bounds = page.locator("#bounds-form")
        await bounds.locator("input[name=min_size]").fill("3")
        await bounds.locator("input[name=max_size]").fill("2")
        await bounds.locator("#bounds-set").click()  # confirmed
        await expect(page.locator("#problem")).to_contain_text("bounds: INVALID_ARGUMENT")
        status = await pool.GetPoolStatus(ppb.GetPoolStatusRequest())
        assert (status.min_size, status.max_size) == (1, 1)
    console.target.release()
    assert watched.errors == []
    await context.close()

    # The pool answers admins only: a business's token is refused the page and its actions.
    _, other = await business_token(module_database, "console-pool")
    context = await signed_in(browser, console, other)
    page = await context.new_page()
    reply = await page.goto(f"{console.url}/pool")
    assert reply is not None and reply.status == 403
    refused = await page.request.post(
        f"{console.url}/pool/cancel",
        form={"evaluation_id": "console-eval-1"},
        headers=from_the_console(console),
    )
    assert refused.status == 403  # back to the page, which the token may not see either
    assert "cancel: PERMISSION_DENIED" in await refused.text()
    async with admin_channel(console.pool) as channel:
        pool = pool_pb2_grpc.PoolServiceStub(channel)
        assert await evaluation_status(pool, "console-eval-1") != "EVALUATION_STATUS_CANCELLED"
    await context.close()


async def test_an_analysis_job_comes_in_live_and_its_analysis_is_shown(
    browser, console, screenshots
):
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/intelligence")
    async with admin_channel(console.intelligence) as channel:
        intelligence = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        # A trial evaluation: nothing is analysed by itself, the analysis is triggered.
        await intelligence.CreateEvaluation(
            ipb.CreateEvaluationRequest(
                evaluation_id="console-intel-1",
                series="console-bot",
                line=common_pb2.LINE_TRIAL,
                period="2026-12",
                configuration_json=json.dumps({"target": "console"}),
            )
        )
        runs = [
            ipb.RunResult(
                run_id="r1", case_id="c1", verdict=common_pb2.VERDICT_PASS, score=1, latency_ms=10
            ),
            ipb.RunResult(
                run_id="r2",
                case_id="c2",
                verdict=common_pb2.VERDICT_FAIL,
                score=0,
                latency_ms=30,
                failure_reason="expected 200, got 500",
            ),
        ]
        await intelligence.RecordRunResults(
            ipb.RecordRunResultsRequest(evaluation_id="console-intel-1", runs=runs)
        )
        await intelligence.CompleteEvaluation(
            ipb.CompleteEvaluationRequest(
                evaluation_id="console-intel-1", status=ipb.EVALUATION_STATUS_COMPLETED
            )
        )
        await intelligence.TriggerAnalysis(ipb.TriggerJobRequest(evaluation_id="console-intel-1"))

    # The page was open before the job existed: it comes in on the live feed, and completes.
    row = page.locator("tr[data-job='analysis/console-intel-1']")
    await expect(row.locator(".job-status")).to_have_text("COMPLETED", timeout=30_000)
    await expect(row).to_contain_text("stand-in")
    # The counts are read apart from the rows: a later refresh of the feed brings them level.
    completed = page.locator("#job-counts [data-status=COMPLETED]")
    await expect(completed).to_have_attribute("data-count", re.compile(r"^[1-9][0-9]*$"))
    await page.screenshot(path=screenshots / "intelligence.png", full_page=True)

    await row.locator("a").click()
    assert page.url == f"{console.url}/intelligence/analysis/console-intel-1"
    assert await page.locator("#job-status").inner_text() == "COMPLETED"
    assert await page.locator("#narrative").inner_text() == NARRATIVE
    figures = page.locator("#figures tr")
    await expect(figures.filter(has_text="pass rate")).to_contain_text("50.0%")
    await expect(figures.filter(has_text="runs")).to_contain_text("2")
    await expect(page.locator("#worst")).to_contain_text("c2")
    assert watched.errors == []

    # A kind the service has not: refused naming the field; an evaluation it has not: 404.
    reply = await page.goto(f"{console.url}/intelligence/poetry/console-intel-1")
    assert reply is not None and reply.status == 400
    assert "kind" in await page.locator("main").inner_text()
    reply = await page.goto(f"{console.url}/intelligence/analysis/no-such-evaluation")
    assert reply is not None and reply.status == 404
    await context.close()


async def feed_evaluation(
    intelligence: intelligence_pb2_grpc.IntelligenceServiceStub,
    evaluation_id: str,
    period: str,
    verdicts: list[common_pb2.Verdict.ValueType],
) -> None:
    """A completed formal evaluation of the series ``console-cmp``: the intelligence service
    analyses it by itself, then compares it with the period before it."""
    await intelligence.CreateEvaluation(
        ipb.CreateEvaluationRequest(
            evaluation_id=evaluation_id,
            series="console-cmp",
            line=common_pb2.LINE_FORMAL,
            period=period,
            configuration_json=json.dumps({"target": "console"}),
        )
    )
    runs = [
        ipb.RunResult(
            run_id=f"{evaluation_id}-{i}",
            case_id=f"c{i}",
            verdict=verdict,
            score=1 if verdict == common_pb2.VERDICT_PASS else 0,
            latency_ms=10,
        )
        for i, verdict in enumerate(verdicts)
    ]
    await intelligence.RecordRunResults(
        ipb.RecordRunResultsRequest(evaluation_id=evaluation_id, runs=runs)
    )
    await intelligence.CompleteEvaluation(
        ipb.CompleteEvaluationRequest(
            evaluation_id=evaluation_id, status=ipb.EVALUATION_STATUS_COMPLETED
        )
    )


async def test_comparison_jobs_are_filtered_paged_and_shown_to_admins_only(
    browser, console, module_database, screenshots
):
    async with admin_channel(console.intelligence) as channel:
        intelligence = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        passed, failed = common_pb2.VERDICT_PASS, common_pb2.VERDICT_FAIL
        await feed_evaluation(intelligence, "console-cmp-base", "2026-11", [passed, failed])
        await feed_evaluation(intelligence, "console-cmp-now", "2026-12", [passed, passed])

    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    # The comparisons only: the later period's against the earlier; the earlier has none.
    await page.goto(f"{console.url}/intelligence?kind=comparison")
    now = page.locator("tr[data-job='comparison/console-cmp-now'] .job-status")
    await expect(now).to_have_text("COMPLETED", timeout=60_000)
    # The earlier period is the series' first: its comparison found no baseline, as expected,
    # and says so in grey, not as a red failure.
    base = page.locator("tr[data-job='comparison/console-cmp-base'] .job-status")
    await expect(base).to_have_text("NO BASELINE", timeout=60_000)
    # (an assertion that waits: the list is redrawn as jobs change, and an element read
    # while it is replaced has no style)
    await expect(base).to_have_css("color", "rgb(127, 127, 127)")
    await expect(
        page.locator("tr[data-job='comparison/console-cmp-base'] td").last
    ).to_contain_text("no baseline for evaluation")
    await page.goto(f"{console.url}/intelligence/comparison/console-cmp-base")
    await expect(page.locator("#job-status")).to_have_text("NO BASELINE")
    await expect(page.locator("#job-expected")).to_contain_text("the first period of its series")
    await page.goto(f"{console.url}/intelligence?kind=comparison")
    assert await page.locator("tr[data-job^='analysis/']").count() == 0
    counts = page.locator("#job-counts")
    await expect(counts.locator("[data-status=COMPLETED]")).to_have_attribute("data-count", "1")
    await expect(counts.locator("[data-status=FAILED]")).to_have_attribute("data-count", "1")

    # A job a page: the next page (the service's page token) holds the other.
    await page.goto(f"{console.url}/intelligence?kind=comparison&limit=1")
    first = await page.locator("tr[data-job]").get_attribute("data-job")
    assert await page.locator("tr[data-job]").count() == 1
    await page.locator("#next-page").click()
    await expect(page.locator("tr[data-job]")).to_have_count(1)
    second = await page.locator("tr[data-job]").get_attribute("data-job")
    assert {first, second} == {"comparison/console-cmp-now", "comparison/console-cmp-base"}
    assert await page.locator("#next-page").count() == 0  # the last page
    await page.locator("#first-page").click()
    assert await page.locator("tr[data-job]").get_attribute("data-job") == first

    # By status (and by evaluation): the completed comparison alone; its page.
    await page.goto(f"{console.url}/intelligence?kind=comparison&status=COMPLETED")
    assert [
        await r.get_attribute("data-job") for r in await page.locator("tr[data-job]").all()
    ] == ["comparison/console-cmp-now"]
    await page.goto(f"{console.url}/intelligence?evaluation=console-cmp-now")
    await expect(page.locator("tr[data-job]")).to_have_count(2)  # its analysis and comparison
    await page.locator("tr[data-job='comparison/console-cmp-now'] a").click()
    assert page.url == f"{console.url}/intelligence/comparison/console-cmp-now"
    assert await page.locator("#job-status").inner_text() == "COMPLETED"
    assert await page.locator("#narrative").inner_text() == NARRATIVE
    await expect(page.locator("#job-facts")).to_contain_text("console-cmp-base")  # the baseline
    pass_rate = page.locator("#deltas tr").filter(has_text="pass_rate")
    await expect(pass_rate.locator("td")).to_have_text(
        ["pass_rate", "0.5", "1", "+0.5", "IMPROVED"]
    )
    await page.screenshot(path=screenshots / "comparison.png", full_page=True)
    assert watched.errors == []
    await context.close()

    # Evaluations and jobs belong to no business: a business's token is refused the pages,
    # and the page says so.
    _, other = await business_token(module_database, "console-intel")
    context = await signed_in(browser, console, other)
    page = await context.new_page()
    for path in ("/intelligence", "/intelligence/comparison/console-cmp-now"):
        reply = await page.goto(f"{console.url}{path}")
        assert reply is not None and reply.status == 403
        await expect(page.locator("h1")).to_have_text("PERMISSION_DENIED")
    await context.close()


async def test_parked_tasks_of_a_downstream_are_resumed_by_filter_with_progress(browser, console):
    # Every call of these cells fails with a 503 until the switch is reset: their retries are
    # exhausted and the reconciler parks them (their automatic redrive an hour away).
    await console.downstream.control(fail={"status": 503, "times": 1000, "path": "/step/bulk-"})
    async with console.pipeline.client() as client:
        ids = [
            (await client.submit("console-bulk", [CellSpec("step", {"name": f"bulk-{i}"})])).task_id
            for i in range(3)
        ]

    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/failed?downstream=demo")
    for task_id in ids:
        row = page.locator(f"#work tr[data-task='{task_id}']")
        await expect(row).to_contain_text("AWAITING_REDRIVE", timeout=60_000)
    await console.downstream.control(reset=True)  # the downstream answers again

    # A rate that is no number: refused naming the field.
    refused = await page.request.post(
        f"{console.url}/failed/resume",
        form={"downstream": "demo", "business": "console-bulk", "rate": "fast"},
        headers=from_the_console(console),
    )
    assert "resume matching: INVALID_ARGUMENT: rate_per_second" in await refused.text()
    await page.fill("#resume-form input[name=business]", "console-bulk")
    await page.fill("#resume-form input[name=rate]", "2")
    await page.locator("#resume-matching").click()  # confirmed
    await expect(page.locator("#notice")).to_have_text(
        "resume matching: 3 task(s) scheduled, 2 a second"
    )
    # The page follows the resume: each task redriven in turn, until all three finished.
    progress = page.locator("#progress")
    await expect(progress).to_have_attribute("data-finished", "3", timeout=60_000)
    await expect(progress).to_have_attribute("data-done", "yes")
    await expect(progress).to_contain_text("0 waiting their turn")
    for task_id in ids:
        await expect(page.locator(f"#work tr[data-task='{task_id}']")).to_have_count(0)
    # The reconciler's finished facts (the page) and the gateway's view come from the same
    # status events, each consumer in its own time: the view follows.
    async with console.pipeline.client() as client:
        assert {(await client.wait(task_id)).status for task_id in ids} == {"SUCCEEDED"}
    assert watched.errors == []
    await context.close()


async def test_the_tasks_a_search_matches_are_cancelled_all_with_the_count_confirmed(
    browser, console
):
    """The Tasks page's "cancel all N" (ADR-0112): the count in the button and its
    confirmation, a bulk cancel of the search's unfinished tasks, no other business's."""
    later = datetime.now(UTC) + timedelta(days=1)
    async with console.pipeline.client() as client:
        ids = [
            (await client.submit("console-cancel", [CellSpec("noop")], not_before=later)).task_id
            for _ in range(3)
        ]
        other = (await client.submit("console-keep", [CellSpec("noop")], not_before=later)).task_id

    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    confirmations: list[str] = []
    page.on("dialog", lambda d: confirmations.append(d.message))
    await page.goto(f"{console.url}/tasks?q=console-cancel")
    await expect(page.locator("#cancel-all")).to_have_text("Cancel all 3")
    await page.locator("#cancel-all").click()  # confirmed (the dialog is accepted)
    await expect(page.locator("#notice")).to_contain_text("cancel all: 3 task(s) being cancelled")
    assert confirmations and confirmations[0].startswith("Cancel all 3 unfinished tasks")
    async with console.pipeline.client() as client:
        for task_id in ids:
            assert (await client.wait(task_id, timeout=60)).status == "CANCELLED"
        assert (await client.get(other)).status == "ACCEPTED"
    assert watched.errors == []
    await context.close()


async def test_tasks_are_searched_by_priority_and_cancelled_all_of_those_priorities(
    browser, console
):
    """The Tasks page's priority boxes: the rows and the counts of the priorities checked;
    "cancel all N" of that search takes those tasks alone."""
    later = datetime.now(UTC) + timedelta(days=1)
    async with console.pipeline.client() as client:

        async def submit(priority: int) -> str:
            return (
                await client.submit(
                    "console-pri", [CellSpec("noop")], not_before=later, priority=priority
                )
            ).task_id

        urgent = [await submit(1) for _ in range(2)]
        low = [await submit(5) for _ in range(2)]

    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/tasks?q=console-pri&priority=1")
    rows = page.locator("#rows tr[data-task]")
    assert {await r.get_attribute("data-task") for r in await rows.all()} == set(urgent)
    assert await page.locator("input[name=priority][value='1']").is_checked()
    assert not await page.locator("input[name=priority][value='5']").is_checked()
    await expect(page.locator("#cancel-all")).to_have_text("Cancel all 2")
    await page.locator("#cancel-all").click()  # confirmed (the dialog is accepted)
    await expect(page.locator("#notice")).to_contain_text("cancel all: 2 task(s) being cancelled")
    async with console.pipeline.client() as client:
        for task_id in urgent:
            assert (await client.wait(task_id, timeout=60)).status == "CANCELLED"
        assert {(await client.get(task_id)).status for task_id in low} == {"ACCEPTED"}
    assert watched.errors == []
    await context.close()


async def test_parked_tasks_are_abandoned_all_with_the_count_confirmed(browser, console):
    """The Failed page's "Abandon all N" (AbandonByFilter, ADR-0112): the count in the
    button and in its confirmation, each listed parked task abandoned."""
    await console.downstream.control(fail={"status": 503, "times": 1000, "path": "/step/gone-"})
    async with console.pipeline.client() as client:
        ids = [
            (await client.submit("console-gone", [CellSpec("step", {"name": f"gone-{i}"})])).task_id
            for i in range(2)
        ]
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    confirmations: list[str] = []
    page.on("dialog", lambda d: confirmations.append(d.message))
    await page.goto(f"{console.url}/failed?downstream=demo")
    for task_id in ids:
        row = page.locator(f"#work tr[data-task='{task_id}']")
        await expect(row).to_contain_text("AWAITING_REDRIVE", timeout=60_000)
    await console.downstream.control(reset=True)
    await page.goto(f"{console.url}/failed?downstream=demo")
    button = page.locator("#abandon-all")
    label = await button.inner_text()
    assert re.fullmatch(r"Abandon all \d+", label) and int(label.split()[-1]) >= 2
    await button.click()  # confirmed (the dialog is accepted)
    count = label.split()[-1]
    await expect(page.locator("#notice")).to_contain_text(
        f"abandon all: {count} of {count} task(s) abandoned"
    )
    assert confirmations and confirmations[0].startswith(f"Abandon all {count} parked tasks")
    async with admin_channel(console.reconciler) as channel:
        reconciler = reconciler_pb2_grpc.ReconcilerServiceStub(channel)
        for task_id in ids:
            got = await reconciler.GetRecoveryTask(rpb.GetRecoveryTaskRequest(task_id=task_id))
            assert got.task.state == rpb.RECOVERY_STATE_ABANDONED
    assert watched.errors == []
    await context.close()


async def raw_request(url: str, head: bytes) -> tuple[int, dict[str, str]]:
    """Send ``head`` (a request's line and headers, as bytes: what no well-behaved client
    library would send) to the console at ``url``; its answer's status and headers."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + b"Connection: close\r\n\r\n")
    await writer.drain()
    answer = await reader.read()
    writer.close()
    lines = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    return int(lines[0].split()[1]), headers


def signed_out(status: int, headers: dict[str, str]) -> bool:
    """A redirect to the sign-in page that drops the browser's token."""
    return (
        status == 303
        and headers.get("location", "").startswith("/login")
        and headers.get("set-cookie", "").startswith('dispo_token="";')
    )


async def test_a_cookie_that_holds_no_token_signs_the_browser_out_and_is_never_forwarded(
    console,
):
    host = console.url.removeprefix("http://").encode()
    for cookie in [
        b"dispo_token=abc\x7f",  # a control character
        b'dispo_token="dispo_a\\015\\012b"',  # CR LF, quoted as a browser sends it back
        b"dispo_token=" + b"a" * 600,  # longer than any token
        b"dispo_token=dispo_\xc3\xa9",  # not ASCII
    ]:
        for path in (b"/tasks", b"/tasks/stream", b"/failed"):
            status, headers = await raw_request(
                console.url,
                b"GET " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\nCookie: " + cookie + b"\r\n",
            )
            assert signed_out(status, headers), (cookie, path, status, headers)
            assert headers["location"] == "/login?why=malformed"
    # signing in with such a token is refused on the sign-in page, and no cookie is set
    async with httpx.AsyncClient(base_url=console.url, headers={"origin": console.url}) as http:
        for odd in ["dispo_a\r\nb", "dispo_\x7f", "dispo a b"]:
            answer = await http.post("/login", data={"token": odd})
            assert answer.status_code == 400 and "not a token" in answer.text, odd
            assert "set-cookie" not in answer.headers


async def test_every_answer_carries_the_security_headers(console):
    signed = {"dispo_token": console.pipeline.token}
    async with (
        httpx.AsyncClient(base_url=console.url) as http,
        httpx.AsyncClient(base_url=console.url, cookies=signed) as signed_in,
    ):
        answers = {
            "sign-in page": await http.get("/login"),
            "page": await signed_in.get("/tasks"),
            "static": await http.get("/static/console.css"),
            "health": await http.get("/healthz"),
            "redirect": await http.get("/tasks"),
            "refusal": await http.post("/logout", headers={"origin": "https://evil.example"}),
            "wrong host": await http.get("/login", headers={"host": "evil.example"}),
            "not found": await http.get("/nowhere"),
        }
    nonces = set()
    for name, answer in answers.items():
        policy = answer.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in policy, (name, answer.headers)
        assert "default-src 'self'" in policy and "object-src 'none'" in policy, name
        script = re.search(r"script-src ([^;]*)", policy)
        assert script and "'unsafe-inline'" not in script[1] and "'unsafe-eval'" not in script[1]
        nonces |= set(re.findall(r"'nonce-([^']+)'", policy))
        assert answer.headers.get("x-content-type-options") == "nosniff", name
        assert answer.headers.get("referrer-policy") == "same-origin", name
        assert answer.headers.get("x-frame-options") == "DENY", name
    assert len(nonces) == len(answers)  # one nonce per answer
    # the page's inline script carries its answer's nonce (the browser tests run it)
    page = answers["page"]
    [nonce] = re.findall(r"'nonce-([^']+)'", page.headers["content-security-policy"])
    assert f'<script nonce="{nonce}">' in page.text
    assert (answers["refusal"].status_code, answers["wrong host"].status_code) == (403, 421)


async def test_a_request_naming_another_host_is_refused_before_any_route(console):
    port = console.url.rsplit(":", 1)[1]
    signed = {"dispo_token": console.pipeline.token}
    async with httpx.AsyncClient(base_url=console.url, cookies=signed) as http:
        for host in ["evil.example", f"evil.example:{port}", "127.0.0.1:1", f"127.0.0.2:{port}"]:
            answer = await http.get("/tasks", headers={"host": host})
            assert answer.status_code == 421, (host, answer.text)
            assert "SUCCEEDED" not in answer.text
            posted = await http.post(
                "/logout", headers={"host": host, "origin": f"http://{host}"}
            )  # a rebound name: its Origin is its Host, but the Host is not the console's
            assert posted.status_code == 421, host
        for host in [f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}"]:
            assert (await http.get("/tasks", headers={"host": host})).status_code == 200, host


async def test_a_token_revoked_while_a_list_is_open_signs_the_browser_out(
    browser, console, module_database
):
    token_id, token = await business_token(module_database, BUSINESS)
    context = await signed_in(browser, console, token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/failed")
    assert page.url == f"{console.url}/failed"
    await expect(page.locator("#groups")).to_be_visible()
    async with admin_channel(console.pipeline.gateway.address) as channel:
        tokens = auth_pb2_grpc.TokenServiceStub(channel)
        await tokens.RevokeToken(auth_pb2.RevokeTokenRequest(token_id=token_id))
    # The live feed is refused (once the reconciler's cache of the token lapses): signed out.
    await page.wait_for_url(f"{console.url}/login?why=refused", timeout=30_000)
    await expect(page.locator("#problem")).to_contain_text("The services refused that token")
    assert not await context.cookies()
    await context.close()


async def test_schedules_are_listed_with_their_next_firings_and_paused_and_resumed(
    browser, console
):
    async with console.pipeline.client() as client:
        await client.create_schedule(
            "console-nightly",
            BUSINESS,
            [CellSpec("noop")],
            cron="0 2 * * *",
            time_zone="Europe/Berlin",
        )
        fired = await client.trigger_schedule("console-nightly")
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/schedules")
    row = page.locator("tr[data-schedule=console-nightly]")
    await expect(row).to_contain_text("0 2 * * * (Europe/Berlin)")
    await expect(row.locator(".state")).to_have_text("active")
    await expect(row.locator(".next")).to_contain_text(":00:00")  # 02:00 in Berlin, in UTC
    await expect(row.locator(f".last a[href='/tasks/{fired.task_id}']")).to_have_count(1)
    await row.locator("a[href='/schedules/console-nightly']").click()
    link = page.locator(f"#firings a[href='/tasks/{fired.task_id}']")
    await expect(link).to_have_count(1)
    await expect(page.locator("#firings")).to_contain_text("(triggered)")
    await page.locator("button.pause").click()  # confirmed
    await expect(page.locator("#notice")).to_have_text("pause: done")
    await expect(page.locator("#schedule .state")).to_contain_text("paused")
    async with console.pipeline.client() as client:
        assert (await client.get_schedule("console-nightly")).paused
    await page.locator("button.resume").click()
    await expect(page.locator("#notice")).to_have_text("resume: done")
    await expect(page.locator("#schedule .state")).to_contain_text("active")
    await link.click()  # the firing's task
    await expect(page).to_have_url(f"{console.url}/tasks/{fired.task_id}")
    assert watched.errors == []
    await context.close()


async def test_the_catalogue_page_shows_cells_owners_versions_and_a_diff_between_versions(
    browser, console, module_database
):
    _, token = await business_token(module_database, BUSINESS)
    async with open_channel(console.pipeline.gateway.address, token) as channel:
        stub = gpb_catalogue_grpc.CatalogueServiceStub(channel)
        read = await stub.GetCatalogue(gpb_catalogue.GetCatalogueRequest())
        made = await stub.RegisterCell(
            gpb_catalogue.RegisterCellRequest(
                cell="console_greet",
                definition="actions: {hello: {kind: http, downstream: demo, path: /hi}}",
                based_on_version=read.catalogue.version,
            )
        )
    version = made.catalogue.version
    context = await signed_in(browser, console, console.pipeline.token)
    watched = Watched(await context.new_page())
    page = watched.page
    await page.goto(f"{console.url}/catalogue")
    await expect(page.locator("#shown-version")).to_have_text(str(version))
    cell = page.locator("tr[data-cell=console_greet]")
    await expect(cell.locator(".owner")).to_have_text(BUSINESS)
    await expect(cell).to_contain_text("demo POST /hi")
    await expect(page.locator("tr[data-cell=ticket] .owner")).to_have_text("shared")
    await expect(page.locator("#catalogue-downstreams tr[data-downstream=demo]")).to_have_count(1)
    row = page.locator(f"#versions tr[data-version='{version}']")
    await expect(row).to_contain_text(f"a token of business '{BUSINESS}'")
    await expect(row).to_contain_text("register cell console_greet")
    await row.locator(f"a[href='/catalogue?version={version}&against={version - 1}']").click()
    await expect(page.locator("#diff")).to_contain_text("+  console_greet:")
    await expect(page.locator("#diff .added").first).to_be_visible()
    assert watched.errors == []
    await context.close()


def test_the_run_took_every_picture_and_changed_no_tracked_one(screenshots, pictures_before):
    """Last in the file: every picture of the documentation was taken again, into the scratch
    folder; the tracked ones are as the run found them (only ``--screenshots`` rewrites them)."""
    taken = {p.name for p in screenshots.glob("*.png")}
    assert taken == set(pictures_before)
    if screenshots != PICTURES.resolve():
        after = {p.name: p.read_bytes() for p in sorted(PICTURES.glob("*.png"))}
        assert after == pictures_before, "a test rewrote docs/screenshots"


async def test_the_retention_page_shows_each_services_dry_run_by_business(browser, console):
    async with console.pipeline.client() as client:
        task = await client.submit("console-kept", [CellSpec("step", {"name": "kept-1"})])
        assert (await client.wait(task.task_id)).status == "SUCCEEDED"
    context = await signed_in(browser, console, console.pipeline.token)
    page = await context.new_page()
    await page.goto(f"{console.url}/tasks")
    await page.click("header a[href='/retention']")
    rows = page.locator("#retention tr[data-business='console-kept']")
    # the reconciler records the finish a moment after the task's view shows it
    for _ in range(50):
        if await rows.count() == 3:
            break
        await page.reload()
    await expect(rows).to_have_count(3)
    for service in ("gateway", "executor", "reconciler"):
        row = page.locator(f"#retention tr[data-business='console-kept'][data-service='{service}']")
        await expect(row).to_contain_text("30")  # the default retention, in days
        await expect(row.locator("td.due")).to_have_text("0")  # finished just now: none due
    assert await page.locator("#off").count() == 0  # retention runs in every service
    # what each service keeps besides its tasks, and what of it waits for an operator
    for service, table in [
        ("gateway", "bulk_actions"),
        ("gateway", "outbox"),
        ("gateway", "quarantine"),
        ("executor", "outbox"),
        ("reconciler", "quarantine"),
    ]:
        row = page.locator(f"#records tr[data-service='{service}'][data-table='{table}']")
        await expect(row.locator("td.held")).to_have_text("0")
