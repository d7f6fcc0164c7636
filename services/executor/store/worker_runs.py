"""The ``worker_runs`` rows (ADR-0099): a worker node's run offered on its queue, taken by
a worker under a run lease, completed, then deleted once its pass recorded the node.

A run's states: ``offered`` (inserted by its pass, taken by :func:`runs_take_many`) →
``taken`` (leased to one worker; moved on by :func:`runs_complete_if_held_many`,
:func:`runs_release_if_held_many`, or :func:`runs_settled_many` once its lease or deadline
passed) → ``done`` (its outcome written; read by the pass that waits for it). Every move
out of ``taken`` is guarded by the worker, the attempt and the lease in its ``WHERE``: a
worker whose lease ran out completes nothing.

A run is of kind ``action`` (a worker node's call) or ``probe`` (ADR-0100: asking a worker
of the queue whether an UNKNOWN node's effect happened). A probe run answered ``done`` stays
until the redrive that settles its node SUCCEEDED records its output
(:func:`runs_probe_outputs_many`), and any other probe run is deleted by the call that waited
for it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dispo.libs.contracts.tasks import DEFAULT_PRIORITY
from dispo.libs.db.driver import Conn, Row

# How many of each business's next runs of a queue a taker reads, per run it may take: the
# room to skip the ones other takers hold locked as it takes (see :func:`runs_take_many`).
DEPTH = 2

# A run's (task id, node id, attempt): what a pass waits for and a worker holds.
RunKey = tuple[str, str, int]

# The outcomes a done run records.
OUTPUT, ERROR, NOT_SENT, LOST = "output", "error", "not_sent", "lost"
# A probe run's answers: the effect happened (with its output), or not (``fenced``: it never
# will under the key).
DONE, NOT_DONE = "done", "not_done"


@dataclass(frozen=True)
class Offer:
    """A worker node's run, as its pass offers it."""

    task_id: str
    node_id: str
    queue: str
    owner: str  # the pass's lease owner
    attempt: int
    idempotency_key: str
    action: str
    idempotent: bool
    timeout_ms: int
    payload: bytes  # canonical JSON, references resolved
    # A probe run (ADR-0100) rather than the node's call.
    probe: bool = False
    # Its task's business and priority: its place in the fair order (ADR-0109).
    business: str = ""
    priority: int = DEFAULT_PRIORITY

    @property
    def key(self) -> RunKey:
        return (self.task_id, self.node_id, self.attempt)


@dataclass(frozen=True)
class Outcome:
    """What a done run recorded: ``kind`` one of ``OUTPUT``, ``ERROR``, ``NOT_SENT``,
    ``LOST``, or a probe's ``DONE``, ``NOT_DONE``; ``output`` the JSON a worker returned
    (None: no output)."""

    kind: str
    output: bytes | None = None
    message: str = ""
    retryable: bool = False
    fenced: bool = False


# A worker's completion of a run: the run, the worker, its outcome.
Completion = tuple[RunKey, str, Outcome, str | None]


def _keys(keys: Sequence[RunKey]) -> dict[str, list[Any]]:
    return {
        "tasks": [k[0] for k in keys],
        "nodes": [k[1] for k in keys],
        "attempts": [k[2] for k in keys],
    }


# A guard on a run's queue: none when ``:queues`` is NULL (a caller serving every queue).
_OF_QUEUES = " AND (CAST(:queues AS text[]) IS NULL OR r.queue = ANY(CAST(:queues AS text[])))"


def _queues(queues: Sequence[str] | None) -> list[str] | None:
    return None if queues is None else sorted(set(queues))


_UNNEST_KEYS = (
    "unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[]), CAST(:attempts AS integer[]))"
    " AS u(task, node, attempt)"
)


