"""The arbitration policy as plain data with a pure decision; time always comes from the
caller. :class:`ArbitrationPolicy`: which of several conflicting claims on one target wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dispo.libs.catalogue import Conflict


@dataclass(frozen=True)
class PriorityRule:
    business: str = ""
    cell: str = ""

    def matches(self, business: str, cell: str) -> bool:
        return (not self.business or self.business == business) and (
            not self.cell or self.cell == cell
        )

    def describe(self) -> str:
        return " ".join(
            p
            for p in (
                f"business={self.business}" if self.business else "",
                f"cell={self.cell}" if self.cell else "",
            )
            if p
        )


@dataclass(frozen=True)
class Contender:
    task_id: str
    business: str
    cell: str
    accepted_at: datetime


@dataclass(frozen=True)
class Ruling:
    winner: Contender
    losers: tuple[Contender, ...]
    reason: str


@dataclass(frozen=True)
class ArbitrationPolicy:
    window: float = 60.0
    # Earlier rules rank higher; a claim matching none ranks last.
    priority: tuple[PriorityRule, ...] = ()
    # The catalogue's declared conflicts, by cell.
    conflicts: dict[str, Conflict] = field(default_factory=dict)

    def rank(self, business: str, cell: str) -> int:
        for i, rule in enumerate(self.priority):
            if rule.matches(business, cell):
                return i
        return len(self.priority)

    def within_window(self, a: datetime, b: datetime) -> bool:
        return abs((a - b).total_seconds()) <= self.window

    def decide(self, contenders: list[Contender]) -> Ruling | None:
        """The winner among claims on one target; None without two businesses in conflict.
        Claims of the winner's own business are not in conflict with it and do not lose."""
        if len({c.business for c in contenders}) < 2:
            return None
        ordered = sorted(
            contenders, key=lambda c: (self.rank(c.business, c.cell), c.accepted_at, c.task_id)
        )
        winner = ordered[0]
        losers = tuple(c for c in ordered[1:] if c.business != winner.business)
        runner_up = losers[0]
        w_rank, l_rank = (
            self.rank(winner.business, winner.cell),
            self.rank(runner_up.business, runner_up.cell),
        )
        if w_rank < l_rank:
            rule = self.priority[w_rank].describe()
            reason = (
                f"priority: {winner.business}/{winner.cell} matches rule #{w_rank + 1} ({rule}),"
                f" {runner_up.business}/{runner_up.cell} ranks #{l_rank + 1}"
            )
        else:
            reason = (
                f"tie on priority (#{w_rank + 1}): earlier acceptance wins,"
                f" {winner.task_id} accepted {winner.accepted_at.isoformat()}"
                f" before {runner_up.task_id} at {runner_up.accepted_at.isoformat()}"
            )
        return Ruling(winner, losers, reason)
