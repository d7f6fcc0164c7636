"""Declared state machines, and the one check every guarded state write makes first.

Each service declares a machine once, as data::

    NODE_TRANSITIONS = Transitions("node", {N.PENDING: {N.RUNNING, ...}, ...})

and every repository function that changes a state calls ``check`` for the move it is
about to make, then writes with the expected state in its ``WHERE`` clause (the guard in
the name too: ``node_set_status_if``, ``job_settle_if_generating``)::

    NODE_TRANSITIONS.check(expected, new)        # IllegalTransition: a move not declared
    UPDATE node_runs SET status = :new WHERE ... AND status = :expected
    rowcount == 0                                # a lost race: someone moved it first

The two failures stay apart: an undeclared move is refused before anything is written
(:class:`IllegalTransition`, a ``FAILED_PRECONDITION`` naming both states), while zero
rows updated is a race another writer won, which the caller handles as ``False``.

A ``Transitions`` is a read-only mapping ``state -> frozenset of next states``, so code and
tests that read the table as a dict keep working.

The database mirrors each enum with a CHECK constraint; :class:`EnumCheck` declares which
column mirrors which enum, and ``dispo.libs.db.checks`` compares that with the live schema.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from dispo.libs.errors import FailedPrecondition

S = TypeVar("S", bound=enum.Enum)


class IllegalTransition(FailedPrecondition):
    """A state write the declared table does not allow; nothing was written."""

    def __init__(self, machine: str, source: enum.Enum, target: enum.Enum) -> None:
        super().__init__(f"{machine} state cannot move from {_label(source)} to {_label(target)}")
        self.machine = machine
        self.source = source
        self.target = target


def _label(state: enum.Enum) -> str:
    return str(state.value)


class Transitions(Mapping[S, frozenset[S]], Generic[S]):
    """The declared moves of one state machine over the enum ``S``.

    Every member of the enum must appear as a key (a state with no way out maps to an
    empty set); a target outside the enum is refused at declaration.
    """

    def __init__(self, machine: str, table: Mapping[S, Iterable[S]]) -> None:
        self.machine = machine
        self._table: dict[S, frozenset[S]] = {s: frozenset(out) for s, out in table.items()}
        if not self._table:
            raise ValueError(f"{machine}: empty transition table")
        enum_type = type(next(iter(self._table)))
        self.enum_type: type[S] = enum_type
        missing = [s for s in enum_type if s not in self._table]
        if missing:
            raise ValueError(f"{machine}: no entry for {', '.join(_label(s) for s in missing)}")
        for source, targets in self._table.items():
            stray = [t for t in targets if not isinstance(t, enum_type)]
            if not isinstance(source, enum_type) or stray:
                raise ValueError(f"{machine}: states from another enum in the table")

    # -- the mapping ---------------------------------------------------------------------

    def __getitem__(self, state: S) -> frozenset[S]:
        return self._table[state]

    def __iter__(self) -> Iterator[S]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"Transitions({self.machine!r}, {len(self)} states)"

    # -- the checks ----------------------------------------------------------------------

    def allows(self, source: S, target: S) -> bool:
        return target in self._table[source]

    def check(self, source: S | Iterable[S], target: S) -> None:
        """Raise :class:`IllegalTransition` unless every ``source`` may move to ``target``.

        ``source`` may be several states when one guarded write accepts any of them
        (``WHERE status = ANY(:expected)``): each must be allowed.
        """
        sources: tuple[S, ...] = (source,) if isinstance(source, enum.Enum) else tuple(source)
        if not sources:
            raise ValueError(f"{self.machine}: a guarded write needs an expected state")
        for one in sources:
            if target not in self._table[one]:
                raise IllegalTransition(self.machine, one, target)

    def sources(self, target: S) -> tuple[S, ...]:
        """Every state that may move to ``target``, in the enum's order."""
        return tuple(s for s in self.enum_type if target in self._table[s])

    @property
    def final(self) -> frozenset[S]:
        """States nothing moves out of."""
        return frozenset(s for s, out in self._table.items() if not out)


@dataclass(frozen=True)
class EnumCheck:
    """The CHECK ``constraint`` on ``table.column`` allows exactly the values of ``enum_type``."""

    table: str
    column: str
    constraint: str
    enum_type: type[enum.Enum]

    @property
    def values(self) -> frozenset[str]:
        return frozenset(str(member.value) for member in self.enum_type)