async def runs_offer_many(conn: Conn, offers: Sequence[Offer], now: datetime) -> set[RunKey]:
    """Offer each run on its queue. A row of an earlier attempt of the node (its pass
    stopped before deleting it) is replaced: its worker's completion is refused from now
    on (its attempt no longer matches). A probe run replaces only a probe run: a node whose
    call is offered or under way is not probed. The runs offered."""
    if not offers:
        return set()
    offers = sorted(offers, key=lambda o: (o.task_id, o.node_id))
    rows = await conn.fetch(
        "INSERT INTO worker_runs (task_id, node_id, queue, owner, attempt, idempotency_key,"
        " action, idempotent, timeout_ms, payload, offered_at, state, kind, business, priority)"
        " SELECT u.task, u.node, u.queue, u.owner, u.attempt, u.ikey, u.action, u.idem,"
        " u.timeout, u.payload, :now, 'offered', u.kind, u.business, u.priority"
        " FROM unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[]), CAST(:queues AS text[]),"
        " CAST(:owners AS text[]), CAST(:attempts AS integer[]), CAST(:ikeys AS text[]),"
        " CAST(:actions AS text[]), CAST(:idems AS boolean[]), CAST(:timeouts AS integer[]),"
        " CAST(:payloads AS bytea[]), CAST(:kinds AS text[]), CAST(:businesses AS text[]),"
        " CAST(:priorities AS smallint[]))"
        " AS u(task, node, queue, owner, attempt, ikey, action, idem, timeout, payload, kind,"
        " business, priority)"
        " ON CONFLICT (task_id, node_id) DO UPDATE SET queue = excluded.queue,"
        " owner = excluded.owner, attempt = excluded.attempt,"
        " idempotency_key = excluded.idempotency_key, action = excluded.action,"
        " idempotent = excluded.idempotent, timeout_ms = excluded.timeout_ms,"
        " payload = excluded.payload, offered_at = excluded.offered_at, state = 'offered',"
        " kind = excluded.kind, business = excluded.business,"
        " priority = excluded.priority, worker_id = NULL, lease_until = NULL, deadline = NULL,"
        " outcome = NULL, output = NULL, message = NULL, retryable = NULL, fenced = NULL"
        " WHERE excluded.kind = 'action' OR worker_runs.kind = 'probe'"
        " RETURNING task_id, node_id, attempt",
        {
            "tasks": [o.task_id for o in offers],
            "nodes": [o.node_id for o in offers],
            "queues": [o.queue for o in offers],
            "owners": [o.owner for o in offers],
            "attempts": [o.attempt for o in offers],
            "ikeys": [o.idempotency_key for o in offers],
            "actions": [o.action for o in offers],
            "idems": [o.idempotent for o in offers],
            "timeouts": [o.timeout_ms for o in offers],
            "payloads": [o.payload for o in offers],
            "kinds": ["probe" if o.probe else "action" for o in offers],
            "businesses": [o.business for o in offers],
            "priorities": [o.priority for o in offers],
            "now": now,
        },
    )
    return {(r.task_id, r.node_id, r.attempt) for r in rows}


