"""`dispo up` on a fresh folder: everything SERVING, crashes restarted, data kept across restarts."""

import asyncio
import json
import os
import signal
import socket
import stat
import subprocess
from pathlib import Path

import asyncpg
import httpx
import pytest
import yaml
from dispo.libs.catalogue import example_calling, parse_catalogue
from dispo.libs.db.roles import without_password
from dispo.libs.health import health_status
from dispo.libs.process import free_port
from dispo.tools.stack.nats_auth import ADMIN
from dispo.tools.stack.stack import SERVICES, StackOptions, read_state, service_specs
from sqlalchemy.engine import make_url
from support import eventually
from support.stack import DISPO, RunningStack, alive

pytestmark = pytest.mark.long_file


@pytest.fixture
def stack(tmp_path):
    running = RunningStack.fresh(tmp_path)
    yield running
    running.kill()


def open_to_others(root: Path) -> list[str]:
    """Every file under ``root`` a user other than its owner may read or write, and every
    folder of the stack's own (logs, the pool's registry, PostgreSQL's) such a user may
    enter, with its mode. (The data folder itself is opened to the server's system user when
    ``dispo up`` runs as root; inside PostgreSQL's folder the server and its wheel decide.)"""
    found = []
    server = root / "postgres"
    for path in [root, *root.rglob("*")]:
        if server in path.parents:
            continue
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:  # gone since it was listed (a stream's block file, say)
            continue
        if stat.S_ISREG(mode) and mode & 0o077:
            found.append(f"{path.relative_to(root)} {mode & 0o777:o}")
        elif path.name in {"logs", "pool", "postgres"} and stat.S_ISDIR(mode) and mode & 0o077:
            found.append(f"{path.relative_to(root)}/ {mode & 0o777:o}")
    return found


