"""The reconciler's retention (ADR-0105): a finished task's completion facts (with its
deliveries and findings), its recovery record if it was ever parked (with its failure
history, redrive log and settlements) and its decided claims, deleted together once its
business's retention has passed, in one short transaction per batch. Driven by the
completion facts: a task that never finished has none, and a parked one is never touched."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from dispo.libs.db.driver import Conn
from dispo.libs.retention import Purged
from dispo.reconciler.arbitration import store as arbitration
from dispo.reconciler.completion import store as completion
from dispo.reconciler.recovery import store as recovery

businesses = completion.completions_businesses_finished
due = completion.completions_due


async def purge(conn: Conn, cutoffs: Mapping[str, datetime], limit: int) -> Purged:
    """At most ``limit`` finished tasks past their business's cutoff, with everything the
    reconciler keeps about them, in the caller's transaction."""
    ids, rows = await completion.completions_delete_if_done_many(conn, cutoffs, limit)
    rows |= await recovery.tasks_delete_if_done_many(conn, ids)
    rows["claims"] = await arbitration.claims_delete_if_decided_many(conn, ids)
    return Purged(len(ids), rows)
