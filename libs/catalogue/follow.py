"""Following the catalogue's versions from a service that does not own them (ADR-0111).

The gateway records each change as a new version and announces it (``catalogue.changed``);
the executor and the reconciler ask it which version is the newest (one small call, no
document) when the notice arrives and every few seconds anyway, fetch a newer one whole,
parse it with the same loader as the file, and hand it on. A gateway that does not answer
leaves the version in hand as it is: the next check tries again."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import catalogue_pb2, catalogue_pb2_grpc
from dispo.libs.bus import Bus
from dispo.libs.catalogue.model import Catalogue, CatalogueError, parse_catalogue
from dispo.libs.contracts.catalogue import CATALOGUE_CHANGED
from dispo.libs.logging import get_logger

log = get_logger(__name__)


class CatalogueFollower:
    """Calls ``on_catalogue(version, catalogue)`` with each newer version :meth:`check`
    finds at the gateway behind ``channel``."""

    def __init__(
        self,
        channel: grpc.aio.Channel,
        on_catalogue: Callable[[int, Catalogue], None],
        timeout: float = 5.0,
    ) -> None:
        self.stub = catalogue_pb2_grpc.CatalogueServiceStub(channel)
        self.on_catalogue = on_catalogue
        self.timeout = timeout
        self.version = 0  # the version in hand (0: the file read at start)
        self.failing = False  # the last check failed (warned once until one succeeds)

    async def check(self) -> bool:
        """Take the newest version if it is newer than the one in hand; True if it was."""
        try:
            listed = await self.stub.ListCatalogueVersions(
                catalogue_pb2.ListCatalogueVersionsRequest(
                    page=common_pb2.PageRequest(page_size=1)
                ),
                timeout=self.timeout,
            )
            newest = listed.versions[0].version if listed.versions else 0
            if newest <= self.version:
                return False
            got = await self.stub.GetCatalogue(
                catalogue_pb2.GetCatalogueRequest(version=newest), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as error:
            report = log.debug if self.failing else log.warning
            report("catalogue version check failed", code=error.code().name)
            self.failing = True
            return False
        self.failing = False
        try:
            catalogue = parse_catalogue(json.loads(got.catalogue.document_json or "{}"))
        except (CatalogueError, ValueError) as error:  # the gateway checked it: not expected
            log.error("catalogue version refused", catalogue_version=newest, error=str(error))
            return False
        self.version = newest
        self.on_catalogue(newest, catalogue)
        log.info("catalogue version loaded", catalogue_version=newest)
        return True


async def on_catalogue_changed(bus: Bus, check: Callable[[], Awaitable[Any]]) -> None:
    """Run ``check`` whenever a gateway announces a new catalogue version (core NATS: a
    notice missed is made up by the periodic check)."""

    async def notice(_msg: Any) -> None:
        try:
            await check()
        except Exception:  # the periodic check tries again
            log.exception("catalogue check on notice failed")

    await bus.nc.subscribe(CATALOGUE_CHANGED, cb=notice)


async def announce_catalogue(bus: Bus, version: int) -> None:
    """Tell every service that catalogue version ``version`` was recorded (best effort)."""
    try:
        await bus.nc.publish(CATALOGUE_CHANGED, str(version).encode())
    except Exception as error:  # the periodic checks find it anyway
        log.warning("catalogue notice not sent", catalogue_version=version, error=str(error))
