"""Reading what PostgreSQL did in tests: the nodes of a query's plan, and how many updates
of a table stayed HOT (on the row's own page, no index entry written)."""

from __future__ import annotations

import json
from typing import Any


def plan_nodes(explained: Any) -> list[dict]:
    """Every node of a plan: ``explained`` is ``EXPLAIN (FORMAT JSON)``'s answer (its text)
    or one node of it."""
    if isinstance(explained, str):
        explained = json.loads(explained)[0]["Plan"]
    return [explained, *(n for child in explained.get("Plans", []) for n in plan_nodes(child))]


async def hot_updates(conn: Any, table: str) -> int:
    """The HOT updates of ``table`` the statistics have counted so far."""
    [[count]] = await conn.fetch(
        "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = :table", {"table": table}
    )
    return count
