"""Fixtures for the pipeline tests (gateway, executor, SDK): a real demo downstream
process, a test catalogue pointing at it, and gateway / executor processes wired to both.

Imported by tests/{gateway,executor,sdk}/conftest.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from dispo.libs.process import ManagedProcess, ProcessSpec, free_port, python_module
from dispo.sdk import AsyncClient
from support import eventually
from support.auth import session_tokens

TEST_CATALOGUE = """
downstreams:
  demo:
    base_url: {url}
    timeout_ms: 5000
    max_concurrency: 8
    health_url: {url}/healthz
  narrow:
    base_url: {url}
    timeout_ms: 30000
    max_concurrency: 2
cells:
  ticket:
    description: Open a review ticket; its output declares the ticket's number.
    fields:
      name: {{type: string, required: true}}
    actions:
      open:
        kind: http
        downstream: demo
        path: /reviews/{{payload.name}}
        idempotent: true
        output: {{ticket_id: {{type: string, required: true}}, ok: boolean}}
  tagged:
    description: One call about a content item; its content_id is a label of the task.
    fields:
      content_id: {{type: string, required: true}}
      rank: {{type: integer}}
    labels: [content_id, rank]
    actions:
      call:
        kind: http
        downstream: demo
        path: /step/{{payload.content_id}}
        idempotent: true
  tell:
    description: Tell someone about a ticket (its number from the payload).
    fields:
      name: {{type: string, required: true}}
      ticket: {{type: string}}
      note: {{type: string}}
    actions:
      send:
        kind: http
        downstream: demo
        path: /tell/{{payload.name}}
        idempotent: true
  review_and_close:
    description: Open a ticket, then close it by the number the first call returned.
    fields:
      name: {{type: string, required: true}}
    result: open
    actions:
      open:
        kind: http
        downstream: demo
        path: /reviews/{{payload.name}}
        idempotent: true
        output: {{ticket_id: string}}
      close:
        kind: http
        downstream: demo
        path: /closed/{{nodes.open.output.ticket_id}}
        idempotent: true
        depends_on: [open]
  sized:
    description: One call whose output may be at most 100 bytes, with a declared field.
    fields:
      name: {{type: string, required: true}}
    actions:
      call:
        kind: http
        downstream: demo
        path: /sized/{{payload.name}}
        idempotent: true
        max_output_bytes: 100
        output: {{count: {{type: integer, required: true}}}}
  step:
    description: One idempotent call to the demo downstream.
    fields:
      name: {{type: string, required: true}}
    actions:
      call:
        kind: http
        downstream: demo
        path: /step/{{payload.name}}
        probe_path: /effects/{{idempotency_key}}
        idempotent: true
  step_once:
    description: One call that must not be repeated blindly (not idempotent).
    fields:
      name: {{type: string, required: true}}
    actions:
      call:
        kind: http
        downstream: demo
        path: /once/{{payload.name}}
        probe_path: /effects/{{idempotency_key}}
        idempotent: false
  quick_step:
    description: One idempotent call that gives up waiting for its answer after 2 s.
    fields:
      name: {{type: string, required: true}}
    actions:
      call:
        kind: http
        downstream: demo
        path: /quick/{{payload.name}}
        probe_path: /effects/{{idempotency_key}}
        idempotent: true
        timeout_ms: 2000
  quick_once:
    description: One call not to repeat blindly that gives up waiting for its answer after 2 s.
    fields:
      name: {{type: string, required: true}}
    actions:
      call:
        kind: http
        downstream: demo
        path: /quick-once/{{payload.name}}
        probe_path: /effects/{{idempotency_key}}
        idempotent: false
        timeout_ms: 2000
  late_once:
    description: One call not to repeat blindly that gives up after 1 s; its effect may land 10 s after it was sent.
    fields:
      name: {{type: string, required: true}}
    actions:
      call:
        kind: http
        downstream: demo
        path: /late-once/{{payload.name}}
        probe_path: /effects/{{idempotency_key}}
        idempotent: false
        timeout_ms: 1000
        max_effect_seconds: 10
  pair:
    description: Two calls, the second after the first.
    fields:
      name: {{type: string, required: true}}
    conflict: {{key: name, effect: paired}}
    actions:
      first:
        kind: http
        downstream: demo
        path: /pair/{{payload.name}}/first
        idempotent: true
      second:
        kind: http
        downstream: demo
        path: /pair/{{payload.name}}/second
        idempotent: true
        depends_on: [first]
  narrow_step:
    description: One call to a downstream that takes two calls at a time.
    fields:
      name: {{type: string, required: true}}
    actions:
      call:
        kind: http
        downstream: narrow
        path: /narrow/{{payload.name}}
        idempotent: true
  set_level:
    description: One call whose payload carries numbers.
    fields:
      name: {{type: string, required: true}}
      level: {{type: integer, required: true}}
      weight: {{type: number}}
    actions:
      call:
        kind: http
        downstream: demo
        path: /level/{{payload.name}}/{{payload.level}}
        idempotent: true
  noop:
    fields: {{}}
    actions:
      noop: {{kind: noop}}
  note:
    description: A payload carried through the task and no downstream call.
    fields:
      text: {{type: string, required: true}}
    actions:
      noop: {{kind: noop}}
  review:
    description: Wait up to an hour for a reviewer's verdict; no verdict fails it.
    fields:
      name: {{type: string, required: true}}
    actions:
      verdict:
        kind: wait
        signal: verdict
        timeout_seconds: 3600
        on_timeout: fail
        output: {{verdict: {{type: string, required: true}}, note: string}}
        choices:
          approve: {{verdict: approved}}
          reject: {{verdict: rejected}}
  lenient_review:
    description: Wait a minute for a verdict; no verdict approves.
    fields:
      name: {{type: string, required: true}}
    actions:
      verdict:
        kind: wait
        signal: verdict
        timeout_seconds: 60
        on_timeout: succeed
        default_output: {{verdict: approved, note: no answer}}
        output: {{verdict: {{type: string, required: true}}, note: string}}