async def test_up_status_restart_and_data_kept(stack):
    # a log an earlier version left readable by everyone
    (stack.data_dir / "logs").mkdir(parents=True)
    (stack.data_dir / "logs").chmod(0o755)
    earlier = stack.data_dir / "logs" / "gateway.log"
    earlier.write_text("an earlier start\n")
    earlier.chmod(0o644)
    await stack.up()

    code, report = stack.status()
    assert code == 0
    assert set(report) == {*SERVICES, "console"}
    console = f"http://127.0.0.1:{stack.env['DISPO_CONSOLE_PORT']}"
    assert report.pop("console") == {"address": console, "status": "SERVING", "metrics": ""}
    for name in SERVICES:
        assert report[name] == {
            "address": f"127.0.0.1:{stack.env[f'DISPO_{name.upper()}_PORT']}",
            "status": "SERVING",
            "metrics": f"http://127.0.0.1:{stack.env[f'DISPO_{name.upper()}_METRICS_PORT']}/metrics",
        }
    # dispo up printed them too, and each answers
    shown = stack.output.read_text()
    assert f"console          {console}" in shown
    async with httpx.AsyncClient() as http:
        for info in report.values():
            assert info["metrics"] in shown
            assert "process_cpu_seconds_total" in (await http.get(info["metrics"])).text

    # the first start made an admin token, owner-only, said where, and the CLI reads it there;
    # each process got its own service token
    token_file = stack.data_dir / "admin.token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert str(token_file) in stack.output.read_text()
    listed = stack.run("tokens", "--json", "list")
    assert listed.returncode == 0, listed.stdout
    made = json.loads(listed.stdout)
    assert [t["kind"] for t in made].count("TOKEN_KIND_ADMIN") == 1
    assert {t["service"] for t in made if t["kind"] == "TOKEN_KIND_SERVICE"} == {
        *SERVICES,
        "pool-worker",
    }
    first_token = stack.token

    # the pool's worker process and the demo downstream run beside the services
    state = read_state(stack.data_dir)
    assert {"pool-worker", "demo-downstream", "console"} == set(state["companions"])
    assert all(alive(info["pid"]) for info in state["companions"].values())
    async with httpx.AsyncClient() as http:
        assert (
            await http.get(f"http://127.0.0.1:{stack.env['DEMO_PORT']}/healthz")
        ).status_code == 200
        # the console calls this stack's gateway with the token it is given
        page = await http.get(f"{console}/tasks", cookies={"dispo_token": stack.token})
        assert page.status_code == 200 and "SUCCEEDED" in page.text
        # and this stack's pool (the Cron pool page)
        pool = await http.get(f"{console}/pool", cookies={"dispo_token": stack.token})
        assert pool.status_code == 200 and 'data-figure="busy"' in pool.text

    # the example catalogue calls the demo downstream this stack started, on its port
    # (--demo-port), not the default 8181
    submission = stack.data_dir.parent / "content-42.yaml"
    submission.write_text(
        "business: ecommerce\nidempotency_key: content-42-raise\n"
        "cells: [{cell: update_quality_level, payload: {content_id: content-42, level: 3}}]\n"
    )
    submitted = stack.run("submit", str(submission), "--json")
    assert submitted.returncode == 0, submitted.stdout

    async def demo_called() -> bool:
        async with httpx.AsyncClient() as http:
            answer = await http.get(f"http://127.0.0.1:{stack.env['DEMO_PORT']}/calls")
        return len(answer.json()["calls"]) > 0

    await eventually(demo_called, timeout=30, interval=0.2, wanted="the demo downstream called")

    # each service logs in to PostgreSQL as its own role; no process holds the superuser's
    # password or another service's
    passwords = stack.database_passwords()
    for name in SERVICES:
        pid = state["services"][name]["pid"]
        environ = dict(
            item.split("=", 1)
            for item in Path(f"/proc/{pid}/environ").read_text().split("\0")
            if "=" in item
        )
        assert make_url(environ["DISPO_DATABASE_URL"]).username == f"dispo_{name}"
        held = {
            key for key, password in passwords.items() if password in "\0".join(environ.values())
        }
        assert held == {name}, (name, held)
    # and the state file, which every command reads, holds none of them
    kept = (stack.data_dir / "stack.json").read_bytes()
    assert not [key for key, password in passwords.items() if password.encode() in kept]
    # every file the stack keeps (secrets, state, logs, the pool's registry) is its owner's
    # alone, the earlier version's log too, which it still appends to
    assert (stack.data_dir / "pool" / "local-crons.sqlite").exists()
    assert open_to_others(stack.data_dir) == []
    assert earlier.read_text().startswith("an earlier start\n")

    # a crashed service is restarted
    executor = state["services"]["executor"]
    os.kill(executor["pid"], signal.SIGKILL)
    executor_log = stack.data_dir / "logs" / "executor.log"

    async def restarted() -> bool:
        return (
            executor_log.read_text().count('"event": "serving"') >= 2
            and await health_status(executor["address"]) == "SERVING"
        )

    await eventually(restarted, timeout=60, interval=0.2, wanted="the executor restarted")
    assert not alive(executor["pid"])
    assert alive(read_state(stack.data_dir)["services"]["executor"]["pid"])

    # data written now survives a full stop and start
    conn = await asyncpg.connect(
        state["database_url"], password=stack.database_passwords()["postgres"]
    )
    await conn.execute(
        "CREATE TABLE public.kept (v text); INSERT INTO public.kept VALUES ('still here')"
    )
    await conn.close()

    state = read_state(stack.data_dir)
    pids = [info["pid"] for group in ("services", "companions") for info in state[group].values()]
    assert await stack.down() == 0
    assert not any(alive(pid) for pid in pids if pid != executor["pid"])
    assert read_state(stack.data_dir) is None
    code, report = stack.status()
    assert code == 3 and {info["status"] for info in report.values()} == {"UNREACHABLE"}

    await stack.up()
    assert stack.token == first_token  # made once, kept
    state = read_state(stack.data_dir)
    conn = await asyncpg.connect(
        state["database_url"], password=stack.database_passwords()["postgres"]
    )
    assert await conn.fetchval("SELECT v FROM public.kept") == "still here"
    await conn.close()
    assert stack.status()[0] == 0
    assert await stack.down() == 0


