"""How well a run's writes were batched: each service process's group commits, read from
its ``dispo_group_commit_items`` histogram (docs/metrics.md) before and after the run.

A group commit's flush count and item count between two readings give its items per flush;
the same work split over more processes, or offered at a lower rate, shows as smaller
flushes, and each flush is paid for whatever it carries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

FAMILY = "dispo_group_commit_items"

# process -> group -> (flushes, items)
Reading = dict[str, dict[str, tuple[float, float]]]


def parse(text: str) -> dict[str, tuple[float, float]]:
    """One scrape's group commits: group -> (flushes, items) since the process started."""
    counts: dict[str, float] = {}
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != FAMILY:
            continue
        for sample in family.samples:
            group = sample.labels.get("group")
            if group is None:
                continue
            if sample.name == f"{FAMILY}_count":
                counts[group] = sample.value
            elif sample.name == f"{FAMILY}_sum":
                sums[group] = sample.value
    return {group: (counts[group], sums.get(group, 0.0)) for group in sorted(counts)}


async def read(metrics: Mapping[str, str], timeout: float = 5.0) -> Reading:
    """Every process's group commits, by name, from its metrics address; a process that
    does not answer is left out (its figures are then missing, not zero)."""

    async def one(http: httpx.AsyncClient, url: str) -> dict[str, tuple[float, float]] | None:
        try:
            answer = await http.get(url)
            answer.raise_for_status()
        except httpx.HTTPError:
            return None
        return parse(answer.text)

    names = sorted(metrics)
    async with httpx.AsyncClient(timeout=timeout) as http:
        found = await asyncio.gather(*(one(http, metrics[name]) for name in names))
    return {name: groups for name, groups in zip(names, found, strict=True) if groups is not None}


def between(before: Reading, after: Reading) -> dict[str, dict[str, dict[str, float]]]:
    """Flushes and items of each process's group commits between two readings, with the
    items per flush; groups that did not flush in between are left out. A process missing
    from ``after`` is left out; one missing from ``before`` counts from zero."""
    moved: dict[str, dict[str, dict[str, float]]] = {}
    for process, groups in sorted(after.items()):
        earlier = before.get(process, {})
        for group, (flushes, items) in groups.items():
            flushes_then, items_then = earlier.get(group, (0.0, 0.0))
            flushed = flushes - flushes_then
            if flushed <= 0:
                continue
            written = items - items_then
            moved.setdefault(process, {})[group] = {
                "flushes": int(flushed),
                "items": int(written),
                "items_per_flush": round(written / flushed, 1),
            }
    return moved