async def runs_take_many(
    conn: Conn,
    queues: Sequence[str],
    worker_id: str,
    max_runs: int,
    now: datetime,
    lease_seconds: float,
    limits: Mapping[str, int] | None = None,
    probe_queues: Sequence[str] = (),
    weights: Mapping[str, int] | None = None,
    default_weight: int = 1,
    paused: Collection[str] = (),
    rooms: Mapping[str, int] | None = None,
) -> list[Row]:
    """Take up to ``max_runs`` runs offered on ``queues`` (and probe runs offered on
    ``probe_queues``) for ``worker_id``: leased until ``lease_seconds`` from ``now``, due by
    their action's timeout from ``now``. Runs another taker holds locked are skipped, never
    waited for. A queue with a limit in ``limits`` (its ``max_concurrency``) gives no more
    action runs than it has left: the limit less its action runs taken now, counted in this
    statement — the caller holds the queue's lock (:func:`queues_lock_many`) in the same
    transaction, so two takers count in turn. A queue in ``rooms`` gives no more action runs
    than its room (what its pace leaves this turn, :mod:`dispo.executor.queue_pace`). Probe
    runs are not counted against either. The rows taken, whole.

    The fair order (ADR-0109): a queue's action runs are taken in weighted round-robin
    across businesses — a business's k-th next run (by priority, 1 first, then arrival) has
    its turn at k / its weight (``weights``, else ``default_weight``), and runs go by turn,
    then arrival — so one business's backlog does not hold another's runs back. The runs of
    a business in ``paused`` are not taken. Probe runs go first, oldest first.

    Each business's next runs of a queue are read from the index, as many as its weight's
    share of :data:`DEPTH` × ``max_runs`` and one more, so a poll reads about that many
    runs whatever the backlog and the number of businesses: a taker racing others that
    hold more of them locked, or one whose businesses have fewer runs than their shares,
    takes fewer this time and the rest on its next try."""
    if not (queues or probe_queues) or max_runs <= 0:
        return []
    names = sorted(set(queues))
    limits = limits or {}
    weighed = sorted((weights or {}).items())
    return await conn.fetch(
        "WITH RECURSIVE q AS (SELECT * FROM unnest(CAST(:queues AS text[]),"
        " CAST(:caps AS integer[]), CAST(:rooms AS integer[])) AS q(queue, cap, room)),"
        " w AS (SELECT * FROM unnest(CAST(:businesses AS text[]), CAST(:weights AS integer[]))"
        " AS w(business, weight)),"
        # The businesses with runs offered on each queue, one index probe each.
        " b AS (SELECT q.queue, (SELECT min(r.business) FROM worker_runs r"
        " WHERE r.queue = q.queue AND r.kind = 'action' AND r.state = 'offered') AS business"
        " FROM q UNION ALL SELECT b.queue, (SELECT min(r.business) FROM worker_runs r"
        " WHERE r.queue = b.queue AND r.kind = 'action' AND r.state = 'offered'"
        " AND r.business > b.business) FROM b WHERE b.business IS NOT NULL),"
        # Their weights (a paused business's runs are not taken), and each queue's total.
        " bw AS (SELECT b.queue, b.business, COALESCE(w.weight, :weight) AS weight,"
        " sum(COALESCE(w.weight, :weight)) OVER (PARTITION BY b.queue) AS total"
        " FROM b LEFT JOIN w ON w.business = b.business"
        " WHERE b.business IS NOT NULL AND b.business <> ALL(CAST(:paused AS text[]))),"
        # Each one's next runs (as many as its share of the room, and one), with their turns
        # (a window: not in the SELECT that locks).
        " ranked AS MATERIALIZED (SELECT c.task_id, c.node_id, c.queue, c.offered_at,"
        " row_number() OVER (PARTITION BY c.queue, c.business"
        " ORDER BY c.priority, c.offered_at, c.task_id, c.node_id)::float8 / c.weight AS turn"
        " FROM bw CROSS JOIN LATERAL (SELECT r.task_id, r.node_id, r.queue, r.business,"
        " r.priority, r.offered_at, bw.weight FROM worker_runs r WHERE r.queue = bw.queue"
        " AND r.kind = 'action' AND r.state = 'offered' AND r.business = bw.business"
        " ORDER BY r.priority, r.offered_at"
        " LIMIT 1 + CAST(ceil(CAST(:depth AS integer) * bw.weight / CAST(bw.total AS float8))"
        " AS integer)) c),"
        " actions AS (SELECT l.task_id, l.node_id, l.offered_at, l.turn FROM q CROSS JOIN"
        " LATERAL (SELECT r.task_id, r.node_id, r.offered_at, k.turn FROM (SELECT * FROM ranked k"
        " WHERE k.queue = q.queue ORDER BY k.turn, k.offered_at LIMIT CAST(:depth AS integer)) k"
        " JOIN worker_runs r ON r.task_id = k.task_id AND r.node_id = k.node_id"
        " WHERE r.kind = 'action' AND r.state = 'offered'"
        " ORDER BY k.turn, k.offered_at"
        # (LEAST passes over a NULL: a queue without a room or a cap is bound by :n alone)
        " LIMIT CASE WHEN q.cap IS NULL THEN LEAST(:n, q.room) ELSE GREATEST(0, LEAST(:n, q.room,"
        " q.cap - (SELECT count(*) FROM worker_runs t WHERE t.queue = q.queue"
        " AND t.kind = 'action' AND t.state = 'taken'))) END FOR UPDATE OF r SKIP LOCKED) l),"
        " probes AS (SELECT task_id, node_id, offered_at, CAST(0 AS float8) AS turn"
        " FROM worker_runs"
        " WHERE kind = 'probe' AND state = 'offered' AND queue = ANY(CAST(:probes AS text[]))"
        " ORDER BY offered_at LIMIT :n FOR UPDATE SKIP LOCKED),"
        " picked AS (SELECT * FROM actions UNION ALL SELECT * FROM probes"
        " ORDER BY turn, offered_at LIMIT :n)"
        " UPDATE worker_runs r SET state = 'taken', worker_id = :worker, lease_until = :until,"
        " deadline = CAST(:now AS timestamptz) + r.timeout_ms * interval '1 millisecond'"
        " FROM picked p WHERE r.task_id = p.task_id AND r.node_id = p.node_id"
        " AND r.state = 'offered'"
        " RETURNING r.*",
        {
            "queues": names,
            "caps": [limits.get(q) for q in names],
            "rooms": [(rooms or {}).get(q) for q in names],
            "probes": sorted(set(probe_queues)),
            "businesses": [b for b, _ in weighed],
            "weights": [max(1, w) for _, w in weighed],
            "weight": max(1, default_weight),
            "paused": sorted(set(paused)),
            "n": max_runs,
            "depth": max_runs * DEPTH,
            "worker": worker_id,
            "until": now + timedelta(seconds=lease_seconds),
            "now": now,
        },
    )