@pytest.mark.blank_database  # the services create their schemas in it
async def test_up_with_external_database_and_nats_starts_only_services(
    infra, database_url, role_url, nats_url, tmp_path
):
    env = {
        **os.environ,
        # An external bus: the services get the credentials of dispo up's environment.
        **infra.nats_users.env(ADMIN),
        "DISPO_DATA_DIR": str(tmp_path / "data"),
        "DISPO_GATEWAY_PORT": str(free_port()),
        "DISPO_EXECUTOR_PORT": str(free_port()),
        "DISPO_GATEWAY_METRICS_PORT": str(free_port()),
        "DISPO_EXECUTOR_METRICS_PORT": str(free_port()),
        # each service's own role (the cluster's roles are the session's)
        "DISPO_GATEWAY_DATABASE_URL": role_url("gateway"),
        "DISPO_EXECUTOR_DATABASE_URL": role_url("executor"),
    }
    up = subprocess.Popen(
        [
            DISPO,
            "up",
            "--services",
            "gateway,executor",
            "--executors",
            "2",
            "--demo-port",
            "0",
            "--console-port",
            "0",
            "--database-url",
            database_url,
            "--nats-url",
            nats_url,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        printed = []
        async with asyncio.timeout(120):
            while not printed or "Ctrl-C" not in printed[-1]:
                printed.append(await asyncio.to_thread(up.stdout.readline))
                assert printed[-1], "".join(printed)
        assert not (tmp_path / "data" / "postgres").exists()
        assert not (tmp_path / "data" / "nats").exists()
        state = read_state(tmp_path / "data")
        # two executors sharing the work, the second on a port of its own
        assert set(state["services"]) == {"gateway", "executor", "executor-2"}
        # the state file names the database but not the password
        given = make_url(database_url)
        assert given.password
        assert given.password.encode() not in (tmp_path / "data" / "stack.json").read_bytes()
        shown = make_url(state["database_url"])
        assert shown.password is None
        assert (shown.username, shown.host, shown.database) == (
            given.username,
            given.host,
            given.database,
        )
        for info in state["services"].values():
            assert await health_status(info["address"]) == "SERVING"
        conn = await asyncpg.connect(database_url)
        schemas = {r[0] for r in await conn.fetch("SELECT nspname FROM pg_namespace")}
        await conn.close()
        assert {"gateway", "executor"} <= schemas
        up.send_signal(signal.SIGINT)
        assert await asyncio.to_thread(up.wait, 60) == 0
        assert infra.postgres.running() and infra.nats.running()
    finally:
        if up.poll() is None:
            up.kill()


def test_the_reconciler_calls_the_gateway_and_pool_on_the_ports_the_stack_gave_them(
    tmp_path, monkeypatch
):
    """Not the default ports: a stack on ports of its own hands the reconciler its gateway's
    and pool's; a setting the operator made in the environment stays theirs."""

    ports = {name: 41000 + i for i, name in enumerate(SERVICES)}
    options = StackOptions(tmp_path, ports=ports, demo_port=0)
    urls = dict.fromkeys(SERVICES, "postgresql://x@127.0.0.1/x")
    monkeypatch.delenv("DISPO_RECONCILER_GATEWAY_ADDRESS", raising=False)
    monkeypatch.delenv("DISPO_RECONCILER_DRIFT_POOL_ADDRESS", raising=False)
    [reconciler] = [s for s in service_specs(options, urls, "nats://x") if s.name == "reconciler"]
    assert reconciler.env["DISPO_RECONCILER_GATEWAY_ADDRESS"] == f"127.0.0.1:{ports['gateway']}"
    assert reconciler.env["DISPO_RECONCILER_DRIFT_POOL_ADDRESS"] == f"127.0.0.1:{ports['pool']}"

    monkeypatch.setenv("DISPO_RECONCILER_GATEWAY_ADDRESS", "gateway.internal:50051")
    alone = StackOptions(tmp_path, ports=ports, demo_port=0, services=("reconciler",))
    [reconciler] = service_specs(alone, urls, "nats://x")
    assert "DISPO_RECONCILER_GATEWAY_ADDRESS" not in reconciler.env  # the environment's
    assert "DISPO_RECONCILER_DRIFT_POOL_ADDRESS" not in reconciler.env  # no pool here


def test_the_gateway_and_reconciler_read_outputs_from_the_stacks_executor(tmp_path, monkeypatch):
    """GetTask's outputs and a callback's result come from the executor the stack started,
    on its port, with several executors too (the first one's: any replica answers)."""
    ports = {name: 42000 + i for i, name in enumerate(SERVICES)}
    options = StackOptions(tmp_path, ports=ports, demo_port=0, replicas={"executor": 3})
    urls = dict.fromkeys(SERVICES, "postgresql://x@127.0.0.1/x")
    monkeypatch.delenv("DISPO_GATEWAY_EXECUTOR_ADDRESS", raising=False)
    monkeypatch.delenv("DISPO_RECONCILER_EXECUTOR_ADDRESS", raising=False)
    specs = {s.name: s for s in service_specs(options, urls, "nats://x")}
    assert {"executor", "executor-2", "executor-3"} <= set(specs)
    executor = f"127.0.0.1:{ports['executor']}"
    assert specs["executor"].address == executor
    assert specs["gateway"].env["DISPO_GATEWAY_EXECUTOR_ADDRESS"] == executor
    assert specs["reconciler"].env["DISPO_RECONCILER_EXECUTOR_ADDRESS"] == executor


def test_the_gateway_seals_erasures_with_the_stacks_reconciler(tmp_path, monkeypatch):
    """EraseTask of a FAILED task asks the reconciler the stack started (ADR-0114)."""
    ports = {name: 42000 + i for i, name in enumerate(SERVICES)}
    options = StackOptions(tmp_path, ports=ports, demo_port=0)
    urls = dict.fromkeys(SERVICES, "postgresql://x@127.0.0.1/x")
    monkeypatch.delenv("DISPO_GATEWAY_RECONCILER_ADDRESS", raising=False)
    specs = {s.name: s for s in service_specs(options, urls, "nats://x")}
    reconciler = f"127.0.0.1:{ports['reconciler']}"
    assert specs["gateway"].env["DISPO_GATEWAY_RECONCILER_ADDRESS"] == reconciler


def test_the_console_calls_each_service_on_the_port_the_stack_gave_it(tmp_path):
    """The console's pages call the stack's services, the intelligence service among them."""
    ports = {name: 42000 + i for i, name in enumerate(SERVICES)}
    options = StackOptions(tmp_path, ports=ports, demo_port=0, console_port=42100)
    urls = dict.fromkeys(SERVICES, "postgresql://x@127.0.0.1/x")
    [console] = [s for s in service_specs(options, urls, "nats://x") if s.name == "console"]
    for service in ("gateway", "reconciler", "executor", "pool", "intelligence"):
        wanted = f"127.0.0.1:{ports[service]}"
        assert console.env[f"DISPO_CONSOLE_{service.upper()}_ADDRESS"] == wanted


def test_the_example_catalogue_calls_the_demo_downstream_on_the_stacks_port(tmp_path, monkeypatch):
    """``--demo-port P``: every service reads the example catalogue from the data folder,
    its downstreams on P; a catalogue the operator names stays theirs; no demo, no copy."""
    monkeypatch.delenv("DISPO_CATALOGUE", raising=False)
    urls = dict.fromkeys(SERVICES, "postgresql://x@127.0.0.1/x")
    options = StackOptions(tmp_path, demo_port=18555)
    specs = service_specs(options, urls, "nats://x")
    read = {spec.env.get("DISPO_CATALOGUE") for spec in specs if spec.name in SERVICES}
    assert read == {str(tmp_path / "catalogue.yaml")} == {str(options.demo_catalogue)}
    catalogue = parse_catalogue(yaml.safe_load(example_calling(options.demo_origin)))
    called = {d.base_url for d in catalogue.downstreams.values()}
    called |= {d.health_url for d in catalogue.downstreams.values() if d.health_url}
    assert called == {"http://127.0.0.1:18555", "http://127.0.0.1:18555/healthz"}

    assert StackOptions(tmp_path, demo_port=0).demo_catalogue is None
    assert StackOptions(tmp_path, services=("gateway",)).demo_catalogue is None
    monkeypatch.setenv("DISPO_CATALOGUE", "/srv/mine.yaml")
    assert StackOptions(tmp_path, demo_port=18555).demo_catalogue is None
    specs = service_specs(StackOptions(tmp_path, demo_port=18555), urls, "nats://x")
    assert not any("DISPO_CATALOGUE" in spec.env for spec in specs)  # the environment's


def test_a_url_without_its_password_keeps_every_other_part():
    """What state files and messages show of a database URL: no password, in the user part
    or the query, and everything else as it was."""
    for url, shown in [
        (
            "postgresql://postgres:s3cret@/postgres?host=/tmp/pg",
            "postgresql://postgres@/postgres?host=%2Ftmp%2Fpg",
        ),
        (
            "postgresql+asyncpg://dispo_gateway:s3cret@db.internal:6432/dispo?sslmode=require",
            "postgresql+asyncpg://dispo_gateway@db.internal:6432/dispo?sslmode=require",
        ),
        (
            "postgresql://u@h/d?password=s3cret&sslmode=require",
            "postgresql://u@h/d?sslmode=require",
        ),
        ("postgresql://h/d", "postgresql://h/d"),
    ]:
        assert without_password(url) == shown
        assert "s3cret" not in without_password(url)


def test_free_port_never_hands_this_process_the_same_port_twice():
    """Ports asked for before any is bound (a NATS node's client, cluster and monitoring
    ports) are all different: at random among ~12,000, 500 of them would share one."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)


def test_a_free_port_is_one_no_outgoing_connection_can_take_before_its_server_binds():
    """free_port answers below the kernel's ephemeral range, where the client sockets of
    other processes never land, a port free to listen on."""
    start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(port < start for port in ports), (start, ports)
    assert len(ports) > 1  # at random, not one port for every caller
    with socket.socket() as server:
        server.bind(("127.0.0.1", ports.pop()))
        server.listen()
