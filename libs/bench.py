"""Reporting for the project's benchmarks: latency percentiles and throughput lines.

print(latency_line("Submit RPC", seconds))     # n, p50, p95, p99, mean in milliseconds
print(rate_line("submitted", count, elapsed))  # count and per-second rate
"""

from __future__ import annotations

import statistics


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (``nan`` for no values)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def latency_line(name: str, seconds: list[float]) -> str:
    ms = [v * 1000 for v in seconds]
    mean = statistics.fmean(ms) if ms else float("nan")
    return (
        f"{name:<24} n={len(ms):<7} p50={percentile(ms, 50):8.2f} ms  p95={percentile(ms, 95):8.2f} ms  "
        f"p99={percentile(ms, 99):8.2f} ms  mean={mean:8.2f} ms"
    )


def rate_line(name: str, count: int, elapsed: float) -> str:
    return f"{name:<24} {count} in {elapsed:.2f} s = {count / elapsed if elapsed else float('nan'):.1f}/s"
