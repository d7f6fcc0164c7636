"""Every SQL statement of schedules (ADR-0104), on the driver port. The tasks a firing
submits are written by the tasks' own statement (:func:`dispo.gateway.store.tasks_accept_many`),
in the same transaction as the firing's record."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispo.gateway.store import TERMINAL
from dispo.libs.db.driver import Conn, Row, Statement


@dataclass(frozen=True)
class ScheduleRow:
    schedule_id: str
    business: str
    definition: bytes
    paused: bool
    next_fire_at: datetime | None
    due_at: datetime | None
    buffered_fire_at: datetime | None
    last_task_id: str | None
    skipped_overlap: int
    skipped_catchup: int
    created_at: datetime
    updated_at: datetime


_COLUMNS = ", ".join(f"s.{name}" for name in ScheduleRow.__dataclass_fields__)


def _schedule(row: Row) -> ScheduleRow:
    return ScheduleRow(*row[: len(ScheduleRow.__dataclass_fields__)])


@dataclass(frozen=True)
class FiringRow:
    schedule_id: str
    fire_time: datetime
    fired_at: datetime
    outcome: str  # "submitted" or "refused"
    task_id: str | None
    reason: str
    manual: bool


@dataclass(frozen=True)
class Fired:
    """A locked schedule after a firing step: the row's new values (``expected``: the next
    fire time it was read with, its guard) and the firing to record, if one was made."""

    schedule_id: str
    expected: datetime | None
    next_fire_at: datetime | None
    due_at: datetime | None
    buffered_fire_at: datetime | None
    skipped_overlap: int
    skipped_catchup: int
    firing: FiringRow | None


_TERMINAL = ", ".join(repr(s) for s in TERMINAL)

_INSERT = Statement(
    "INSERT INTO schedules (schedule_id, business, definition, paused, next_fire_at, due_at,"
    " created_at, updated_at) VALUES (:id, :business, :definition, :paused, :next, :due,"
    " :now, :now) ON CONFLICT (schedule_id) DO NOTHING RETURNING schedule_id"
)


async def schedule_insert_if_absent(
    conn: Conn,
    schedule_id: str,
    business: str,
    definition: bytes,
    *,
    paused: bool,
    next_fire_at: datetime | None,
    due_at: datetime | None,
    now: datetime,
) -> bool:
    """Insert a new schedule; False if the id is taken (nothing written)."""
    rows = await _INSERT.fetch(
        conn,
        {
            "id": schedule_id,
            "business": business,
            "definition": definition,
            "paused": paused,
            "next": next_fire_at,
            "due": due_at,
            "now": now,
        },
    )
    return bool(rows)


_GET = Statement(f"SELECT {_COLUMNS} FROM schedules s WHERE s.schedule_id = :id")
_LOCK = Statement(f"SELECT {_COLUMNS} FROM schedules s WHERE s.schedule_id = :id FOR UPDATE")


async def schedule_get(conn: Conn, schedule_id: str, *, lock: bool = False) -> ScheduleRow | None:
    """One schedule (``lock``: its row locked until the transaction ends)."""
    rows = await (_LOCK if lock else _GET).fetch(conn, {"id": schedule_id})
    return _schedule(rows[0]) if rows else None


async def schedule_list(conn: Conn, business: str, after: str, limit: int) -> list[ScheduleRow]:
    """Schedules by id after ``after`` (``business`` empty: every business's)."""
    where = ["s.schedule_id > :after"]
    params: dict[str, object] = {"after": after, "limit": limit}
    if business:
        where.append("s.business = :business")
        params["business"] = business
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM schedules s WHERE {' AND '.join(where)}"
        " ORDER BY s.schedule_id LIMIT CAST(:limit AS integer)",
        params,
    )
    return [_schedule(r) for r in rows]


_SET = Statement(
    "UPDATE schedules SET definition = :definition, paused = :paused, next_fire_at = :next,"
    " due_at = :due, buffered_fire_at = NULL, updated_at = :now"
    " WHERE schedule_id = :id AND paused = :was_paused RETURNING schedule_id"
)


async def schedule_set_if_paused_is(
    conn: Conn,
    schedule_id: str,
    *,
    was_paused: bool,
    definition: bytes,
    paused: bool,
    next_fire_at: datetime | None,
    due_at: datetime | None,
    now: datetime,
) -> bool:
    """Replace a schedule's definition and pause state (an update, a pause, a resume) if it
    is still paused or not as read (``was_paused``); a buffered firing is dropped. False:
    another change came first (or the schedule is gone)."""
    rows = await _SET.fetch(
        conn,
        {
            "id": schedule_id,
            "was_paused": was_paused,
            "definition": definition,
            "paused": paused,
            "next": next_fire_at,
            "due": due_at,
            "now": now,
        },
    )
    return bool(rows)


_DELETE = Statement("DELETE FROM schedules WHERE schedule_id = :id RETURNING schedule_id")


async def schedule_delete(conn: Conn, schedule_id: str) -> bool:
    return bool(await _DELETE.fetch(conn, {"id": schedule_id}))


# The schedules a firing pass takes: due by now, or holding a buffered firing whose previous
# task is terminal; locked, skipping those another pass holds.
_DUE = Statement(
    f"SELECT {_COLUMNS}, (t.status IS NULL OR t.status IN ({_TERMINAL})) AS previous_done"
    " FROM schedules s LEFT JOIN tasks t ON t.task_id = s.last_task_id"
    " WHERE NOT s.paused AND (s.due_at <= :now OR (s.buffered_fire_at IS NOT NULL"
    f" AND (t.status IS NULL OR t.status IN ({_TERMINAL}))))"
    " ORDER BY s.due_at LIMIT CAST(:limit AS integer) FOR UPDATE OF s SKIP LOCKED"
)