async def queues_lock_many(conn: Conn, queues: Sequence[str]) -> None:
    """Lock these queues until the caller's transaction ends (in name order: two takers
    never wait for each other crosswise), so their taken runs are counted by one taker at
    a time."""
    if queues:
        await conn.fetch(
            "SELECT pg_advisory_xact_lock(hashtextextended('dispo.worker_queue:' || q, 0))"
            " FROM (SELECT q FROM unnest(CAST(:queues AS text[])) AS q ORDER BY q) s",
            {"queues": sorted(set(queues))},
        )


async def runs_extend_if_held_many(
    conn: Conn,
    worker_id: str,
    keys: Sequence[RunKey],
    now: datetime,
    lease_seconds: float,
    queues: Sequence[str] | None = None,
) -> dict[RunKey, datetime]:
    """Extend the lease of each run ``worker_id`` still holds (taken by it at that attempt,
    its lease not run out, of ``queues`` unless None); the new ends, by run (a run missing
    was not held)."""
    if not keys:
        return {}
    rows = await conn.fetch(
        "UPDATE worker_runs r SET lease_until = :until FROM "
        + _UNNEST_KEYS
        + " WHERE r.task_id = u.task AND r.node_id = u.node AND r.attempt = u.attempt"
        " AND r.state = 'taken' AND r.worker_id = :worker AND r.lease_until >= :now"
        + _OF_QUEUES
        + " RETURNING r.task_id, r.node_id, r.attempt, r.lease_until",
        {
            **_keys(keys),
            "queues": _queues(queues),
            "worker": worker_id,
            "now": now,
            "until": now + timedelta(seconds=lease_seconds),
        },
    )
    return {(r.task_id, r.node_id, r.attempt): r.lease_until for r in rows}


async def runs_complete_if_held_many(
    conn: Conn, completions: Sequence[Completion], now: datetime
) -> list[bool]:
    """Record each ``(run, worker_id, outcome, queue)`` where that worker still holds the
    run (taken by it at that attempt, its lease not run out, of ``queue`` unless None):
    ``done``. Whether each was recorded, in order (False: not held, nothing written for
    it). A run named twice is recorded once, its first outcome: the second is refused, as
    if it came after."""
    if not completions:
        return []
    first: dict[RunKey, int] = {}
    for i, (key, _, _, _) in enumerate(completions):
        first.setdefault(key, i)
    unique = [completions[i] for i in first.values()]
    rows = await conn.fetch(
        "UPDATE worker_runs r SET state = 'done', outcome = u.kind, output = u.output,"
        " message = u.message, retryable = u.retryable, fenced = u.fenced"
        " FROM unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[]),"
        " CAST(:attempts AS integer[]), CAST(:workers AS text[]), CAST(:kinds AS text[]),"
        " CAST(:outputs AS bytea[]), CAST(:messages AS text[]), CAST(:retryables AS boolean[]),"
        " CAST(:fenceds AS boolean[]), CAST(:queues AS text[]))"
        " AS u(task, node, attempt, worker, kind, output, message, retryable, fenced, queue)"
        " WHERE r.task_id = u.task AND r.node_id = u.node AND r.attempt = u.attempt"
        " AND r.state = 'taken' AND r.worker_id = u.worker AND r.lease_until >= :now"
        " AND (u.queue IS NULL OR r.queue = u.queue)"
        " RETURNING r.task_id, r.node_id, r.attempt",
        {
            **_keys([key for key, _, _, _ in unique]),
            "workers": [worker for _, worker, _, _ in unique],
            "kinds": [o.kind for _, _, o, _ in unique],
            "outputs": [o.output for _, _, o, _ in unique],
            "messages": [o.message for _, _, o, _ in unique],
            "retryables": [o.retryable for _, _, o, _ in unique],
            "fenceds": [o.fenced for _, _, o, _ in unique],
            "queues": [queue for _, _, _, queue in unique],
            "now": now,
        },
    )
    done = {(r.task_id, r.node_id, r.attempt) for r in rows}
    return [key in done and first[key] == i for i, (key, _, _, _) in enumerate(completions)]


