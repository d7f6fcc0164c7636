"""The bus takes only its users, and each service's user only what its flows declare: an
anonymous client or a wrong password is refused; the gateway's user cannot forge a status
snapshot, the executor's cannot forge a pool event or a completion notification, read
another service's replies or delete a stream; the services do their work with theirs.

One protected server for the module (the session's serves the pipeline part: its log must
hold no violation)."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Iterator

import nats
import pytest
from dispo.libs import contracts
from dispo.libs.bus import Bus, BusCredentials, BusCredentialsRefused, inbox_prefix
from dispo.libs.contracts import evaluations, tasks
from dispo.sdk import cell
from dispo.tools.stack.nats import NatsServer
from dispo.tools.stack.nats_auth import ADMIN, USERS, NatsUsers, permissions
from dispo.tools.stack.stack import SERVICES
from pipeline_fixtures import wait_status
from support import eventually


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    root = tmp_path_factory.mktemp("bus-security")
    protected = NatsServer(
        root / "store", log_file=root / "nats.log", users=NatsUsers.kept(root / "users.json")
    )
    protected.start()
    yield protected
    protected.stop()


@pytest.fixture
async def admin(server: NatsServer) -> AsyncIterator[Bus]:
    bus = await Bus.connect([server.url], name="test-admin", credentials=server.credentials())
    for info in await bus.js.streams_info():
        await bus.js.delete_stream(info.config.name)
    for stream in contracts.STREAMS:
        await stream.ensure(bus)
    yield bus
    await bus.close()


class Client:
    """A raw connection as one service's user, keeping what the server refused it."""

    def __init__(self, nc: nats.NATS, refused: list[str]) -> None:
        self.nc = nc
        self.refused = refused

    @classmethod
    async def connect(cls, server: NatsServer, user: str) -> Client:
        refused: list[str] = []

        async def on_error(error: Exception) -> None:
            refused.append(str(error))

        nc = await nats.connect(
            [server.url],
            allow_reconnect=False,
            error_cb=on_error,
            inbox_prefix=inbox_prefix(user),
            **server.credentials(user).options(),
        )
        return cls(nc, refused)

    async def publish(self, subject: str, data: bytes = b"forged") -> None:
        await self.nc.publish(subject, data)
        await self.nc.flush()

    async def refusal(self, subject: str) -> str:
        """Until the server has refused this client something on ``subject``; its words."""
        found = await eventually(
            lambda: [e for e in self.refused if f'"{subject.lower()}"' in e],
            timeout=10,
            wanted=f"the refusal of {subject}",
            describe=lambda _: str(self.refused),
        )
        return found[0]


async def stored(bus: Bus, stream: str) -> int:
    return (await bus.js.stream_info(stream)).state.messages


async def test_an_anonymous_client_or_a_wrong_password_is_refused(server):
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect([server.url], allow_reconnect=False)
    with pytest.raises(BusCredentialsRefused, match="an anonymous client"):
        await Bus.connect([server.url], name="test-anonymous")
    wrong = BusCredentials(user="gateway", password="not-its-password")
    with pytest.raises(BusCredentialsRefused, match="user 'gateway'") as refused:
        await Bus.connect([server.url], name="test-wrong", credentials=wrong)
    assert "not-its-password" not in str(refused.value)  # the message names no secret
    gateway = await Bus.connect(
        [server.url], name="test-gateway", credentials=server.credentials("gateway")
    )
    assert gateway.nc.is_connected
    await gateway.close()


async def test_the_gateway_user_cannot_publish_a_status_snapshot(server, admin):
    gateway = await Client.connect(server, "gateway")
    executor = await Client.connect(server, "executor")
    try:
        await gateway.publish("task.status.t1.failed")
        assert "permissions violation for publish" in await gateway.refusal("task.status.t1.failed")
        # The executor's user publishes it (the snapshot's owner), and the gateway's what
        # the gateway owns: both are stored, nothing of the forgery is.
        await executor.publish("task.status.t1.succeeded")
        await gateway.publish(tasks.TASK_CREATE)
        await eventually(lambda: stored(admin, tasks.TASK_STATUS.name), lambda n: n == 1)
        await eventually(lambda: stored(admin, tasks.TASKS.name), lambda n: n == 1)
        assert (executor.refused, len(gateway.refused)) == ([], 1)
    finally:
        await gateway.nc.close()
        await executor.nc.close()