"""

# Fast timings for tests: short leases and ack waits so crash recovery happens within
# seconds, tiny backoffs (configuration, not sleeps in the tests).
EXECUTOR_TEST_ENV = {
    "DISPO_EXECUTOR_LEASE_TTL_SECONDS": "1.5",
    "DISPO_EXECUTOR_ACK_WAIT_SECONDS": "2",
    "DISPO_EXECUTOR_RETRY_BASE_DELAY_SECONDS": "0.05",
    "DISPO_EXECUTOR_RETRY_MAX_DELAY_SECONDS": "0.2",
    "DISPO_EXECUTOR_BREAKER_THRESHOLD": "1000",
    "DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS": "0",
}


class Downstream(ManagedProcess):
    """The demo downstream as a real process the test controls over HTTP."""

    def __init__(self, port: int, log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        super().__init__(
            ProcessSpec(
                "demo-downstream",
                [*python_module("dispo.executor.demo_downstream"), "--port", str(port)],
                {},
                None,
                log_path,
                http_health=f"{self.url}/healthz",
            )
        )

    async def control(self, **switches: Any) -> None:
        async with httpx.AsyncClient() as client:
            (await client.post(f"{self.url}/control", json=switches)).raise_for_status()

    async def state(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"{self.url}/calls")).json()

    async def calls(self) -> dict[str, int]:
        return (await self.state())["calls"]

    async def effects(self) -> dict[str, int]:
        return (await self.state())["effects"]

    async def wait_held(self, count: int = 1, timeout: float = 30.0) -> None:
        """Until ``count`` calls are being held open (see the ``hold`` switch)."""
        await eventually(
            self.state,
            lambda state: state["held"] >= count,
            timeout=timeout,
            wanted=f"{count} held call(s)",
        )


@asynccontextmanager
async def running_downstream(folder: Path) -> AsyncIterator[Downstream]:
    """The demo downstream on a free port, logging to ``folder``, killed on exit."""
    d = Downstream(free_port(), folder / "downstream.log")
    d.spawn()
    try:
        await d.wait_ready(15)
        yield d
    finally:
        d.kill()


@pytest.fixture
async def downstream(tmp_path: Path) -> AsyncIterator[Downstream]:
    async with running_downstream(tmp_path) as d:
        yield d


@pytest.fixture(scope="module")
async def module_downstream(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Downstream]:
    """The demo downstream the tests of one module share (beside :func:`module_services`)."""
    async with running_downstream(tmp_path_factory.mktemp("downstream")) as d:
        yield d


@pytest.fixture
def catalogue_file(tmp_path: Path, downstream: Downstream) -> Path:
    path = tmp_path / "catalogue.yaml"
    path.write_text(TEST_CATALOGUE.format(url=downstream.url))
    return path


@pytest.fixture
def egress_allow(downstream: Downstream) -> str:
    """``DISPO_EGRESS_ALLOW`` of the services a pipeline starts: the demo downstream (a test
    that sends callbacks elsewhere overrides this fixture)."""
    return downstream.url


@dataclass
class Pipeline:
    start_service: Any
    catalogue: Path
    # DISPO_EGRESS_ALLOW for the gateway ("": the embedded default's, the demo downstream)
    egress_allow: str = ""
    gateway: Any = None
    executors: list[Any] = field(default_factory=list)
    # Where the pipeline's executor listens, known before it starts: the gateway reads the
    # outputs of its views there (DISPO_GATEWAY_EXECUTOR_ADDRESS). An executor started while
    # another serves there takes a free port.
    executor_port: int = field(default_factory=free_port)
    # The admin token the pipeline's clients send (the tests act as an operator unless they
    # ask for a business's token: support.auth.business_token).
    token: str = field(default_factory=lambda: session_tokens().admin)

    async def start_gateway(self, **env: str) -> Any:
        self.gateway = await self.start_service(
            "gateway",
            {
                "DISPO_CATALOGUE": str(self.catalogue),
                "DISPO_GATEWAY_WATCH_POLL_INTERVAL_SECONDS": "0.2",
                "DISPO_GATEWAY_EXECUTOR_ADDRESS": self.executor_address,
                **({"DISPO_EGRESS_ALLOW": self.egress_allow} if self.egress_allow else {}),
                **env,
            },
        )
        return self.gateway

    @property
    def executor_address(self) -> str:
        return f"127.0.0.1:{self.executor_port}"

    async def start_executor(self, **env: str) -> Any:
        taken = any(e.address == self.executor_address and e.running() for e in self.executors)
        executor = await self.start_service(
            "executor",
            {**EXECUTOR_TEST_ENV, "DISPO_CATALOGUE": str(self.catalogue), **env},
            port=0 if taken else self.executor_port,
        )
        self.executors.append(executor)
        return executor

    def client(self, token: str | None = None) -> AsyncClient:
        return AsyncClient(self.gateway.address, token=token or self.token)


@pytest.fixture
def executor_port() -> int:
    """Where a test's pipeline executor listens: known before anything starts, so a
    reconciler started first can be told where to read results."""
    return free_port()


@pytest.fixture
async def pipeline(
    start_service: Any, catalogue_file: Path, egress_allow: str, executor_port: int
) -> AsyncIterator[Pipeline]:
    """Gateway and one executor running against the test catalogue."""
    p = Pipeline(start_service, catalogue_file, egress_allow, executor_port=executor_port)
    await p.start_gateway()
    await p.start_executor()
    yield p


@pytest.fixture
async def gateway_only(
    start_service: Any, catalogue_file: Path, egress_allow: str
) -> AsyncIterator[Pipeline]:
    """Just the gateway (for what needs no executor: validation, queries)."""
    p = Pipeline(start_service, catalogue_file, egress_allow)
    await p.start_gateway()
    yield p


@pytest.fixture
async def gateway_client(gateway_only: Pipeline) -> AsyncIterator[AsyncClient]:
    async with gateway_only.client() as c:
        yield c


@pytest.fixture
async def client(pipeline: Pipeline) -> AsyncIterator[AsyncClient]:
    async with pipeline.client() as c:
        yield c


def dump(view: Any) -> str:
    """A task view as text for assertion messages."""
    return json.dumps(
        {n.node_id: [n.status, n.attempts, n.last_error] for n in view.nodes}, indent=1
    )


async def wait_until(
    client: Any,
    task_id: str,
    predicate: Callable[[Any], bool],
    timeout: float = 30.0,
    wanted: str = "a view matching the predicate",
) -> Any:
    """Poll GetTask until ``predicate(view)`` holds; the view then."""
    return await eventually(
        lambda: client.get(task_id),
        predicate,
        timeout=timeout,
        wanted=f"task {task_id} in {wanted}",
        describe=lambda view: f"{view.status}\n{dump(view)}",
    )


async def wait_status(client: Any, task_id: str, statuses: set[str], timeout: float = 30.0) -> Any:
    """Poll GetTask until the task is in one of ``statuses`` (for non-terminal ones)."""
    return await wait_until(
        client, task_id, lambda view: view.status in statuses, timeout, wanted=str(statuses)
    )


async def stream_messages(bus: Any, subject: str, stream: str = "TASKS") -> list[Any]:
    """Every message currently stored on ``subject`` (a subject or a filter with wildcards),
    read with an ephemeral consumer."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    info = await bus.js.stream_info(stream, subjects_filter=subject)
    count = sum((info.state.subjects or {}).values())  # per subject the filter matches
    if not count:
        return []
    sub = await bus.js.pull_subscribe(
        subject, stream=stream, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    out: list[Any] = []
    while len(out) < count:
        out.extend(await sub.fetch(count - len(out), timeout=5))
    await sub.unsubscribe()
    return out
