"""The runtime's resource-close hook, periodic parts and database, on a service run
in-process against the real PostgreSQL and NATS."""

from __future__ import annotations

import asyncio

import pytest
from dispo.libs.outbox import outbox_table
from dispo.libs.service import Runtime, serve
from dispo.libs.settings import CommonSettings, ServerSettings
from sqlalchemy import MetaData


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


async def test_the_service_has_one_database_its_relay_quarantine_and_token_checks_share(
    infra, database_url, nats_url
):
    """Opened before ``setup``: every ``rt.database()`` is that one, and the outbox relay,
    the quarantine and the token checks run their statements on it."""
    stop = asyncio.Event()
    seen: list[object] = []

    async def setup(rt: Runtime) -> None:
        db = await rt.database()
        relay = rt.outbox_relay(outbox_table(MetaData()))
        seen.extend([db, await rt.database(), relay.db, rt.quarantine.store.db, rt.verifier.db])
        async with db.connection() as conn:
            assert await conn.scalars("SELECT 1") == [1]
        stop.set()

    assert await run_service(infra, database_url, setup, stop) == []
    assert len(seen) == 5 and all(s is seen[0] for s in seen)
