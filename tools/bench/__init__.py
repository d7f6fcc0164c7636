"""``dispo bench``: the one place speed is measured.

- :mod:`.report` — the figures and the report, from facts (no I/O): percentiles, throughput,
  CPU per task per process, the JSON-ready result and its text;
- :mod:`.machine` — the machine (cores, memory, CPU model) and CPU time of process trees,
  read from ``/proc``;
- :mod:`.ceiling` — PostgreSQL's own single-row commit ceiling, measured with ``pgbench``;
- :mod:`.shapes` — the workloads (``noop``, ``dag3``, ``http``) and the catalogue they run on;
- :mod:`.load` — the load generator (saturation or a fixed offered rate) over gRPC;
- :mod:`.run` — the command: starts a stack, measures, prints, writes ``bench-results/``.

Other benchmarks print with the same helpers::

    print(latency_line("Submit RPC", seconds))     # n, p50, p95, p99, mean in milliseconds
"""

from dispo.tools.bench.report import latency, latency_line, percentile

__all__ = ["latency", "latency_line", "percentile"]
