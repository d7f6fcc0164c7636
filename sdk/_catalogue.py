"""The catalogue in the SDK: the CatalogueService calls of :class:`AsyncClient` and
:class:`Client` (docs/catalogue.md, ADR-0111), and what they answer.

A definition is given as in the catalogue file, a mapping (or its YAML or JSON text); every
change names the version it was made from (``based_on_version``), and one made from an older
version than the current one is refused ``ABORTED``: read again and retry."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispo.libs.api.gateway.v1 import catalogue_pb2, catalogue_pb2_grpc, gateway_pb2
from dispo.sdk._types import CellSpec
from google.protobuf.message import Message


def _text(definition: str | dict[str, Any]) -> str:
    return definition if isinstance(definition, str) else json.dumps(definition)


@dataclass(frozen=True)
class CatalogueVersion:
    """One version of the catalogue: its document (the catalogue file's mapping), each
    cell's owner (a business, "" for a shared cell), the cells retired so far, who made it,
    when, and what it changed."""

    version: int
    parent: int
    document: dict[str, Any]
    owners: dict[str, str]
    retired: tuple[str, ...]
    author: str
    change: str
    created_at: datetime | None
    raw: catalogue_pb2.CatalogueVersion = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: catalogue_pb2.CatalogueVersion) -> CatalogueVersion:
        return cls(
            message.version,
            message.parent,
            json.loads(message.document_json or "{}"),
            dict(message.owners),
            tuple(message.retired),
            message.author,
            message.change,
            message.created_at.ToDatetime(tzinfo=UTC) if message.HasField("created_at") else None,
            message,
        )


def _changed(reply: Any) -> CatalogueVersion:
    return CatalogueVersion.from_proto(reply.catalogue)


def _requests(
    method: str, args: dict[str, Any]
) -> tuple[str, Message]:  # the RPC and its request of one change
    match method:
        case "register_cell":
            return "RegisterCell", catalogue_pb2.RegisterCellRequest(
                cell=args["cell"],
                definition=_text(args["definition"]),
                business=args["business"],
                based_on_version=args["based_on_version"],
            )
        case "update_cell":
            return "UpdateCell", catalogue_pb2.UpdateCellRequest(
                cell=args["cell"],
                definition=_text(args["definition"]),
                based_on_version=args["based_on_version"],
            )
        case "retire_cell":
            return "RetireCell", catalogue_pb2.RetireCellRequest(
                cell=args["cell"], based_on_version=args["based_on_version"]
            )
        case "retire_downstream":
            return "RetireDownstream", catalogue_pb2.RetireDownstreamRequest(
                downstream=args["downstream"], based_on_version=args["based_on_version"]
            )
        case "put_downstream":
            return "PutDownstream", catalogue_pb2.PutDownstreamRequest(
                downstream=args["downstream"],
                definition=_text(args["definition"]),
                based_on_version=args["based_on_version"],
            )
        case _:
            return "ApplyCatalogue", catalogue_pb2.ApplyCatalogueRequest(
                document=_text(args["document"]), based_on_version=args["based_on_version"]
            )


def _dry_run(
    business: str, cells: Sequence[CellSpec], cell: str, definition: str | dict[str, Any]
) -> catalogue_pb2.DryRunRequest:
    request = catalogue_pb2.DryRunRequest(
        sample=gateway_pb2.SubmitRequest(business=business, cells=[c.to_proto() for c in cells])
    )
    if cell:
        request.register_cell.CopyFrom(
            catalogue_pb2.RegisterCellRequest(cell=cell, definition=_text(definition))
        )
    return request


class AsyncCatalogueCalls:
    """The CatalogueService calls of :class:`dispo.sdk.AsyncClient`."""

    _call: Callable[..., Awaitable[Any]]
    _channel: Any

    async def _catalogue(self, method: str, request: Message, timeout: float) -> Any:
        stub = catalogue_pb2_grpc.CatalogueServiceStub(self._channel)
        return await self._call(getattr(stub, method), request, timeout)

    async def get_catalogue(self, version: int = 0, *, timeout: float = 10.0) -> CatalogueVersion:
        """One version of the catalogue (0: the current one)."""
        request = catalogue_pb2.GetCatalogueRequest(version=version)
        return _changed(await self._catalogue("GetCatalogue", request, timeout))

    async def register_cell(
        self,
        cell: str,
        definition: str | dict[str, Any],
        based_on_version: int,
        *,
        business: str = "",
        timeout: float = 10.0,
    ) -> CatalogueVersion:
        """Add a cell (a business token's: its business's; an admin's without ``business``:
        shared); the version it made."""
        method, request = _requests("register_cell", locals())
        return _changed(await self._catalogue(method, request, timeout))

    async def update_cell(
        self,
        cell: str,
        definition: str | dict[str, Any],
        based_on_version: int,
        *,
        timeout: float = 10.0,
    ) -> CatalogueVersion:
        """Replace a cell's definition; the version it made."""
        method, request = _requests("update_cell", locals())
        return _changed(await self._catalogue(method, request, timeout))

    async def retire_cell(
        self, cell: str, based_on_version: int, *, timeout: float = 10.0
    ) -> CatalogueVersion:
        """Refuse new submissions naming ``cell`` (its tasks in flight finish)."""
        method, request = _requests("retire_cell", locals())
        return _changed(await self._catalogue(method, request, timeout))

    async def put_downstream(
        self,
        downstream: str,
        definition: str | dict[str, Any],
        based_on_version: int,
        *,
        timeout: float = 10.0,
    ) -> CatalogueVersion:
        """Add or replace a downstream (an admin token)."""
        method, request = _requests("put_downstream", locals())
        return _changed(await self._catalogue(method, request, timeout))

    async def retire_downstream(
        self, downstream: str, based_on_version: int, *, timeout: float = 10.0
    ) -> CatalogueVersion:
        """Remove a downstream no cell calls any more (an admin token)."""
        method, request = _requests("retire_downstream", locals())
        return _changed(await self._catalogue(method, request, timeout))

    async def apply_catalogue(
        self, document: str | dict[str, Any], based_on_version: int, *, timeout: float = 10.0
    ) -> CatalogueVersion:
        """Replace the whole catalogue by ``document`` (an admin token): new cells shared,
        the cells it leaves out retired."""
        method, request = _requests("apply", locals())
        return _changed(await self._catalogue(method, request, timeout))

    async def dry_run(
        self,
        business: str,
        cells: Sequence[CellSpec],
        *,
        cell: str = "",
        definition: str | dict[str, Any] = "",
        timeout: float = 10.0,
    ) -> catalogue_pb2.DryRunResponse:
        """Expand a sample submission against the current version, or against it with
        ``cell`` registered as ``definition``; nothing is stored."""
        request = _dry_run(business, cells, cell, definition)
        reply: catalogue_pb2.DryRunResponse = await self._catalogue("DryRun", request, timeout)
        return reply


class CatalogueCalls:
    """The CatalogueService calls of :class:`dispo.sdk.Client`, blocking."""

    _call: Callable[..., Any]
    _channel: Any

    def _catalogue(self, method: str, request: Message, timeout: float) -> Any:
        stub = catalogue_pb2_grpc.CatalogueServiceStub(self._channel)
        return self._call(getattr(stub, method), request, timeout)

    def get_catalogue(self, version: int = 0, *, timeout: float = 10.0) -> CatalogueVersion:
        """One version of the catalogue (0: the current one)."""
        request = catalogue_pb2.GetCatalogueRequest(version=version)
        return _changed(self._catalogue("GetCatalogue", request, timeout))

    def register_cell(
        self,
        cell: str,
        definition: str | dict[str, Any],
        based_on_version: int,
        *,
        business: str = "",
        timeout: float = 10.0,
    ) -> CatalogueVersion:
        """As :meth:`AsyncCatalogueCalls.register_cell`."""
        method, request = _requests("register_cell", locals())
        return _changed(self._catalogue(method, request, timeout))

    def update_cell(
        self,
        cell: str,
        definition: str | dict[str, Any],
        based_on_version: int,
        *,
        timeout: float = 10.0,
    ) -> CatalogueVersion:
        """As :meth:`AsyncCatalogueCalls.update_cell`."""
        method, request = _requests("update_cell", locals())
        return _changed(self._catalogue(method, request, timeout))

    def retire_cell(
        self, cell: str, based_on_version: int, *, timeout: float = 10.0
    ) -> CatalogueVersion:
        """As :meth:`AsyncCatalogueCalls.retire_cell`."""
        method, request = _requests("retire_cell", locals())
        return _changed(self._catalogue(method, request, timeout))

    def put_downstream(
        self,
        downstream: str,
        definition: str | dict[str, Any],
        based_on_version: int,
        *,
        timeout: float = 10.0,
    ) -> CatalogueVersion:
        """As :meth:`AsyncCatalogueCalls.put_downstream`."""
        method, request = _requests("put_downstream", locals())
        return _changed(self._catalogue(method, request, timeout))

    def retire_downstream(
        self, downstream: str, based_on_version: int, *, timeout: float = 10.0
    ) -> CatalogueVersion:
        """As :meth:`AsyncCatalogueCalls.retire_downstream`."""
        method, request = _requests("retire_downstream", locals())
        return _changed(self._catalogue(method, request, timeout))

    def apply_catalogue(
        self, document: str | dict[str, Any], based_on_version: int, *, timeout: float = 10.0
    ) -> CatalogueVersion:
        """As :meth:`AsyncCatalogueCalls.apply_catalogue`."""
        method, request = _requests("apply", locals())
        return _changed(self._catalogue(method, request, timeout))

    def dry_run(
        self,
        business: str,
        cells: Sequence[CellSpec],
        *,
        cell: str = "",
        definition: str | dict[str, Any] = "",
        timeout: float = 10.0,
    ) -> catalogue_pb2.DryRunResponse:
        """As :meth:`AsyncCatalogueCalls.dry_run`."""
        reply: catalogue_pb2.DryRunResponse = self._catalogue(
            "DryRun", _dry_run(business, cells, cell, definition), timeout
        )
        return reply
