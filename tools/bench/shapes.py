"""The bench's workloads and the catalogue they run on.

- ``noop``: one node that does nothing (measures the platform alone);
- ``dag3``: three noop nodes, ``b`` and ``c`` after ``a`` (scheduling of a DAG);
- ``http``: the same three-node DAG of HTTP actions against a fast local downstream (the
  demo downstream, a process of its own the stack starts);
- ``mixed``: that DAG with ``a`` and ``c`` not idempotent (each with a status probe) and
  ``b`` idempotent — the fault campaign's workload (``dispo bench faults``);
- ``outputs``: the ``http`` DAG with ``b`` and ``c`` calling a path that carries ``a``'s
  output (``{nodes.a.output.key}``, ADR-0093): what passing an output along costs, against
  ``http``;
- ``worker``: the three-node DAG of worker actions on one queue (ADR-0099), served by the
  bench's own workers (:mod:`dispo.tools.bench.worker`, processes of their own the bench
  starts), each run answered at once with a small output;
- ``wait``: one wait node (ADR-0102): every task submitted parks, the executor's memory and
  CPU are read while they all wait, then each is signalled once and ends
  (:mod:`dispo.tools.bench.waiting`).

A bench that starts its own stack writes :func:`catalogue_yaml` to a file and names it in
``DISPO_CATALOGUE``; against a running stack only ``noop`` exists (the shipped catalogue).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    name: str
    cell: str
    nodes: int
    # Calls the downstream (needs the bench catalogue and the downstream process).
    http: bool = False
    # Runs on the bench's workers (needs the bench catalogue and the worker processes).
    worker: bool = False
    # Parks on a wait node until the bench signals it.
    wait: bool = False


SHAPES = {
    "noop": Shape("noop", "noop", 1),
    "dag3": Shape("dag3", "bench_dag3", 3),
    "http": Shape("http", "bench_http3", 3, http=True),
    "mixed": Shape("mixed", "bench_mixed3", 3, http=True),
    "outputs": Shape("outputs", "bench_outputs3", 3, http=True),
    "worker": Shape("worker", "bench_worker3", 3, worker=True),
    "wait": Shape("wait", "bench_wait1", 1, wait=True),
}

# The queue of the ``worker`` shape's actions, which the bench's workers serve.
WORKER_QUEUE = "bench"

_CATALOGUE = """\
# Written by `dispo bench` for one run.
downstreams:
  bench:
    base_url: {url}
    timeout_ms: {timeout_ms}
    max_concurrency: {concurrency}
    max_calls_per_second: {rate}
    health_url: {url}/healthz
cells:
  noop:
    description: Does nothing, successfully.
    fields: {{}}
    actions:
      noop: {{kind: noop}}
  bench_dag3:
    description: Three noop nodes, b and c after a.
    fields: {{}}
    actions:
      a: {{kind: noop}}
      b: {{kind: noop, depends_on: [a]}}
      c: {{kind: noop, depends_on: [a]}}
  bench_http3:
    description: Three HTTP calls, b and c after a.
    fields: {{}}
    actions:
      a: {{kind: http, downstream: bench, path: /bench/a, idempotent: true}}
      b: {{kind: http, downstream: bench, path: /bench/b, idempotent: true, depends_on: [a]}}
      c: {{kind: http, downstream: bench, path: /bench/c, idempotent: true, depends_on: [a]}}
  bench_mixed3:
    description: Three HTTP calls, b and c after a; a and c must not be repeated blindly.
    fields: {{}}
    actions:
      a: {{kind: http, downstream: bench, path: /bench/once/a, idempotent: false,
          probe_path: "/effects/{{idempotency_key}}"}}
      b: {{kind: http, downstream: bench, path: /bench/b, idempotent: true, depends_on: [a]}}
      c: {{kind: http, downstream: bench, path: /bench/once/c, idempotent: false,
          probe_path: "/effects/{{idempotency_key}}", depends_on: [a]}}
  bench_outputs3:
    description: Three HTTP calls, b and c after a, each with a's output in its path.
    fields: {{}}
    actions:
      a: {{kind: http, downstream: bench, path: /bench/a, idempotent: true}}
      b: {{kind: http, downstream: bench, path: "/bench/b/{{nodes.a.output.key}}",
          idempotent: true, depends_on: [a]}}
      c: {{kind: http, downstream: bench, path: "/bench/c/{{nodes.a.output.key}}",
          idempotent: true, depends_on: [a]}}
  bench_worker3:
    description: Three worker runs on one queue, b and c after a.
    fields: {{}}
    actions:
      a: {{kind: worker, queue: {queue}, idempotent: true}}
      b: {{kind: worker, queue: {queue}, idempotent: true, depends_on: [a]}}
      c: {{kind: worker, queue: {queue}, idempotent: true, depends_on: [a]}}
  bench_wait1:
    description: One wait node, parked until the bench signals it.
    fields: {{}}
    actions:
      wait: {{kind: wait, signal: go, timeout_seconds: 86400, output: {{ok: boolean}}}}
"""


def catalogue_yaml(
    downstream_url: str, concurrency: int = 256, timeout_ms: int = 5000, rate: int = 0
) -> str:
    """The bench catalogue: every shape's cell, HTTP actions calling ``downstream_url`` with
    a per-call timeout of ``timeout_ms`` and up to ``concurrency`` calls at once (the
    executor's connection pool: a call slot is held from its node's claim to the call's
    end, so at 64 the slots, not the CPU, held the ``http`` shape near 320 tasks/s), at
    most ``rate`` calls a second (0: no limit); both across every executor (ADR-0108)."""
    return _CATALOGUE.format(
        url=downstream_url,
        concurrency=concurrency,
        timeout_ms=timeout_ms,
        queue=WORKER_QUEUE,
        rate=rate,
    )
