"""The runtime's resource-close hook and periodic parts, on a service run in-process against
the real PostgreSQL and NATS."""

from __future__ import annotations

import asyncio

import pytest
from dispo.libs.service import Runtime, serve
from dispo.libs.settings import CommonSettings, ServerSettings


class Resource:
    def __init__(self, name: str, events: list[str], *, fails: bool = False) -> None:
        self.name, self.events, self.fails = name, events, fails

    async def aclose(self) -> None:
        self.events.append(f"closed {self.name}")
        if self.fails:
            raise RuntimeError("close failed")


async def run_service(infra, database_url: str, setup, stop: asyncio.Event) -> list[str]:
    """Serve until ``stop`` is set (by the test's parts), on the bus as ``admin``."""
    admin = infra.nats_credentials()
    return await serve(
        "runtime_test",
        setup,
        migrations=None,
        stop=stop,
        settings=CommonSettings(
            database_url=database_url,
            nats_url=infra.nats_url,
            nats_user=admin.user,
            nats_password=admin.password,
        ),
        server=ServerSettings(port=0),
    )


async def test_resources_close_after_every_part_in_the_order_registered(
    infra, database_url, nats_url
):
    events: list[str] = []
    stop = asyncio.Event()

    async def setup(rt: Runtime) -> None:
        first = rt.close_on_stop(Resource("http client", events))
        assert isinstance(first, Resource)  # handed back for use

        async def part() -> None:
            stop.set()
            try:
                await asyncio.Event().wait()
            finally:
                events.append("part stopped")

        rt.add_part("uses the client", part)
        rt.close_on_stop(Resource("broken", events, fails=True))
        rt.close_on_stop(lambda: events.append("closed by callable"), name="callable")

    assert await run_service(infra, database_url, setup, stop) == []
    # A resource that fails to close does not keep the next one open.
    assert events == ["part stopped", "closed http client", "closed broken", "closed by callable"]


async def test_resources_registered_before_a_failing_setup_are_still_closed(
    infra, database_url, nats_url
):
    events: list[str] = []

    async def setup(rt: Runtime) -> None:
        rt.close_on_stop(Resource("channel", events))
        raise RuntimeError("setup failed")

    with pytest.raises(RuntimeError, match="setup failed"):
        await run_service(infra, database_url, setup, asyncio.Event())
    assert events == ["closed channel"]


async def test_a_periodic_part_runs_on_the_service_clock_and_stops_with_the_service(
    infra, database_url, nats_url
):
    passes: list[int] = []
    stop = asyncio.Event()

    async def setup(rt: Runtime) -> None:
        async def action() -> None:
            passes.append(1)
            stop.set()

        rt.add_periodic("every hour", action, 3600)

    assert await run_service(infra, database_url, setup, stop) == []
    assert passes == [1]  # the first pass at once; stopped while waiting for the next
