"""CatalogueService through real gateway processes (ADR-0111): a cell registered through the
API is submittable on every gateway of a two-gateway stack and runs on an executor that was
running before it existed; a task keeps the version it was accepted under; a business token
edits only its own cells and adds no downstream; a refused definition changes nothing; of two
changes made from one version one wins and the other is ABORTED naming the version it read."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from dispo.libs.api.gateway.v1 import catalogue_pb2, catalogue_pb2_grpc, gateway_pb2
from dispo.libs.auth import open_channel
from dispo.sdk import DispoError, cell
from pipeline_fixtures import Pipeline
from support import eventually
from support.auth import business_token

# The periodic check far away: a new version reaches the other processes by its notice.
NOTICE_ONLY = {"DISPO_CATALOGUE_CHECK_INTERVAL_SECONDS": "3600"}

GREET = """
description: Greet someone, a cell added while the platform runs.
fields:
  name: {type: string, required: true}
actions:
  hello:
    kind: http
    downstream: demo
    path: /greetings/{payload.name}
    idempotent: true
"""


async def current(stub) -> int:
    return (await stub.GetCatalogue(catalogue_pb2.GetCatalogueRequest())).catalogue.version


async def refused(call, request) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(request)
    return raised.value


async def test_a_cell_added_through_the_api_runs_on_both_gateways_and_a_running_executor(
    start_service, catalogue_file, egress_allow, downstream
):
    """The cell calls a downstream added through the API too: the executor, running before
    either existed, learns it from the gateway."""
    pipeline = Pipeline(start_service, catalogue_file, egress_allow)
    first = await pipeline.start_gateway(**NOTICE_ONLY)
    await pipeline.start_executor(DISPO_CATALOGUE_GATEWAY_ADDRESS=first.address, **NOTICE_ONLY)
    second = await pipeline.start_gateway(**NOTICE_ONLY)
    assert pipeline.gateway is second  # the pipeline's clients call the second one
    async with (
        open_channel(first.address, pipeline.token) as channel,
        pipeline.client() as on_second,
    ):
        stub = catalogue_pb2_grpc.CatalogueServiceStub(channel)
        before = await current(stub)
        with pytest.raises(DispoError) as unknown:
            await on_second.submit("shop", [cell("greet", name="ada")])
        assert unknown.value.code == grpc.StatusCode.INVALID_ARGUMENT

        added = await stub.PutDownstream(
            catalogue_pb2.PutDownstreamRequest(
                downstream="fresh",
                definition=f"base_url: {downstream.url}\ntimeout_ms: 5000",
                based_on_version=before,
            )
        )
        made = await stub.RegisterCell(
            catalogue_pb2.RegisterCellRequest(
                cell="greet",
                definition=GREET.replace("downstream: demo", "downstream: fresh"),
                based_on_version=added.catalogue.version,
            )
        )
        assert made.catalogue.version == before + 2
        assert made.catalogue.owners["greet"] == ""  # an admin's cell is shared
        assert made.catalogue.author.endswith("(an admin token)")

        async def submitted():
            try:
                return await on_second.submit("shop", [cell("greet", name="ada")])
            except DispoError:
                return None

        task = await eventually(submitted, lambda t: t is not None, timeout=30, interval=0.2)
        done = await on_second.wait(task.task_id, timeout=60)
        assert done.status == "SUCCEEDED", done
        assert done.raw.catalogue_version == before + 2
    pipeline.gateway = first
    async with pipeline.client() as on_first:
        task = await on_first.submit("shop", [cell("greet", name="bob")])
        assert (await on_first.wait(task.task_id, timeout=60)).status == "SUCCEEDED"


async def test_a_task_keeps_the_version_it_was_accepted_under(gateway_only):
    """Version N+1 changes the action's path: a task accepted under N keeps N's path in its
    envelope, which is what a redrive and a resume publish again (through the SDK)."""
    async with gateway_only.client() as c:
        made = await c.register_cell("greet", GREET, (await c.get_catalogue()).version)
        assert "greet" in made.document["cells"] and made.owners["greet"] == ""
        old = await c.submit("shop", [cell("greet", name="ada")])
        await c.update_cell(
            "greet", GREET.replace("/greetings/", "/welcome/"), based_on_version=made.version
        )
        new = await c.submit("shop", [cell("greet", name="ada")])
        old_view, new_view = await c.get(old.task_id), await c.get(new.task_id)
        assert old_view.raw.catalogue_version == made.version
        assert old_view.raw.nodes[0].spec.path == "/greetings/ada"
        assert new_view.raw.catalogue_version == made.version + 1
        assert new_view.raw.nodes[0].spec.path == "/welcome/ada"
        tried = await c.dry_run("shop", [cell("greet", name="bob")])
        assert [n.spec.path for n in tried.nodes] == ["/welcome/bob"]

        # Retired: refused by name from then on.
        await c.retire_cell("greet", (await c.get_catalogue()).version)
        with pytest.raises(DispoError) as retired:
            await c.submit("shop", [cell("greet", name="ada")])
        assert retired.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "retired" in str(retired.value)
        with pytest.raises(DispoError) as taken:
            await c.register_cell("greet", GREET, (await c.get_catalogue()).version)
        assert taken.value.code == grpc.StatusCode.ALREADY_EXISTS


async def test_a_business_token_edits_only_its_own_cells_and_adds_no_downstream(
    gateway_only, database_url
):
    _, shop = await business_token(database_url, "shop")
    _, other = await business_token(database_url, "other")
    address = gateway_only.gateway.address
    async with open_channel(address, shop) as mine, open_channel(address, other) as theirs:
        stub, foreign = (catalogue_pb2_grpc.CatalogueServiceStub(c) for c in (mine, theirs))
        made = await stub.RegisterCell(
            catalogue_pb2.RegisterCellRequest(
                cell="greet", definition=GREET, based_on_version=await current(stub)
            )
        )
        assert made.catalogue.owners["greet"] == "shop"
        version = made.catalogue.version

        for call, request in (
            (
                foreign.UpdateCell,
                catalogue_pb2.UpdateCellRequest(
                    cell="greet", definition=GREET, based_on_version=version
                ),
            ),
            (
                foreign.RetireCell,
                catalogue_pb2.RetireCellRequest(cell="greet", based_on_version=version),
            ),
            (  # a shared cell is the platform's
                foreign.UpdateCell,
                catalogue_pb2.UpdateCellRequest(
                    cell="tell", definition=GREET, based_on_version=version
                ),
            ),
            (
                foreign.RegisterCell,
                catalogue_pb2.RegisterCellRequest(
                    cell="sneaky", definition=GREET, business="shop", based_on_version=version
                ),
            ),
            (
                foreign.PutDownstream,
                catalogue_pb2.PutDownstreamRequest(
                    downstream="exfil",
                    definition="base_url: http://example.invalid",
                    based_on_version=version,
                ),
            ),
            (
                foreign.RetireDownstream,
                catalogue_pb2.RetireDownstreamRequest(
                    downstream="narrow", based_on_version=version
                ),
            ),
        ):
            error = await refused(call, request)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (call, error.details())
        assert await current(foreign) == version

        # Its own cell: changed by its own token.
        changed = await stub.UpdateCell(
            catalogue_pb2.UpdateCellRequest(
                cell="greet", definition=GREET, based_on_version=version
            )
        )
        assert changed.catalogue.version == version + 1
        assert changed.catalogue.owners["greet"] == "shop"


async def test_a_refused_definition_changes_nothing(gateway_client, gateway_only):
    async with open_channel(gateway_only.gateway.address, gateway_only.token) as channel:
        stub = catalogue_pb2_grpc.CatalogueServiceStub(channel)
        before = (await stub.GetCatalogue(catalogue_pb2.GetCatalogueRequest())).catalogue
        for definition, field in (
            (GREET.replace("kind: http", "kind: carrier-pigeon"), "cells.greet.actions.hello.kind"),
            (GREET.replace("downstream: demo", "downstream: nowhere"), "downstream"),
            (GREET.replace("{payload.name}", "{nodes.ghost.output.x}"), "path"),
            ("actions: [1, 2", "definition"),
        ):
            error = await refused(
                stub.RegisterCell,
                catalogue_pb2.RegisterCellRequest(
                    cell="greet", definition=definition, based_on_version=before.version
                ),
            )
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
            assert field in error.details(), error.details()
        after = (await stub.GetCatalogue(catalogue_pb2.GetCatalogueRequest())).catalogue
        assert after == before
        listed = await stub.ListCatalogueVersions(catalogue_pb2.ListCatalogueVersionsRequest())
        assert [v.version for v in listed.versions] == [before.version]
        with pytest.raises(DispoError):
            await gateway_client.submit("shop", [cell("greet", name="ada")])

        # DryRun expands a sample against a proposal, storing nothing.
        tried = await stub.DryRun(
            catalogue_pb2.DryRunRequest(
                register_cell=catalogue_pb2.RegisterCellRequest(cell="greet", definition=GREET),
                sample=gateway_pb2.SubmitRequest(
                    business="shop",
                    cells=[gateway_pb2.CellRequest(cell="greet", payload_json=b'{"name":"ada"}')],
                ),
            )
        )
        assert [n.spec.path for n in tried.nodes] == ["/greetings/ada"]
        assert "greet" in json.loads(tried.document_json)["cells"]
        assert await current(stub) == before.version


async def test_concurrent_updates_of_one_cell_one_wins_the_other_is_aborted(gateway_only):
    async with open_channel(gateway_only.gateway.address, gateway_only.token) as channel:
        stub = catalogue_pb2_grpc.CatalogueServiceStub(channel)
        made = await stub.RegisterCell(
            catalogue_pb2.RegisterCellRequest(
                cell="greet", definition=GREET, based_on_version=await current(stub)
            )
        )
        read = made.catalogue.version

        async def update(path: str):
            try:
                return await stub.UpdateCell(
                    catalogue_pb2.UpdateCellRequest(
                        cell="greet",
                        definition=GREET.replace("/greetings/", path),
                        based_on_version=read,
                    )
                )
            except grpc.aio.AioRpcError as error:
                return error

        answers = await asyncio.gather(update("/a/"), update("/b/"))
        won = [a for a in answers if isinstance(a, catalogue_pb2.ChangeCatalogueResponse)]
        lost = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
        assert len(won) == 1 and len(lost) == 1, answers
        assert won[0].catalogue.version == read + 1
        assert lost[0].code() == grpc.StatusCode.ABORTED
        assert f"version {read}" in lost[0].details()
        assert await current(stub) == read + 1


async def test_an_admin_retires_a_downstream_only_once_no_cell_calls_it_and_applies_a_file(
    gateway_only,
):
    async with gateway_only.client() as c:
        read = (await c.get_catalogue()).version
        with pytest.raises(DispoError) as called:
            await c.retire_downstream("narrow", read)
        assert called.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert list(called.value.violations) == ["cells.narrow_step.actions.call.downstream"]
        assert (await c.get_catalogue()).version == read

        document = (await c.get_catalogue()).document
        del document["cells"]["narrow_step"]
        applied = await c.apply_catalogue(document, read)
        assert applied.retired == ("narrow_step",) and "narrow_step" not in applied.owners
        assert applied.owners["ticket"] == ""
        gone = await c.retire_downstream("narrow", applied.version)
        assert "narrow" not in gone.document["downstreams"]
        assert gone.change == "retire downstream narrow"
