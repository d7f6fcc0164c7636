"""Completion facts: the task finishing and the caller being notified are recorded apart."""

import asyncio

from aiohttp import web
from pipeline_fixtures import Pipeline
from sqlalchemy import text

from dispo.libs.sdk import cell
from dispo.libs.stack.nats import free_port


class CallbackServer:
    """The caller's endpoint: fails the first ``failures`` posts, records every one."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.posts: list[tuple[str, dict]] = []
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/done"

    async def handle(self, request: web.Request) -> web.Response:
        self.posts.append((request.headers.get("Idempotency-Key", ""), await request.json()))
        if len(self.posts) <= self.failures:
            return web.Response(status=500, text="not now")
        return web.json_response({"ok": True})

    async def __aenter__(self):
        app = web.Application()
        app.router.add_post("/done", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *_):
        await self.runner.cleanup()


async def start(start_service, catalogue_file, max_attempts):
    p = Pipeline(start_service, catalogue_file)
    await p.start_gateway(DISPO_GATEWAY_NOTIFY_BASE_DELAY="0.05", DISPO_GATEWAY_NOTIFY_INTERVAL="0.1",
                          DISPO_GATEWAY_NOTIFY_MAX_ATTEMPTS=str(max_attempts))
    await p.start_executor()
    return p


async def until(check, timeout=30.0):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := await check()):
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.1)
    return result


async def test_caller_is_notified_after_the_task_finished_retrying_a_failed_callback(start_service, catalogue_file):
    pipeline = await start(start_service, catalogue_file, max_attempts=5)
    async with CallbackServer(failures=1) as caller, pipeline.client() as client:
        task = await client.submit("tests", [cell("noop")], callback_url=caller.url)
        await client.wait(task.task_id, timeout=30)

        async def notified():
            view = await client.get(task.task_id)
            return view if view.completion.notified_at else None

        view = await until(notified)

    completion = view.completion
    assert completion.finished_at <= completion.notified_at
    assert completion.notify_attempts == 2 and completion.notify_error == ""
    assert [key for key, _ in caller.posts] == [f"{task.task_id}/callback"] * 2
    assert caller.posts[-1][1]["status"] == "SUCCEEDED"
    assert caller.posts[-1][1]["nodes"] == {"noop.noop": "SUCCEEDED"}


async def test_a_callback_that_keeps_failing_is_given_up_visibly_and_the_task_stays_finished(
        start_service, catalogue_file, service_engine):
    pipeline = await start(start_service, catalogue_file, max_attempts=2)
    async with CallbackServer(failures=100) as caller, pipeline.client() as client:
        task = await client.submit("tests", [cell("noop")], callback_url=caller.url)
        await client.wait(task.task_id, timeout=30)

        async def gave_up():
            view = await client.get(task.task_id)
            return view if view.completion.notify_attempts >= 2 else None

        view = await until(gave_up)
        engine = await service_engine("gateway")
        async with engine.connect() as conn:
            next_at = (await conn.execute(text("SELECT notify_next_at FROM tasks"))).scalar_one()

    assert next_at is None  # nothing more scheduled: given up after max_attempts
    assert len(caller.posts) == 2

    assert view.status == "SUCCEEDED"
    assert view.completion.finished_at is not None and view.completion.notified_at is None
    assert "callback HTTP 500" in view.completion.notify_error
