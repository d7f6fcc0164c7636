"""The catalogue's versions, as the gateway records and follows them (ADR-0111).

:class:`CatalogueBook` records a change as the next version after the one it was made from
(ABORTED naming both when another change won), keeps the current version in memory and
hands it to the gateway's submissions (:meth:`refresh`: after its own changes, on the
periodic version check every replica runs, and on demand)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from dispo.gateway.catalogue import changes
from dispo.gateway.catalogue.changes import State
from dispo.gateway.catalogue.store import (
    VersionRow,
    catalogue_versions_get,
    catalogue_versions_insert_if_next,
    catalogue_versions_latest,
    catalogue_versions_list,
)
from dispo.libs.catalogue import Catalogue, parse_catalogue
from dispo.libs.clock import Clock
from dispo.libs.db.driver import Database
from dispo.libs.errors import Aborted, FieldViolation, InvalidArgument, NotFound
from dispo.libs.logging import get_logger

log = get_logger(__name__)

# Who made version 1: the file the first gateway started with.
SEED_AUTHOR = "DISPO_CATALOGUE"


def state_of(row: VersionRow) -> State:
    return State(row.data, row.owners, row.retired)


class CatalogueBook:
    def __init__(
        self,
        db: Database,
        clock: Clock,
        on_version: Callable[[VersionRow, Catalogue], None] | None = None,
        announce: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        # Told of each new current version (the gateway's submissions take it).
        self.on_version = on_version
        # Tells the other replicas and services of a version recorded here.
        self.announce = announce
        self.current: VersionRow | None = None
        self.catalogue = Catalogue()

    async def seed(self, document: dict[str, Any]) -> None:
        """Record ``document`` as version 1 unless there is a version (a second gateway
        starting at the same moment finds the first one's), then load the current one."""
        async with self.db.connection() as conn:
            if await catalogue_versions_latest(conn) == 0:
                state = changes.seed(document)
                made = await catalogue_versions_insert_if_next(
                    conn,
                    0,
                    state.document,
                    state.owners,
                    state.retired,
                    author=SEED_AUTHOR,
                    change="seed from the catalogue file",
                    now=self.clock.now(),
                )
                if made:
                    log.info("catalogue seeded", catalogue_version=made)
        await self.refresh()

    async def refresh(self) -> bool:
        """Load the newest version if it is newer than the one in hand; True if it was."""
        async with self.db.connection() as conn:
            latest = await catalogue_versions_latest(conn)
            if latest == 0 or (self.current is not None and latest <= self.current.version):
                return False
            row = await catalogue_versions_get(conn, latest)
        assert row is not None  # versions are never deleted
        self._take(row)
        return True

    def _take(self, row: VersionRow) -> None:
        if self.current is not None and row.version <= self.current.version:
            return
        catalogue = parse_catalogue(row.data)
        self.current, self.catalogue = row, catalogue
        log.info("catalogue version loaded", catalogue_version=row.version)
        if self.on_version is not None:
            self.on_version(row, catalogue)

    async def get(self, version: int) -> VersionRow:
        """One version (0: the current one); NOT_FOUND naming ``version``."""
        if version < 0:
            raise InvalidArgument("version", "0 (the current version) or a version number")
        async with self.db.connection() as conn:
            number = version or await catalogue_versions_latest(conn)
            row = await catalogue_versions_get(conn, number)
        if row is None:
            raise NotFound(
                f"no catalogue version {version}", [FieldViolation("version", "no such version")]
            )
        return row

    async def list_versions(self, before: int, limit: int) -> list[VersionRow]:
        async with self.db.connection() as conn:
            return await catalogue_versions_list(conn, before or 2**62, limit)

    async def propose(self, change: Callable[[State], State]) -> tuple[VersionRow, State]:
        """``change`` tried on the current version, recording nothing (DryRun)."""
        current = await self.get(0)
        return current, change(state_of(current))

    async def change(
        self, based_on: int, change: Callable[[State], State], *, author: str, what: str
    ) -> VersionRow:
        """Record ``change`` of version ``based_on`` as the next version: ABORTED naming the
        version read and the current one when another change was recorded since (nothing
        written), the change's own error when it is refused (nothing written either)."""
        if based_on <= 0:
            raise InvalidArgument(
                "based_on_version", "required: the version this change was made from"
            )
        async with self.db.transaction() as conn:
            latest = await catalogue_versions_latest(conn)
            if based_on != latest:
                raise _lost(based_on, latest)
            row = await catalogue_versions_get(conn, latest)
            assert row is not None
            state = change(state_of(row))
            made = await catalogue_versions_insert_if_next(
                conn,
                latest,
                state.document,
                state.owners,
                state.retired,
                author=author,
                change=what,
                now=self.clock.now(),
            )
            if made is None:
                raise _lost(based_on, latest + 1)
            recorded = await catalogue_versions_get(conn, made)
        assert recorded is not None
        log.info("catalogue changed", catalogue_version=made, change=what, author=author)
        self._take(recorded)
        if self.announce is not None:
            await self.announce(made)
        return recorded


def _lost(read: int, current: int) -> Aborted:
    if read > current:
        return Aborted(
            f"based_on_version: no version {read} yet (the catalogue is at version {current})",
            [FieldViolation("based_on_version", f"the catalogue is at version {current}")],
        )
    return Aborted(
        f"based_on_version: this change was made from version {read}, but the catalogue is at"
        f" version {current} now (another change was recorded first); read it again and retry",
        [FieldViolation("based_on_version", f"read {read}, current {current}")],
    )
