"""A schedule's times and what a firing does: plain data and pure decisions, no I/O.

A schedule's *fire times* come from its spec (a cron expression read in an IANA time zone by
``cronsim``, or an interval anchored at the Unix epoch). Each fire time is *due* at the fire
time plus its jitter, the same on every replica (:func:`jitter`). :func:`plan` says what the
firing pass does with a schedule whose row it has locked (ADR-0104).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from dispo.libs.errors import InvalidArgument

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_INTERVAL_SECONDS = 366 * 86400
MAX_JITTER_SECONDS = 86400
DEFAULT_CATCHUP_SECONDS = 3600
MAX_CATCHUP_SECONDS = 366 * 86400
MAX_DESCRIPTION = 500
# Fire times counted one by one when a gap older than the catch-up window is skipped; a
# longer gap of a cron schedule is counted this far, then jumped.
MAX_COUNTED_MISSES = 10_000
# A cron expression that names no existing time (30 February) has no fire time: the search
# for one gives up after this many years.
_SEARCH_YEARS = 50
_SCHEDULE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class Overlap(StrEnum):
    """What a firing does while the previous firing's task is not terminal."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW = "allow"


def check_schedule_id(value: str, field: str = "schedule_id") -> str:
    if not value:
        raise InvalidArgument(field, "required")
    if not _SCHEDULE_ID.fullmatch(value):
        raise InvalidArgument(field, "1 to 64 letters, digits, '_' or '-'")
    return value


@dataclass(frozen=True)
class Spec:
    """When a schedule fires: ``cron`` in ``time_zone`` (UTC when empty), or every
    ``interval_seconds``; each firing ``jitter_seconds`` late at most."""

    cron: str = ""
    interval_seconds: int = 0
    time_zone: str = ""
    jitter_seconds: int = 0

    def check(self, where: str, now: datetime) -> Spec:
        """This spec, if it is one (else INVALID_ARGUMENT naming ``where``'s field)."""
        if bool(self.cron) == bool(self.interval_seconds):
            raise InvalidArgument(where, "either a cron expression or an interval is required")
        if self.interval_seconds:
            if not 1 <= self.interval_seconds <= MAX_INTERVAL_SECONDS:
                raise InvalidArgument(
                    f"{where}.interval_seconds", f"1 to {MAX_INTERVAL_SECONDS} seconds"
                )
            if self.time_zone:
                raise InvalidArgument(f"{where}.time_zone", "only with a cron expression")
        if not 0 <= self.jitter_seconds <= MAX_JITTER_SECONDS:
            raise InvalidArgument(f"{where}.jitter_seconds", f"0 to {MAX_JITTER_SECONDS} seconds")
        if self.cron:
            self._zone(f"{where}.time_zone")
            try:
                self.after(now)
            except (CronSimError, ValueError) as error:
                raise InvalidArgument(f"{where}.cron", f"not a cron expression: {error}") from None
            except StopIteration:
                raise InvalidArgument(f"{where}.cron", "names no time that exists") from None
        return self

    def _zone(self, field: str = "time_zone") -> ZoneInfo:
        name = self.time_zone or "UTC"
        if len(name) > 64 or name.startswith(("/", ".")) or ".." in name:
            raise InvalidArgument(field, f"not an IANA time zone: {name!r}")
        try:
            return ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidArgument(field, f"not an IANA time zone: {name!r}") from None

    def after(self, moment: datetime) -> datetime:
        """The first fire time strictly after ``moment`` (UTC)."""
        if self.interval_seconds:
            elapsed = (moment - EPOCH) // timedelta(seconds=self.interval_seconds)
            return EPOCH + timedelta(seconds=self.interval_seconds * (elapsed + 1))
        zone = self._zone()
        fire = next(iter(CronSim(self.cron, moment.astimezone(zone))))
        if fire.year > moment.year + _SEARCH_YEARS:
            raise StopIteration
        return fire.astimezone(UTC)

    def upcoming(self, moment: datetime, count: int) -> list[datetime]:
        """The next ``count`` fire times after ``moment``."""
        times: list[datetime] = []
        for _ in range(count):
            moment = self.after(moment)
            times.append(moment)
        return times


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as RFC 3339: seconds, with the fraction only when there is one."""
    moment = moment.astimezone(UTC)
    if moment.microsecond:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def firing_key(schedule_id: str, fire_time: datetime) -> str:
    """The idempotency key of a firing: the same fire time is the same task."""
    return f"schedule:{schedule_id}:{rfc3339(fire_time)}"


def jitter(schedule_id: str, fire_time: datetime, jitter_seconds: int) -> timedelta:
    """How late this fire time is due: 0 to ``jitter_seconds``, in milliseconds, from a hash
    of the id and the fire time (every replica computes the same)."""
    if jitter_seconds <= 0:
        return timedelta(0)
    digest = hashlib.sha256(firing_key(schedule_id, fire_time).encode()).digest()
    return timedelta(milliseconds=int.from_bytes(digest[:8], "big") % (jitter_seconds * 1000 + 1))


@dataclass(frozen=True)
class Due:
    """A schedule as the firing pass locked it."""

    schedule_id: str
    spec: Spec
    overlap: Overlap
    catchup: timedelta
    next_fire_at: datetime
    buffered_fire_at: datetime | None
    # No previous firing's task, or it is terminal.
    previous_done: bool

    def due_at(self, fire_time: datetime) -> datetime:
        return fire_time + jitter(self.schedule_id, fire_time, self.spec.jitter_seconds)


@dataclass(frozen=True)
class Plan:
    """What the pass does with a locked schedule: submit ``submit`` (a fire time), and leave
    the row with these values."""

    submit: datetime | None
    next_fire_at: datetime
    buffered_fire_at: datetime | None
    skipped_overlap: int = 0
    skipped_catchup: int = 0

    @property
    def changes(self) -> bool:
        return self.submit is not None or self.skipped_overlap > 0 or self.skipped_catchup > 0


def plan(due: Due, now: datetime) -> Plan:
    """One step of a locked schedule at ``now``: a buffered firing whose previous task
    finished is submitted first; a due fire time older than the catch-up window is skipped
    with every other one up to the window (counted); a due fire time within it is submitted,
    skipped or buffered by the overlap policy, and the next fire time follows it. At most
    one fire time is submitted per step: the pass takes the next step in its next round."""
    keep = Plan(None, due.next_fire_at, due.buffered_fire_at)
    if due.buffered_fire_at is not None and due.previous_done:
        return replace(keep, submit=due.buffered_fire_at, buffered_fire_at=None)
    if due.due_at(due.next_fire_at) > now:
        return keep
    oldest = now - due.catchup
    if due.due_at(due.next_fire_at) < oldest:
        fire, missed = due.next_fire_at, 0
        while due.due_at(fire) < oldest and missed < MAX_COUNTED_MISSES:
            fire, missed = due.spec.after(fire), missed + 1
        if due.due_at(fire) < oldest:  # a longer gap: the rest jumped, not counted
            fire = due.spec.after(oldest - timedelta(microseconds=1))
        return replace(keep, next_fire_at=fire, skipped_catchup=missed)
    fire = due.next_fire_at
    step = replace(keep, next_fire_at=due.spec.after(fire))
    if due.previous_done or due.overlap is Overlap.ALLOW:
        return replace(step, submit=fire)
    if due.overlap is Overlap.BUFFER_ONE and due.buffered_fire_at is None:
        return replace(step, buffered_fire_at=fire)
    return replace(step, skipped_overlap=1)
