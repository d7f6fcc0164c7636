"""Deterministic statistics over an evaluation's run results (what every analysis starts from).

Pure functions: the same runs always give the same document, whatever their order.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from dispo.intelligence.evaluations import RunResult
from dispo.libs.evaluation import Verdict

MAX_FAILURE_CLUSTERS = 10
MAX_WORST_CASES = 5
SIGNATURE_CHARS = 160

_MASKS = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<id>"),
    (re.compile(r"\b[0-9a-f]{12,}\b", re.I), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<text>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def failure_signature(reason: str) -> str:
    """Cluster key of a failure reason: ids, hex, quoted text and numbers masked, lower case."""
    text = reason.strip().lower()
    for pattern, replacement in _MASKS:
        text = pattern.sub(replacement, text)
    return (text or "<no reason given>")[:SIGNATURE_CHARS]


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def _rate(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def compute_stats(runs: Iterable[RunResult]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: r.run_id)
    total = len(ordered)
    verdicts = {v: sum(1 for r in ordered if r.verdict == v) for v in Verdict}
    scores = sorted(r.score for r in ordered)
    latencies = sorted(float(r.latency_ms) for r in ordered)
    mean = sum(scores) / total if total else 0.0
    variance = sum((s - mean) ** 2 for s in scores) / total if total else 0.0
    return {
        "run_count": total,
        "case_count": len({r.case_id for r in ordered}),
        "pass_rate": _rate(verdicts[Verdict.PASS], total),
        "fail_rate": _rate(verdicts[Verdict.FAIL], total),
        "error_rate": _rate(verdicts[Verdict.ERROR], total),
        "score": {
            "mean": round(mean, 6),
            "stddev": round(math.sqrt(variance), 6),
            "min": scores[0] if scores else 0.0,
            "p25": percentile(scores, 25),
            "p50": percentile(scores, 50),
            "p75": percentile(scores, 75),
            "max": scores[-1] if scores else 0.0,
        },
        "latency": {
            "mean_ms": round(sum(latencies) / total, 3) if total else 0.0,
            "p50_ms": int(percentile(latencies, 50)),
            "p90_ms": int(percentile(latencies, 90)),
            "p95_ms": int(percentile(latencies, 95)),
            "p99_ms": int(percentile(latencies, 99)),
            "max_ms": int(latencies[-1]) if latencies else 0,
        },
        "failure_clusters": _failure_clusters(ordered),
        "worst_cases": _worst_cases(ordered),
    }


def _failure_clusters(runs: list[RunResult]) -> list[dict[str, Any]]:
    failing = [r for r in runs if r.verdict != Verdict.PASS]
    clusters: dict[str, list[RunResult]] = defaultdict(list)
    for run in failing:
        clusters[failure_signature(run.failure_reason)].append(run)
    ranked = sorted(clusters.items(), key=lambda item: (-len(item[1]), item[0]))
    return [
        {
            "signature": signature,
            "count": len(members),
            "share": _rate(len(members), len(failing)),
            "example": (members[0].failure_reason or "")[:SIGNATURE_CHARS],
        }
        for signature, members in ranked[:MAX_FAILURE_CLUSTERS]
    ]


def _worst_cases(runs: list[RunResult]) -> list[dict[str, Any]]:
    by_case: dict[str, list[RunResult]] = defaultdict(list)
    for run in runs:
        by_case[run.case_id].append(run)
    rows = []
    for case_id, members in by_case.items():
        failures = sum(1 for r in members if r.verdict != Verdict.PASS)
        if not failures:
            continue
        rows.append(
            {
                "case_id": case_id,
                "runs": len(members),
                "failures": failures,
                "pass_rate": _rate(len(members) - failures, len(members)),
                "mean_score": round(sum(r.score for r in members) / len(members), 6),
            }
        )
    rows.sort(key=lambda row: (row["pass_rate"], row["mean_score"], row["case_id"]))
    return rows[:MAX_WORST_CASES]


# Metrics compared between periods: dotted path into the stats document -> higher is better.
COMPARED_METRICS: dict[str, bool] = {
    "pass_rate": True,
    "fail_rate": False,
    "error_rate": False,
    "score.mean": True,
    "score.p50": True,
    "score.min": True,
    "latency.mean_ms": False,
    "latency.p50_ms": False,
    "latency.p90_ms": False,
    "latency.p99_ms": False,
}


def metric_value(stats: dict[str, Any], path: str) -> float:
    value: Any = stats
    for part in path.split("."):
        value = value[part]
    return float(value)
