"""The callback sender checks again before each delivery, with the real HTTP client: a
redirect (to an address off the allow-list) is not followed, an address the list no longer
holds is not sent to, and a nats: subject of another business is not published."""

from __future__ import annotations

from aiohttp import web
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.reconciler.completion import facts as completion
from dispo.reconciler.sweeps import run_sweeps

from .test_completion import facts, finished


async def test_a_redirect_is_not_followed(recon, stub, receiver, fake_server):
    elsewhere = await fake_server({("*", "/{tail:.*}"): lambda _: web.json_response({})})

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(f"{elsewhere.url}/internal")

    listed = await fake_server({("POST", "/hook"): redirect})
    recon.egress = recon.egress.parse(f"{listed.url},{receiver.server.url}")
    await completion.on_status(recon, finished("moved", callback_url=f"{listed.url}/hook"))

    assert (await run_sweeps(recon, "notify"))["notify"] == 1
    assert [r.path for r in listed.requests] == ["/hook"]
    assert elsewhere.requests == []
    [delivery] = (await facts(stub, "moved")).deliveries
    assert not delivery.ok and delivery.status_code == 307
    assert "not followed" in delivery.error and elsewhere.url in delivery.error


async def test_an_address_the_list_no_longer_holds_is_not_sent_to(recon, stub, receiver):
    await receiver.start()
    await completion.on_status(recon, finished("dropped", callback_url=receiver.url))
    recon.egress = recon.egress.parse("http://127.0.0.1:9")  # the operator removed it

    assert (await run_sweeps(recon, "notify"))["notify"] == 1
    assert receiver.received == []
    reply = await facts(stub, "dropped")
    assert reply.completion.notify_state == pb.NOTIFY_STATE_PENDING
    [delivery] = reply.deliveries
    assert not delivery.ok and "not on the egress allow-list" in delivery.error


async def test_a_nats_callback_of_another_business_is_not_published(recon, stub, bus):
    """A task of business ecommerce whose stored callback names another business's subject
    (written before the check existed, or by hand) publishes nothing."""
    sub = await bus.nc.subscribe("callbacks.>")
    await completion.on_status(recon, finished("other", callback_url="nats:callbacks.shop.done"))
    await completion.on_status(recon, finished("inject", callback_url="nats:task.create"))

    assert (await run_sweeps(recon, "notify"))["notify"] == 2
    for task_id in ("other", "inject"):
        [delivery] = (await facts(stub, task_id)).deliveries
        assert not delivery.ok and "callbacks.ecommerce." in delivery.error
    await bus.nc.flush()
    assert sub.pending_msgs == 0
    assert (await bus.js.stream_info("TASKS")).state.messages == 0
    await sub.unsubscribe()
