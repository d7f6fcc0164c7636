"""When a submission starts and by when it must end (ADR-0103): its delayed start
(``not_before``) and its deadline (``deadline``, or its cells' ``max_duration_seconds``).

Pure decisions: no I/O, ``now`` is a parameter. Every refusal names its field; nothing is
written when this raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from dispo.libs.catalogue import Catalogue
from dispo.libs.errors import FieldViolation, InvalidArgument

# How far ahead a start or a deadline may be, by default: a year and a day.
DEFAULT_MAX_DELAY_SECONDS = 366 * 24 * 3600


@dataclass(frozen=True)
class Timing:
    """A task's delayed start and deadline, as recorded (None: none)."""

    not_before: datetime | None = None
    deadline: datetime | None = None


def timing(
    not_before: datetime | None,
    deadline: datetime | None,
    cells: list[str],
    catalogue: Catalogue,
    now: datetime,
    max_delay_seconds: int,
) -> Timing:
    """The timing of a submission asking to start at ``not_before`` and end by ``deadline``
    (None: not asked) with these ``cells`` (catalogue names), accepted at ``now``.

    - ``not_before`` beyond ``max_delay_seconds`` from now is refused; one not after now
      is no delay: the task starts at once.
    - The deadline is the earliest of ``deadline`` and, for each cell with a
      ``max_duration_seconds``, the task's start plus that. A ``deadline`` not after now,
      not after ``not_before``, or beyond ``max_delay_seconds`` is refused."""
    horizon = now + timedelta(seconds=max_delay_seconds)
    bad: list[FieldViolation] = []
    if not_before is not None and not_before > horizon:
        bad.append(
            FieldViolation(
                "not_before", f"more than {max_delay_seconds} seconds ahead (the gateway's limit)"
            )
        )
    start = not_before if not_before is not None and not_before > now else now
    if deadline is not None:
        if deadline <= now:
            bad.append(FieldViolation("deadline", "not in the future"))
        elif deadline <= start:
            bad.append(FieldViolation("deadline", "not after not_before"))
        elif deadline > horizon:
            bad.append(
                FieldViolation(
                    "deadline", f"more than {max_delay_seconds} seconds ahead (the gateway's limit)"
                )
            )
    if bad:
        raise InvalidArgument(violations=bad)
    ends = [deadline] if deadline is not None else []
    for name in cells:
        cell = catalogue.get(name)
        if cell is not None and cell.max_duration_seconds:
            ends.append(start + timedelta(seconds=cell.max_duration_seconds))
    return Timing(start if start > now else None, min(ends) if ends else None)
