"""Scale-out on the existing engines: two gateways and three executors against one
PostgreSQL and a three-node NATS JetStream cluster (every stream on three replicas). A steady
stream of tasks whose nodes call a downstream with non-idempotent actions; the NATS node
leading the task stream is killed with SIGKILL mid-run. Every task still succeeds, none is
lost, and the downstream — which counts every request and merges nothing by key — saw each
node's call exactly once."""

import asyncio
from collections import Counter

import pytest
import structlog
from aiohttp import web
from dispo.libs.bus import Bus
from dispo.sdk import AsyncClient, DispoError, cell
from dispo.tools.stack.cluster import NatsCluster
from support import eventually

TASKS = 45
NODES = ("a", "b", "c")

CATALOGUE = """
downstreams:
  effects:
    base_url: {url}
    timeout_ms: 10000
    max_concurrency: 16
cells:
  effect3:
    description: Three calls that must not be repeated (b and c after a).
    fields: {{}}
    actions:
      a: {{kind: http, downstream: effects, path: "/effect/{{task_id}}/a", probe_path: "/effects/{{idempotency_key}}", idempotent: false}}
      b: {{kind: http, downstream: effects, path: "/effect/{{task_id}}/b", probe_path: "/effects/{{idempotency_key}}", idempotent: false, depends_on: [a]}}
      c: {{kind: http, downstream: effects, path: "/effect/{{task_id}}/c", probe_path: "/effects/{{idempotency_key}}", idempotent: false, depends_on: [a]}}
"""


@pytest.fixture
def cluster(tmp_path, infra):
    # The session's users, so the services started for the test connect to it as to it.
    nats = NatsCluster(tmp_path / "nats", infra.nats_users, size=3, log_dir=tmp_path / "logs")
    nats.start()
    yield nats
    nats.stop(kill=True)


async def stream_leader(cluster: NatsCluster, stream: str) -> str:
    bus = await Bus.connect(
        cluster.urls,
        name="test-leader",
        credentials=cluster.credentials(),
        max_reconnect_attempts=3,
    )
    try:
        info = await bus.js.stream_info(stream)
        assert info.cluster is not None and info.config.num_replicas == 3
        return info.cluster.leader
    finally:
        await bus.close()


async def test_a_stream_declared_without_a_quorum_is_made_once_the_cluster_has_one(cluster):
    """A service starting while the cluster cannot answer JetStream (two of its three nodes
    down, no meta leader) waits for it instead of failing its start: the declaration is
    tried again until the nodes are back, and the stream then has its three replicas."""
    for node in cluster.nodes[1:]:
        node.stop(kill=True)
    bus = await Bus.connect(
        cluster.urls, name="test-quorum", credentials=cluster.credentials(), replicas=3
    )
    try:
        with structlog.testing.capture_logs() as logs:
            declaring = asyncio.create_task(
                bus.ensure_stream("QUORUM", ["quorum.>"], patience=300.0)
            )
            await eventually(
                lambda: [e for e in logs if e["event"] == "stream not settled yet; trying again"],
                timeout=60.0,
                wanted="a declaration tried again",
            )
            assert not declaring.done()
            await asyncio.to_thread(cluster.start, 120.0)
            await asyncio.wait_for(declaring, 120.0)
        info = await bus.js.stream_info("QUORUM")
        assert info.config.num_replicas == 3 and info.config.subjects == ["quorum.>"]
    finally:
        await bus.close()


async def test_two_gateways_three_executors_survive_a_killed_nats_node_without_double_effects(
    start_service, fake_server, cluster, tmp_path, tokens
):
    seen_keys: set[str] = set()

    async def effect(request: web.Request) -> web.Response:
        seen_keys.add(request.headers.get("Idempotency-Key", ""))
        return web.json_response({})

    async def probe(request: web.Request) -> web.Response:
        return web.json_response({"done": request.match_info["key"] in seen_keys})

    downstream = await fake_server(
        {("POST", "/effect/{task}/{node}"): effect, ("GET", "/effects/{key:.+}"): probe}
    )
    catalogue = tmp_path / "catalogue.yaml"
    catalogue.write_text(CATALOGUE.format(url=downstream.url))
    env = {
        "DISPO_NATS_URL": cluster.url,
        "DISPO_STREAM_REPLICAS": "3",
        "DISPO_CATALOGUE": str(catalogue),
        "DISPO_LOG_LEVEL": "WARNING",
        "DISPO_EXECUTOR_ACK_WAIT_SECONDS": "5",
        "DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS": "0",
        "DISPO_EXECUTOR_BREAKER_THRESHOLD": "1000",
        "DISPO_GATEWAY_WATCH_POLL_INTERVAL_SECONDS": "0.2",
    }
    gateways = [await start_service("gateway", env) for _ in range(2)]
    for _ in range(3):
        await start_service("executor", env)
    clients = [AsyncClient(g.address, token=tokens.admin) for g in gateways]
    accepted: list[str] = []

    async def submit(i: int) -> None:
        # Through both gateways in turn; a refused Submit is retried with its key (same task).
        async def once():
            try:
                return await clients[i % 2].submit(
                    "scale", [cell("effect3")], idempotency_key=f"t{i}"
                )
            except DispoError as error:
                return error

        answer = await eventually(
            once, lambda a: not isinstance(a, DispoError), wanted=f"task {i} accepted"
        )
        accepted.append(answer.task_id)

    try:
        for i in range(TASKS // 3):
            await submit(i)
            await asyncio.sleep(0.05)
        # Work in flight on every hop, then the node leading the task stream dies.
        await eventually(lambda: len(downstream.requests) >= 5, wanted="calls under way")
        leader = await stream_leader(cluster, "TASKS")
        cluster.node(leader).stop(kill=True)
        for i in range(TASKS // 3, TASKS):
            await submit(i)
            await asyncio.sleep(0.05)

        async def succeeded() -> list[str]:
            return [
                task_id
                for task_id in accepted
                if (await clients[0].get(task_id)).status == "SUCCEEDED"
            ]

        done = await eventually(
            succeeded,
            lambda ids: len(ids) == TASKS,
            timeout=180,
            interval=0.5,
            wanted=f"all {TASKS} tasks SUCCEEDED",
            describe=lambda ids: f"{len(ids)} succeeded",
        )
        assert sorted(done) == sorted(accepted) and len(set(accepted)) == TASKS
        # Both gateways see every task, SUCCEEDED (one database behind them), and nothing more.
        for client in clients:
            listed = [t async for t in client.list(business="scale", page_size=100)]
            assert sorted(t.task_id for t in listed) == sorted(accepted)
            assert {t.status for t in listed} == {"SUCCEEDED"}
        # Exactly one call per node of every task: none lost, none executed twice.
        calls = Counter(r.path for r in downstream.received() if r.method == "POST")
        wanted = {f"/effect/{t}/{n}" for t in accepted for n in NODES}
        assert set(calls) == wanted
        repeated = {path: count for path, count in calls.items() if count != 1}
        assert not repeated, f"executed more than once: {repeated}"
        keys = Counter(r.headers.get("Idempotency-Key") for r in downstream.received())
        assert len(keys) == 3 * TASKS and set(keys.values()) == {1}
    finally:
        for client in clients:
            await client.close()