async def runs_release_if_held_many(
    conn: Conn,
    worker_id: str,
    keys: Sequence[RunKey],
    now: datetime,
    why: str,
    queues: Sequence[str] | None = None,
) -> list[Row]:
    """Hand back the runs ``worker_id`` still holds (of ``queues`` unless None): an idempotent action's is offered
    again at once (its place in its queue kept); any other's ends ``lost`` with ``why`` (its
    handler may have had its effect). The rows moved (``state`` as they are now)."""
    if not keys:
        return []
    return await conn.fetch(
        "UPDATE worker_runs r SET"
        " state = CASE WHEN r.idempotent THEN 'offered' ELSE 'done' END,"
        " outcome = CASE WHEN r.idempotent THEN NULL ELSE 'lost' END,"
        " message = CASE WHEN r.idempotent THEN NULL ELSE :why END,"
        " worker_id = CASE WHEN r.idempotent THEN NULL ELSE r.worker_id END,"
        " lease_until = CASE WHEN r.idempotent THEN NULL ELSE r.lease_until END,"
        " deadline = CASE WHEN r.idempotent THEN NULL ELSE r.deadline END"
        " FROM "
        + _UNNEST_KEYS
        + " WHERE r.task_id = u.task AND r.node_id = u.node AND r.attempt = u.attempt"
        " AND r.state = 'taken' AND r.worker_id = :worker AND r.lease_until >= :now"
        + _OF_QUEUES
        + " RETURNING r.task_id, r.node_id, r.attempt, r.queue, r.state",
        {**_keys(keys), "queues": _queues(queues), "worker": worker_id, "now": now, "why": why},
    )


# Why a run a pass waits for ended without its worker's outcome.
LEASE_EXPIRED = "the worker's lease on the run expired (worker gone or stalled)"
PAST_DEADLINE = "the run passed its deadline of {ms} ms"
TAKEN_BACK = "the run was taken back (its node recovered by another pass)"


