"""Shares of a cluster-wide limit (ADR-0108): every process that counts against a limit
(a downstream's calls at once or calls a second, a business's Submits a second) holds a
*share* of it, leased in its service's own database, and counts against its share alone, in
process. The shares of one limit never add up to more than the limit.

A process renews its shares every third of a lease, all of them in one transaction under one
advisory lock: it reads the other holders' live shares, decides its own (:func:`divide`, a
pure function) and writes them with what it wants. A holder that dies stops
renewing; its share is free once its lease has run out, never before. A holder that cannot
reach the database renews nothing, and stops using its share when its lease runs out. A
renewal is three statements: the lock, the read (:func:`limit_shares_others`), the write
(:func:`limit_shares_put_many`), with the decision in between.

How a share is divided (:func:`divide`): an equal part each, more for a holder that wants
more while no other is short, nothing for one that wants nothing once another is short. What a
holder records is never less than what it has in use: a share shrinks as its calls end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from dispo.libs.db.driver import Conn, Statement

# The advisory lock every renewal of one service's shares takes (one per database).
LOCK = 0x5D15_0108


@dataclass(frozen=True)
class Grant:
    """A holder's share of one limit: ``bound`` is what it may use from now, ``recorded``
    what the others count it as holding (never less than what it has in use)."""

    bound: int
    recorded: int


def divide(capacity: int, wanted: int, in_use: int, others: Sequence[tuple[int, int]]) -> Grant:
    """This holder's share of ``capacity``, given the others' live ``(recorded, wanted)``.

    Each holder may take an equal part (rounded up) of what the others leave free, and more
    while no other holder is short (up to twice what it wants: room for what comes before
    the next renewal); once another holder wants more than it holds, no more than an equal
    part (nothing when it wants nothing), so a busy holder's share grows as an idle one's
    shrinks, and holders that all want more than their part hold equal parts."""
    free = max(0, capacity - sum(recorded for recorded, _ in others))
    fair = -(-capacity // (1 + len(others)))
    if any(want > recorded for recorded, want in others):  # another holder is short
        bound = min(free, fair) if wanted > 0 else 0
    else:
        bound = min(free, max(fair, 2 * max(0, wanted)))
    return Grant(bound, max(bound, in_use))


_LOCK = Statement("SELECT pg_advisory_xact_lock(:lock)")
_OTHERS = Statement(
    "SELECT limit_key, granted, wanted FROM limit_shares"
    " WHERE limit_key = ANY(CAST(:keys AS text[])) AND holder <> :holder AND lease_until > :now"
)
# The one write path of limit_shares: this holder's shares, and every row whose lease ran
# out (its holder is gone, or no longer renews it) deleted with them; the table holds the
# live shares alone, a few rows per process.
_PUT_MANY = Statement(
    "WITH gone AS (DELETE FROM limit_shares WHERE holder <> :holder AND lease_until <= :now)"
    " INSERT INTO limit_shares (limit_key, holder, granted, wanted, lease_until)"
    " SELECT u.k, :holder, u.g, u.w, u.l FROM unnest(CAST(:keys AS text[]),"
    " CAST(:granted AS int[]), CAST(:wanted AS int[]), CAST(:until AS timestamptz[]))"
    " AS u(k, g, w, l)"
    " ON CONFLICT (limit_key, holder) DO UPDATE SET granted = excluded.granted,"
    " wanted = excluded.wanted, lease_until = excluded.lease_until"
)
_DROP_HOLDER = Statement("DELETE FROM limit_shares WHERE holder = :holder")
_USE = Statement(
    "SELECT limit_key, sum(granted)::int AS granted, sum(wanted)::int AS wanted,"
    " count(*)::int AS holders FROM limit_shares"
    " WHERE limit_key = ANY(CAST(:keys AS text[])) AND lease_until > :now GROUP BY limit_key"
)


async def limit_shares_others(
    conn: Conn, holder: str, keys: Sequence[str], now: datetime
) -> dict[str, list[tuple[int, int]]]:
    """Take the shares' lock for ``conn``'s transaction (held until it ends), then read the
    other holders' live shares of the limits ``keys``: ``(recorded, wanted)`` by key."""
    await _LOCK.fetch(conn, {"lock": LOCK})
    others: dict[str, list[tuple[int, int]]] = {k: [] for k in keys}
    for row in await _OTHERS.fetch(conn, {"keys": list(keys), "holder": holder, "now": now}):
        others[row.limit_key].append((row.granted, row.wanted))
    return others


async def limit_shares_put_many(
    conn: Conn, holder: str, shares: Sequence[tuple[str, int, int, datetime]], now: datetime
) -> None:
    """Write ``holder``'s shares, each ``(key, recorded, wanted, lease_until)``, under the
    lock :func:`limit_shares_others` took; every other share whose lease ran out by ``now``
    goes."""
    if not shares:
        return
    await _PUT_MANY.fetch(
        conn,
        {
            "keys": [s[0] for s in shares],
            "holder": holder,
            "granted": [s[1] for s in shares],
            "wanted": [s[2] for s in shares],
            "until": [s[3] for s in shares],
            "now": now,
        },
    )


async def limit_shares_drop(conn: Conn, holder: str) -> None:
    """Give back every share of ``holder`` (a process that stops)."""
    await _DROP_HOLDER.fetch(conn, {"holder": holder})


@dataclass(frozen=True)
class Use:
    """A limit's use across the cluster: what its live holders hold and want, and how many
    they are."""

    granted: int = 0
    wanted: int = 0
    holders: int = 0


async def limit_shares_use(conn: Conn, keys: Sequence[str], now: datetime) -> dict[str, Use]:
    """The cluster's use of each limit in ``keys`` (live shares only)."""
    rows = await _USE.fetch(conn, {"keys": list(keys), "now": now})
    return {row.limit_key: Use(row.granted, row.wanted, row.holders) for row in rows}