async def test_the_executor_user_reaches_only_what_its_flows_declare(server, admin):
    executor = await Client.connect(server, "executor")
    try:
        forged = (
            evaluations.EVALUATION_COMPLETED,  # a pool event
            "callback.ecommerce.t1",  # a completion notification
            "$JS.API.STREAM.DELETE.TASKS",
            "$JS.API.STREAM.PURGE.TASKS",  # it purges only an erased task's status snapshots
            "$JS.API.CONSUMER.CREATE.EVALUATIONS.spy",  # reading a stream it does not use
            "$JS.API.CONSUMER.DELETE.TASKS.reconciler-fail",  # it reads nothing back
        )
        for subject in forged:
            await executor.publish(subject)
            assert "permissions violation for publish" in await executor.refusal(subject)
        await executor.nc.subscribe(f"{inbox_prefix('gateway')}.>")  # the gateway's replies
        assert "permissions violation for subscription" in await executor.refusal(
            f"{inbox_prefix('gateway')}.>"
        )
        assert await stored(admin, evaluations.EVALUATIONS.name) == 0
        assert await stored(admin, tasks.CALLBACKS.name) == 0
        assert {info.config.name for info in await admin.js.streams_info()} == {
            s.name for s in contracts.STREAMS
        }
    finally:
        await executor.nc.close()


def test_each_user_is_allowed_its_flows_and_the_users_are_kept_private(tmp_path):
    assert set(contracts.BUS_SERVICES) == set(SERVICES)
    gateway = permissions("gateway")["publish"]["allow"]
    assert {tasks.TASK_CREATE, tasks.TASK_CANCEL} <= set(gateway)
    assert not any(p.startswith("task.status") for p in gateway)
    assert not contracts.may_publish("gateway", "task.status.t1.failed")
    assert contracts.may_publish("executor", "task.status.t1.failed")
    assert not contracts.may_publish("executor", evaluations.EVALUATION_COMPLETED)
    # A subject one service alone consumes, its quarantine may replay.
    assert contracts.may_publish("intelligence", evaluations.EVALUATION_COMPLETED)
    # Deleting consumers: the gateway on the status stream it reads back, and no one else.
    deleting = {
        service: [p for p in permissions(service)["publish"]["allow"] if ".CONSUMER.DELETE." in p]
        for service in SERVICES
    }
    assert deleting == {
        s: ["$JS.API.CONSUMER.DELETE.TASK_STATUS.*"] if s == "gateway" else [] for s in SERVICES
    }
    # Every declared subject pattern has its flow, and every flow a declared publisher.
    declared = {(s.name, p) for s in contracts.STREAMS for p in s.subjects}
    flowing = {(f.stream.name, f.subject) for f in contracts.FLOWS if f.stream is not None}
    assert declared == flowing
    assert all(set(f.publishers) <= set(SERVICES) for f in contracts.FLOWS)

    path = tmp_path / "users.json"
    users = NatsUsers.kept(path)
    assert set(users.passwords) == set(USERS) and ADMIN in USERS
    assert len(set(users.passwords.values())) == len(USERS)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert NatsUsers.kept(path).passwords == users.passwords  # kept across starts
    path.unlink()  # rotation: a new password for every user
    assert set(NatsUsers.kept(path).passwords.values()).isdisjoint(users.passwords.values())


async def test_the_pipeline_works_with_its_users_and_the_bus_refuses_it_nothing(
    infra, pipeline, client
):
    task = await client.submit("tests", [cell("step", name="secure"), cell("noop")])
    view = await wait_status(client, task.task_id, {"SUCCEEDED"})
    assert view.status == "SUCCEEDED"
    log = (infra.root / "nats.log").read_text(errors="replace")
    assert "Violation" not in log and "authentication error" not in log