async def runs_settled_many(
    conn: Conn, keys: Sequence[RunKey], now: datetime
) -> dict[RunKey, Outcome]:
    """The outcome of each run among ``keys`` that has one, in one statement: recorded by
    its worker (``done``), or ``lost`` now — a taken run whose lease ran out (its worker
    vanished) or that passed its deadline is moved to ``done`` here, so its worker's late
    completion is refused — or taken back (its row gone, or of another attempt). A run
    still offered, or taken and in time, is absent."""
    if not keys:
        return {}
    rows = await conn.fetch(
        "WITH u AS (SELECT * FROM " + _UNNEST_KEYS + "),"
        " lost AS (UPDATE worker_runs r SET state = 'done', outcome = 'lost',"
        " message = CASE WHEN r.lease_until < :now THEN :expired"
        " ELSE replace(:deadline, '{ms}', r.timeout_ms::text) END"
        " FROM u WHERE r.task_id = u.task AND r.node_id = u.node AND r.attempt = u.attempt"
        " AND r.state = 'taken' AND (r.lease_until < :now OR r.deadline < :now)"
        " RETURNING r.task_id, r.node_id, r.attempt, r.outcome, r.output, r.message,"
        " r.retryable, r.fenced)"
        " SELECT task_id, node_id, attempt, outcome, output, message, retryable, fenced FROM lost"
        " UNION ALL"
        " SELECT u.task, u.node, u.attempt, COALESCE(r.outcome, 'lost'), r.output,"
        " CASE WHEN r.state = 'done' THEN r.message ELSE :taken_back END, r.retryable, r.fenced"
        " FROM u LEFT JOIN worker_runs r ON r.task_id = u.task AND r.node_id = u.node"
        " WHERE r.task_id IS NULL OR r.attempt <> u.attempt OR r.state = 'done'",
        {
            **_keys(keys),
            "now": now,
            "expired": LEASE_EXPIRED,
            "deadline": PAST_DEADLINE,
            "taken_back": TAKEN_BACK,
        },
    )
    settled: dict[RunKey, Outcome] = {}
    for r in rows:
        kind = r.outcome if r.outcome is not None else LOST
        settled[(r.task_id, r.node_id, r.attempt)] = Outcome(
            kind, r.output, r.message or "", bool(r.retryable), bool(r.fenced)
        )
    return settled


async def runs_withdraw_if_idle_many(
    conn: Conn, keys: Sequence[RunKey], offered_before: datetime, live_since: datetime
) -> list[Row]:
    """Withdraw each run among ``keys`` still offered since before ``offered_before`` on a
    queue no worker showed itself on since ``live_since`` (:mod:`.queues`): its row is
    deleted, so no worker can take it any more. The runs withdrawn (their keys and queue);
    one taken meanwhile stays."""
    if not keys:
        return []
    return await conn.fetch(
        "DELETE FROM worker_runs r USING "
        + _UNNEST_KEYS
        + " WHERE r.task_id = u.task AND r.node_id = u.node AND r.attempt = u.attempt"
        " AND r.state = 'offered' AND r.offered_at < :before"
        " AND NOT EXISTS (SELECT 1 FROM worker_presence p"
        " WHERE p.queue = r.queue AND p.seen_at >= :since)"
        " RETURNING r.task_id, r.node_id, r.attempt, r.queue",
        {**_keys(keys), "before": offered_before, "since": live_since},
    )


async def runs_delete_many(conn: Conn, keys: Sequence[RunKey]) -> None:
    """Forget the runs whose nodes their passes recorded (that attempt's row only: a newer
    offer of the node stays)."""
    if keys:
        await conn.fetch(
            "DELETE FROM worker_runs r USING "
            + _UNNEST_KEYS
            + " WHERE r.task_id = u.task AND r.node_id = u.node AND r.attempt = u.attempt",
            _keys(keys),
        )


async def runs_fence_many(conn: Conn, nodes: Sequence[tuple[str, str]]) -> None:
    """Forget every run of these nodes, whatever its attempt: a pass recovering a node the
    pass before it left RUNNING fences that pass's run, so its worker's late completion is
    refused."""
    if nodes:
        await conn.fetch(
            "DELETE FROM worker_runs r USING unnest(CAST(:tasks AS text[]),"
            " CAST(:nodes AS text[])) AS u(task, node)"
            " WHERE r.task_id = u.task AND r.node_id = u.node",
            {"tasks": [t for t, _ in nodes], "nodes": [n for _, n in nodes]},
        )


async def runs_probe_outputs_many(
    conn: Conn, nodes: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], bytes]:
    """The outputs of the probe runs of these nodes answered ``done`` with one, by node:
    what the redrive settling each SUCCEEDED records (ADR-0100)."""
    if not nodes:
        return {}
    rows = await conn.fetch(
        "SELECT r.task_id, r.node_id, r.output FROM worker_runs r"
        " JOIN unnest(CAST(:tasks AS text[]), CAST(:nodes AS text[])) AS u(task, node)"
        " ON r.task_id = u.task AND r.node_id = u.node"
        " WHERE r.kind = 'probe' AND r.outcome = 'done' AND r.output IS NOT NULL",
        {"tasks": [t for t, _ in nodes], "nodes": [n for _, n in nodes]},
    )
    return {(r.task_id, r.node_id): r.output for r in rows}