async def schedules_lock_due(
    conn: Conn, now: datetime, limit: int
) -> list[tuple[ScheduleRow, bool]]:
    """The schedules with a firing step to take at ``now`` (at most ``limit``), locked for
    the transaction, each with whether its previous firing's task is done (none, or
    terminal). Rows another transaction holds are skipped: it is firing them."""
    rows = await _DUE.fetch(conn, {"now": now, "limit": limit})
    return [(_schedule(r), bool(r.previous_done)) for r in rows]


_PREVIOUS_DONE = Statement(f"SELECT t.status IN ({_TERMINAL}) FROM tasks t WHERE t.task_id = :id")


async def task_done(conn: Conn, task_id: str | None) -> bool:
    """Whether a previous firing's task is done (none, or terminal)."""
    if task_id is None:
        return True
    found = await _PREVIOUS_DONE.scalars(conn, {"id": task_id})
    return not found or bool(found[0])


# The firing steps of a pass, with one statement: each schedule advanced if its next fire
# time is still the one read (with the row lock, always: the guard says what the write
# assumes), its firing recorded, and firings beyond the newest KEEP_FIRINGS removed.
KEEP_FIRINGS = 100

_FIRE = Statement(
    "WITH n AS (SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:expected AS timestamptz[]),"
    " CAST(:next AS timestamptz[]), CAST(:due AS timestamptz[]),"
    " CAST(:buffered AS timestamptz[]), CAST(:overlap AS bigint[]), CAST(:catchup AS bigint[]),"
    " CAST(:fire_times AS timestamptz[]), CAST(:outcomes AS text[]), CAST(:tasks AS text[]),"
    " CAST(:reasons AS text[]), CAST(:manual AS boolean[]))"
    " AS n(id, expected, next, due, buffered, overlap, catchup, fire_time, outcome, task,"
    " reason, manual)),"
    " advanced AS (UPDATE schedules s SET next_fire_at = n.next, due_at = n.due,"
    " buffered_fire_at = n.buffered, last_task_id = COALESCE(n.task, s.last_task_id),"
    " skipped_overlap = s.skipped_overlap + n.overlap,"
    " skipped_catchup = s.skipped_catchup + n.catchup"
    " FROM n WHERE s.schedule_id = n.id AND s.next_fire_at IS NOT DISTINCT FROM n.expected"
    " RETURNING s.schedule_id),"
    " recorded AS (INSERT INTO schedule_firings (schedule_id, fire_time, fired_at, outcome,"
    " task_id, reason, manual) SELECT n.id, n.fire_time, :now, n.outcome, n.task, n.reason,"
    " n.manual FROM n JOIN advanced a ON a.schedule_id = n.id WHERE n.fire_time IS NOT NULL"
    " ON CONFLICT (schedule_id, fire_time) DO NOTHING),"
    " pruned AS (DELETE FROM schedule_firings f USING advanced a"
    " WHERE f.schedule_id = a.schedule_id AND f.fire_time < (SELECT k.fire_time"
    " FROM schedule_firings k WHERE k.schedule_id = a.schedule_id"
    f" ORDER BY k.fire_time DESC OFFSET {KEEP_FIRINGS - 1} LIMIT 1))"
    " SELECT schedule_id FROM advanced"
)


async def schedules_fire_if_expected_many(
    conn: Conn, steps: list[Fired], now: datetime
) -> set[str]:
    """Record firing steps of locked schedules with one statement; returns the ids
    advanced (a schedule whose next fire time is no longer ``expected`` is left as it is,
    with no firing recorded)."""
    if not steps:
        return set()
    firings = [s.firing for s in steps]
    rows = await _FIRE.scalars(
        conn,
        {
            "ids": [s.schedule_id for s in steps],
            "expected": [s.expected for s in steps],
            "next": [s.next_fire_at for s in steps],
            "due": [s.due_at for s in steps],
            "buffered": [s.buffered_fire_at for s in steps],
            "overlap": [s.skipped_overlap for s in steps],
            "catchup": [s.skipped_catchup for s in steps],
            "fire_times": [f.fire_time if f else None for f in firings],
            "outcomes": [f.outcome if f else None for f in firings],
            "tasks": [f.task_id if f else None for f in firings],
            "reasons": [f.reason if f else None for f in firings],
            "manual": [f.manual if f else None for f in firings],
            "now": now,
        },
    )
    return set(rows)


_FIRINGS = Statement(
    "SELECT f.schedule_id, f.fire_time, f.fired_at, f.outcome, f.task_id, f.reason, f.manual"
    " FROM unnest(CAST(:ids AS text[])) AS i(id) CROSS JOIN LATERAL (SELECT * FROM"
    " schedule_firings k WHERE k.schedule_id = i.id ORDER BY k.fire_time DESC"
    " LIMIT CAST(:per AS integer)) f ORDER BY f.schedule_id, f.fire_time DESC"
)


async def firings_of(
    conn: Conn, schedule_ids: list[str], per_schedule: int
) -> dict[str, list[FiringRow]]:
    """The newest firings of each schedule (at most ``per_schedule``), newest first."""
    out: dict[str, list[FiringRow]] = {i: [] for i in schedule_ids}
    if not schedule_ids:
        return out
    for row in await _FIRINGS.fetch(conn, {"ids": schedule_ids, "per": per_schedule}):
        out[row.schedule_id].append(FiringRow(*row))
    return out
