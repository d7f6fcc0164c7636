"""task.erase in the reconciler (ADR-0113): what it keeps of an erased task's user data
becomes tombstones — the envelopes of its completion fact and recovery record (payloads,
outputs, errors), the errors its deliveries and findings quote, the reasons its failure
history, redrive log and settlements give, the payloads of its claims and compensations;
the quarantined messages that name it are discarded. Ids, states and times stay. A task
whose callback or reconciliation is still pending is erased once they are done.

Before that, the seal (ADR-0114): the gateway seals a FAILED task here (SealTask) before it
commits the task's erasure, and from then on the one redrive statement refuses the task
(``recovery.store.task_redriven_if``), whatever asks it — so a task whose data is being
erased is never run again on that data, however long its task.erase takes to be applied."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from dispo.libs.bus import ACK, Disposition, Nak
from dispo.libs.db.driver import Conn, Statement
from dispo.libs.erasure import ERASED_TEXT, TOMBSTONE, erase_task_bytes
from dispo.libs.errors import FailedPrecondition, FieldViolation
from dispo.libs.logging import get_logger
from dispo.reconciler.context import Context
from dispo.reconciler.states import PARKED, NotifyState, ReconcileState, RecoveryState

log = get_logger(__name__)

_PENDING = (
    f"c.notify_state = '{NotifyState.PENDING.value}'"
    f" OR c.reconcile_state = '{ReconcileState.PENDING.value}'"
)

# Asked again after this while the task's callback or reconciliation is pending.
ERASE_RETRY_SECONDS = 5.0

_COMPLETION = Statement(
    f"SELECT c.envelope, {_PENDING} AS pending FROM completions c WHERE c.task_id = :id FOR UPDATE"
)
_RECOVERY = Statement("SELECT envelope FROM recovery_tasks WHERE task_id = :id FOR UPDATE")

# Each (task, tombstoned completion envelope, tombstoned recovery envelope), in one
# statement; a NULL envelope leaves its row as it is (none held).
_ERASE_MANY = Statement(
    "WITH e AS (SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:completions AS bytea[]),"
    " CAST(:recoveries AS bytea[])) AS e(task_id, completion, recovery)),"
    " c AS (UPDATE completions c SET envelope = e.completion,"
    " notify_last_error = CASE WHEN c.notify_last_error = '' THEN '' ELSE :erased END"
    " FROM e WHERE c.task_id = e.task_id AND e.completion IS NOT NULL"
    f" AND NOT ({_PENDING}) RETURNING 1),"
    " d AS (UPDATE deliveries d SET error = CASE WHEN d.error = '' THEN '' ELSE :erased END"
    " FROM e WHERE d.task_id = e.task_id RETURNING 1),"
    " f AS (UPDATE findings f SET detail = CASE WHEN f.detail = '' THEN '' ELSE :erased END"
    " FROM e WHERE f.task_id = e.task_id RETURNING 1),"
    " r AS (UPDATE recovery_tasks r SET envelope = e.recovery,"
    " reason = CASE WHEN r.reason = '' THEN '' ELSE :erased END"
    " FROM e WHERE r.task_id = e.task_id AND e.recovery IS NOT NULL RETURNING 1),"
    " h AS (UPDATE failure_history h SET reason = CASE WHEN h.reason = '' THEN ''"
    " ELSE :erased END, nodes = '[]' FROM e WHERE h.task_id = e.task_id RETURNING 1),"
    " l AS (UPDATE redrive_log l SET reason = CASE WHEN l.reason = '' THEN '' ELSE :erased END"
    " FROM e WHERE l.task_id = e.task_id RETURNING 1),"
    " s AS (UPDATE settlements s SET reason = CASE WHEN s.reason = '' THEN '' ELSE :erased END"
    " FROM e WHERE s.task_id = e.task_id RETURNING 1),"
    " cl AS (UPDATE claims cl SET payload = CAST(:tombstone AS jsonb) FROM e"
    " WHERE cl.task_id = e.task_id RETURNING 1),"
    " co AS (UPDATE compensations co SET payload = CAST(:tombstone AS jsonb),"
    " error = CASE WHEN co.error = '' THEN '' ELSE :erased END"
    " FROM e WHERE co.task_id = e.task_id RETURNING 1),"
    " q AS (DELETE FROM quarantine q USING e"
    " WHERE position(convert_to(e.task_id, 'UTF8') IN q.payload) > 0 RETURNING 1)"
    " SELECT count(*) AS n FROM e"
)


async def tasks_erase_many(
    conn: Conn, erasures: list[tuple[str, bytes | None, bytes | None]]
) -> None:
    """Write the tombstones of ``erasures`` (task id, completion envelope, recovery
    envelope, each tombstoned or None) in every table of the reconciler, with one
    statement. Applying it again changes nothing."""
    await _ERASE_MANY.fetch(
        conn,
        {
            "ids": [e[0] for e in erasures],
            "completions": [e[1] for e in erasures],
            "recoveries": [e[2] for e in erasures],
            "tombstone": TOMBSTONE.decode(),
            "erased": ERASED_TEXT,
        },
    )


async def handle_erase(ctx: Context, task_id: str) -> Disposition:
    """Erase what the reconciler keeps of ``task_id``; again later while its callback or
    reconciliation is pending."""
    async with ctx.db.transaction() as conn:
        completion = await _COMPLETION.fetch(conn, {"id": task_id})
        if completion and completion[0].pending:
            return Nak(ERASE_RETRY_SECONDS)
        recovery = await _RECOVERY.fetch(conn, {"id": task_id})
        await tasks_erase_many(
            conn,
            [
                (
                    task_id,
                    erase_task_bytes(bytes(completion[0].envelope) if completion else None),
                    erase_task_bytes(bytes(recovery[0].envelope) if recovery else None),
                )
            ],
        )
    log.info("task erased", task_id=task_id)
    return ACK


# ---- seals (ADR-0114) -------------------------------------------------------------------
# The states in which a task may still run again: being resumed (REDRIVEN) or parked with a
# redrive to come. A seal then would stop a run the gateway does not know of yet, and the
# erasure would take the data that run works on: the seal is refused, to be asked again
# once the task has ended.
RESUMING = frozenset({RecoveryState.REDRIVEN, *PARKED})

# Each task not resuming is sealed (under the task's seal lock, taken before: a redrive
# under way was waited for and is seen); sealed before, it keeps its first seal. Each task
# comes back with where the reconciler holds it and its seal (none: refused).
_SEAL_IF_NOT_RESUMING = Statement(
    "WITH s AS (SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:bys AS text[]))"
    " AS s(task_id, erased_by)),"
    " held AS (SELECT r.task_id, r.state FROM recovery_tasks r JOIN s ON r.task_id = s.task_id),"
    " added AS (INSERT INTO erasure_seals (task_id, sealed_at, erased_by)"
    " SELECT s.task_id, :now, s.erased_by FROM s WHERE NOT EXISTS (SELECT 1 FROM held h"
    " WHERE h.task_id = s.task_id AND h.state = ANY(CAST(:resuming AS text[])))"
    " ORDER BY s.task_id"
    " ON CONFLICT (task_id) DO UPDATE SET sealed_at = erasure_seals.sealed_at"
    " RETURNING task_id, sealed_at, erased_by)"
    " SELECT s.task_id, h.state, a.sealed_at, a.erased_by FROM s"
    " LEFT JOIN held h ON h.task_id = s.task_id LEFT JOIN added a ON a.task_id = s.task_id"
)
_SEALED = Statement("SELECT 1 FROM erasure_seals WHERE task_id = :id")
# A task's seal and its redrives take turns on this lock, the seal alone, the redrives
# together: a redrive waits for a seal under way and then sees it; a seal waits for the
# redrives under way and then sees the task REDRIVEN — also for a task whose recovery row
# its task.fail is writing as the seal looks for it. A redrive takes it after the task's
# row lock and a seal takes no row lock: no two of them wait for each other.
_LOCK_KEY = "hashtextextended('dispo.reconciler.seal:' || :id, 0)"
_SEAL_LOCK = Statement(f"SELECT pg_advisory_xact_lock({_LOCK_KEY})")
_REDRIVE_LOCK = Statement(f"SELECT pg_advisory_xact_lock_shared({_LOCK_KEY})")


@dataclass(frozen=True)
class Seal:
    task_id: str
    # Where the reconciler holds the task (None: it does not, yet).
    state: RecoveryState | None
    # When it was sealed, and for whom; None: refused, the task being resumed.
    sealed_at: datetime | None
    erased_by: str = ""


async def seals_add_if_not_resuming_many(
    conn: Conn, seals: list[tuple[str, str]], now: datetime
) -> list[Seal]:
    """Seal each (task id, who erases it) that is not :data:`RESUMING`, with one
    statement, the caller holding each task's seal lock; a task sealed before keeps its
    first seal."""
    rows = await _SEAL_IF_NOT_RESUMING.fetch(
        conn,
        {
            "ids": [s[0] for s in seals],
            "bys": [s[1] for s in seals],
            "now": now,
            "resuming": sorted(s.value for s in RESUMING),
        },
    )
    return [
        Seal(
            r.task_id,
            RecoveryState(r.state) if r.state else None,
            r.sealed_at,
            r.erased_by or "",
        )
        for r in rows
    ]


async def task_lock_against_seal(conn: Conn, task_id: str) -> None:
    """Before a redrive of ``task_id`` in this transaction: wait for a seal under way, and
    keep one from starting until the transaction ends."""
    await _REDRIVE_LOCK.fetch(conn, {"id": task_id})


async def task_sealed(conn: Conn, task_id: str) -> bool:
    """Whether ``task_id`` was sealed for its erasure."""
    return bool(await _SEALED.fetch(conn, {"id": task_id}))


async def seal(ctx: Context, task_id: str, erased_by: str) -> Seal:
    """Seal ``task_id`` ahead of its erasure: nothing here runs it again. FAILED_PRECONDITION
    naming ``task_id`` while it is being resumed (it is not sealed then)."""
    async with ctx.db.transaction() as conn:
        await _SEAL_LOCK.fetch(conn, {"id": task_id})
        (sealed,) = await seals_add_if_not_resuming_many(
            conn, [(task_id, erased_by)], ctx.clock.now()
        )
    if sealed.sealed_at is None:
        assert sealed.state is not None
        message = (
            f"task {task_id} is being resumed ({sealed.state.name} in the reconciler);"
            " try again once it ends"
        )
        raise FailedPrecondition(message, [FieldViolation("task_id", message)])
    log.info("task sealed for its erasure", task_id=task_id, erased_by=sealed.erased_by)
    return sealed
