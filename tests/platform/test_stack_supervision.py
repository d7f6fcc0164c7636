"""`dispo up` supervises everything it starts: nats-server and PostgreSQL killed come back,
and the stack keeps taking work; killed itself, it leaves no process behind."""

import os
import signal
import socket
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import grpc
import pytest
from dispo.libs.process import (
    ExitedBeforeReady,
    ManagedProcess,
    ProcessSpec,
    free_port,
    python_module,
)
from dispo.sdk import AsyncClient, DispoError, cells
from dispo.tools.stack.nats import NatsServer
from dispo.tools.stack.nats_auth import NatsUsers
from dispo.tools.stack.postgres import EmbeddedPostgres
from dispo.tools.stack.stack import NATS, POSTGRES, read_state
from dispo.tools.stack.supervisor import Supervisor
from support import eventually
from support.stack import RunningStack, alive, descendants

pytestmark = pytest.mark.long_file


@pytest.fixture
def stack(tmp_path):
    running = RunningStack.fresh(tmp_path)
    yield running
    running.kill()


async def submit_and_finish(stack: RunningStack, key: str) -> str:
    """Submit a one-node task (retried under the same key while the gateway is unavailable)
    and wait for its end; its terminal status."""
    async with AsyncClient(stack.address("gateway"), token=stack.token) as client:

        async def submit():
            try:
                return await client.submit("ops", [cells.noop()], idempotency_key=key)
            except DispoError as error:
                if error.code not in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                ):
                    raise
                return error

        submitted = await eventually(
            submit, lambda r: not isinstance(r, DispoError), timeout=60, wanted=f"{key} accepted"
        )
        return (await client.wait(submitted.task_id, timeout=60)).status


def infrastructure_pid(stack: RunningStack, name: str) -> int:
    return read_state(stack.data_dir)["infrastructure"][name]["pid"]


@pytest.mark.parametrize("killed", [NATS, POSTGRES])
async def test_killed_infrastructure_is_restarted_and_work_goes_on(stack, killed):
    await stack.up()
    assert await submit_and_finish(stack, "before") == "SUCCEEDED"
    other = POSTGRES if killed == NATS else NATS
    untouched = infrastructure_pid(stack, other)
    before = infrastructure_pid(stack, killed)

    os.kill(before, signal.SIGKILL)

    def restarted() -> int | None:
        pid = infrastructure_pid(stack, killed)
        return pid if pid != before and alive(pid) else None

    after = await eventually(restarted, timeout=60, interval=0.1, wanted=f"{killed} restarted")
    assert not alive(before)
    assert f"service={killed}" in stack.output.read_text()  # the restart is logged
    assert await submit_and_finish(stack, "after") == "SUCCEEDED"
    assert infrastructure_pid(stack, other) == untouched and alive(untouched)
    assert await stack.down() == 0
    assert not alive(after) and not alive(untouched)


async def test_nothing_outlives_a_killed_dispo_up(stack):
    await stack.up()
    state = read_state(stack.data_dir)
    started = {
        info["pid"]
        for group in ("services", "companions", "infrastructure")
        for info in state[group].values()
    }
    assert stack.process is not None
    children = descendants(stack.process.pid)
    # the services, companions and infrastructure, and PostgreSQL's own processes below them
    assert started < children

    stack.process.kill()  # SIGKILL: no shutdown code of dispo up runs
    stack.process.wait()

    await eventually(
        lambda: {pid for pid in children if alive(pid)},
        lambda left: not left,
        timeout=60,
        interval=0.1,
        wanted="no process of the stack left",
    )

    # the state file is left behind; the next dispo up sees the stack is stale and starts
    assert read_state(stack.data_dir) is not None
    await stack.up()
    assert "cleaned up after a dispo up that did not stop" in stack.output.read_text()
    assert stack.status()[0] == 0
    assert await stack.down() == 0


async def test_postgres_starts_over_what_an_earlier_run_left(tmp_path):
    """A daemonised server left on the folder is stopped first, and a lock file naming a
    process that is no postmaster of the folder (a pid reused since) is no obstacle."""
    folder, log = tmp_path / "postgres", tmp_path / "postgres.log"
    earlier = EmbeddedPostgres(folder, durable=False)
    earlier.start()  # through pg_ctl, detached from this process
    left = int((folder / "postmaster.pid").read_text().split()[0])

    postgres = EmbeddedPostgres(folder, durable=False)
    server = ManagedProcess(postgres.spec(log))
    assert not alive(left)
    server.spawn()
    await server.wait_ready(60)
    socket_dir = Path(parse_qs(urlparse(postgres.url).query)["host"][0])
    lock_files = [folder / "postmaster.pid", socket_dir / ".s.PGSQL.5432.lock"]
    contents = [path.read_text() for path in lock_files]
    assert await server.stop() == 0
    assert not any(path.exists() for path in lock_files)

    # as the server's own user: PostgreSQL itself takes a process it may not signal for
    # not being a postmaster
    stranger = subprocess.Popen(["sleep", "600"], user=earlier.system_user)
    try:
        for path, text in zip(lock_files, contents, strict=True):
            path.write_text("\n".join([str(stranger.pid), *text.splitlines()[1:]]) + "\n")
        server = ManagedProcess(EmbeddedPostgres(folder, durable=False).spec(log))
        server.spawn()
        await server.wait_ready(60)
        assert stranger.poll() is None  # only the file went, not the process
        assert await server.stop() == 0
    finally:
        stranger.kill()
        stranger.wait()
        server.kill()


async def test_a_child_that_exits_before_it_is_ready_fails_the_start_at_once(tmp_path):
    """The demo downstream finds its port taken and exits; the start fails with that, not
    after the ready timeout, though another child is still not ready."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        crashing = ProcessSpec(
            "demo-downstream",
            [*python_module("dispo.executor.demo_downstream"), "--port", str(port)],
            {},
            None,
            tmp_path / "demo-downstream.log",
            http_health=f"http://127.0.0.1:{port}/healthz",
        )
        never_ready = ProcessSpec(
            "never-ready",
            ["sleep", "600"],
            {},
            None,
            tmp_path / "never-ready.log",
            http_health=f"http://127.0.0.1:{free_port()}/healthz",
        )
        supervisor = Supervisor([crashing, never_ready])
        try:
            with pytest.raises(ExitedBeforeReady) as failed:
                await supervisor.start_all(timeout=3600)
            assert supervisor.children["never-ready"].process.running()
        finally:
            assert await supervisor.stop_all([]) == []

    assert (failed.value.name, failed.value.code) == ("demo-downstream", 1)
    message = str(failed.value)
    assert message.startswith("demo-downstream exited with code 1 before it was ready")
    assert str(tmp_path / "demo-downstream.log") in message
    assert "address already in use" in message  # the end of its log says why
    assert not supervisor.children["never-ready"].process.running()


def test_a_nats_server_that_cannot_listen_fails_its_start_at_once(tmp_path):
    """Started as a plain child (the tests' shared server), it exits on a port the test has
    bound, and the start says so instead of waiting for the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: nothing answers there
        port = taken.getsockname()[1]
        server = NatsServer(
            tmp_path / "store",
            port,
            tmp_path / "nats.log",
            users=NatsUsers.kept(tmp_path / "users.json"),
        )
        with pytest.raises(ExitedBeforeReady) as failed:
            server.start()

    assert failed.value.name == "nats-server" and failed.value.code != 0
    message = str(failed.value)
    assert f"nats-server exited with code {failed.value.code} before it was ready" in message
    assert "address already in use" in message
