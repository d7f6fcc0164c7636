"""CatalogueService: thin; decides who the caller may act as, converts at the edge and
calls :class:`dispo.gateway.catalogue.operations.CatalogueBook` (ADR-0111)."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial

import grpc
from dispo.gateway.catalogue import changes
from dispo.gateway.catalogue.changes import State
from dispo.gateway.catalogue.operations import CatalogueBook
from dispo.gateway.catalogue.store import VersionRow
from dispo.gateway.convert import submission_from_proto, task_envelope
from dispo.gateway.expand import expand, validate
from dispo.gateway.operations import Gateway
from dispo.libs.api.gateway.v1 import catalogue_pb2, catalogue_pb2_grpc
from dispo.libs.auth import business_filter, business_scope, caller
from dispo.libs.errors import DomainError, within
from dispo.libs.paging import decode_page_token, encode_page_token, page_size
from dispo.libs.timestamps import set_timestamp

SERVICE_NAME = "dispo.gateway.v1.CatalogueService"


def version_to_proto(row: VersionRow) -> catalogue_pb2.CatalogueVersion:
    out = catalogue_pb2.CatalogueVersion(
        version=row.version,
        parent=row.parent,
        document_json=row.document,
        owners=row.owners,
        retired=list(row.retired),
        author=row.author,
        change=row.change,
    )
    set_timestamp(out.created_at, row.created_at)
    return out


def _author() -> str:
    principal = caller()
    return f"{principal.token_id} ({principal.describe()})" if principal else "unknown"


class CatalogueServicer(catalogue_pb2_grpc.CatalogueServiceServicer):
    def __init__(self, book: CatalogueBook, gateway: Gateway, max_page_size: int) -> None:
        self.book = book
        self.gateway = gateway
        self.max_page_size = max_page_size

    async def GetCatalogue(
        self, request: catalogue_pb2.GetCatalogueRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.GetCatalogueResponse:
        row = await self.book.get(request.version)
        return catalogue_pb2.GetCatalogueResponse(catalogue=version_to_proto(row))

    async def ListCatalogueVersions(
        self,
        request: catalogue_pb2.ListCatalogueVersionsRequest,
        context: grpc.aio.ServicerContext,
    ) -> catalogue_pb2.ListCatalogueVersionsResponse:
        size = page_size(request.page, maximum=self.max_page_size)
        decoded = decode_page_token(request.page.page_token, int)
        before = decoded[0] if decoded is not None else 0
        found = await self.book.list_versions(before, size + 1)
        out = catalogue_pb2.ListCatalogueVersionsResponse(
            versions=[version_to_proto(r) for r in found[:size]]
        )
        if len(found) > size:
            out.page.next_page_token = encode_page_token(found[size - 1].version)
        return out

    async def _change(
        self, based_on: int, change: Callable[[State], State], what: str
    ) -> catalogue_pb2.ChangeCatalogueResponse:
        row = await self.book.change(based_on, change, author=_author(), what=what)
        return catalogue_pb2.ChangeCatalogueResponse(catalogue=version_to_proto(row))

    async def RegisterCell(
        self, request: catalogue_pb2.RegisterCellRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.ChangeCatalogueResponse:
        change = _register(request)
        return await self._change(request.based_on_version, change, f"register cell {request.cell}")

    async def UpdateCell(
        self, request: catalogue_pb2.UpdateCellRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.ChangeCatalogueResponse:
        change = _update(request)
        return await self._change(request.based_on_version, change, f"update cell {request.cell}")

    async def RetireCell(
        self, request: catalogue_pb2.RetireCellRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.ChangeCatalogueResponse:
        change = partial(changes.retire_cell, cell=request.cell, business=business_scope())
        return await self._change(request.based_on_version, change, f"retire cell {request.cell}")

    async def PutDownstream(
        self, request: catalogue_pb2.PutDownstreamRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.ChangeCatalogueResponse:
        definition = changes.parsed_text(request.definition, "definition")
        change = partial(changes.put_downstream, name=request.downstream, definition=definition)
        return await self._change(
            request.based_on_version, change, f"put downstream {request.downstream}"
        )

    async def RetireDownstream(
        self, request: catalogue_pb2.RetireDownstreamRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.ChangeCatalogueResponse:
        change = partial(changes.retire_downstream, name=request.downstream)
        return await self._change(
            request.based_on_version, change, f"retire downstream {request.downstream}"
        )

    async def ApplyCatalogue(
        self, request: catalogue_pb2.ApplyCatalogueRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.ChangeCatalogueResponse:
        document = changes.parsed_text(request.document, "document")
        change = partial(changes.apply_document, document=document)
        return await self._change(request.based_on_version, change, "apply a catalogue document")

    async def DryRun(
        self, request: catalogue_pb2.DryRunRequest, context: grpc.aio.ServicerContext
    ) -> catalogue_pb2.DryRunResponse:
        which = request.WhichOneof("proposal")
        proposal: Callable[[State], State]
        if which == "register_cell":
            proposal = _register(request.register_cell)
        elif which == "update_cell":
            proposal = _update(request.update_cell)
        elif which == "apply":
            document = changes.parsed_text(request.apply.document, "apply.document")
            proposal = partial(changes.apply_document, document=document)
        else:
            proposal = _unchanged
        current, state = await self.book.propose(proposal)
        catalogue = changes.checked(state.document)
        answer = catalogue_pb2.DryRunResponse(
            based_on_version=current.version,
            document_json=json.dumps(state.document),
        )
        if not request.HasField("sample"):
            return answer  # the proposal checked, nothing to expand
        try:
            business = business_filter(request.sample.business, "business")
            sub = submission_from_proto(request.sample, business)
            validate(sub, catalogue, self.gateway.limits, self.gateway.egress)
            nodes = expand("dry-run", sub, catalogue, self.gateway.limits)
        except DomainError as error:
            raise within("sample", error) from None
        env = task_envelope("dry-run", sub, nodes, self.book.clock.now())
        answer.nodes.extend(env.nodes)
        return answer


def _unchanged(state: State) -> State:
    return state


def _register(request: catalogue_pb2.RegisterCellRequest) -> Callable[[State], State]:
    owner = business_filter(request.business, "business")
    definition = changes.parsed_text(request.definition, "definition")
    return partial(changes.register_cell, cell=request.cell, definition=definition, owner=owner)


def _update(request: catalogue_pb2.UpdateCellRequest) -> Callable[[State], State]:
    definition = changes.parsed_text(request.definition, "definition")
    return partial(
        changes.update_cell, cell=request.cell, definition=definition, business=business_scope()
    )


def add_to_server(servicer: CatalogueServicer, server: grpc.aio.Server) -> None:
    catalogue_pb2_grpc.add_CatalogueServiceServicer_to_server(servicer, server)
