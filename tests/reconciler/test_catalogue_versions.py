"""A task keeps the catalogue version it was accepted under for its whole life (ADR-0111):
redriven after a newer version changed its action's path, it calls the path of its own
version; a task accepted after the change calls the new path."""

from __future__ import annotations

import yaml
from dispo.libs.api.gateway.v1 import catalogue_pb2, catalogue_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.auth import open_channel
from dispo.libs.catalogue import parse_catalogue
from dispo.reconciler.settings import parse_config, with_catalogue
from dispo.sdk import cell
from pipeline_fixtures import dump, wait_status

GREET = """
fields:
  name: {type: string, required: true}
actions:
  hello:
    kind: http
    downstream: demo
    path: /greetings/{payload.name}
    idempotent: true
"""


async def test_a_task_accepted_under_version_n_is_redriven_under_version_n(
    pipeline, downstream, reconciler
):
    await downstream.control(fail={"status": 500, "times": 1000, "path": "/greetings/ada"})
    async with (
        open_channel(pipeline.gateway.address, pipeline.token) as channel,
        pipeline.client() as client,
    ):
        stub = catalogue_pb2_grpc.CatalogueServiceStub(channel)
        read = (await stub.GetCatalogue(catalogue_pb2.GetCatalogueRequest())).catalogue.version
        made = await stub.RegisterCell(
            catalogue_pb2.RegisterCellRequest(cell="greet", definition=GREET, based_on_version=read)
        )
        version_n = made.catalogue.version
        task = await client.submit("tests", [cell("greet", name="ada")])
        await wait_status(client, task.task_id, {"RETRY_EXHAUSTED"})
        await reconciler.wait_state(task.task_id, pb.RECOVERY_STATE_PARKED_FAILED)

        changed = await stub.UpdateCell(
            catalogue_pb2.UpdateCellRequest(
                cell="greet",
                definition=GREET.replace("/greetings/", "/welcome/"),
                based_on_version=version_n,
            )
        )
        assert changed.catalogue.version == version_n + 1
        await downstream.control(reset=True)  # the downstream answers again
        later = await client.submit("tests", [cell("greet", name="ada")])

        await reconciler.sweep(11, "redrive")
        done = await client.wait(task.task_id, timeout=60)
        assert done.status == "SUCCEEDED", dump(done)
        assert done.raw.catalogue_version == version_n
        assert (await client.wait(later.task_id, timeout=60)).status == "SUCCEEDED"

    paths = (await downstream.state())["paths"]
    assert paths[f"{task.task_id}/greet.hello"] == "/greetings/ada"
    assert paths[f"{later.task_id}/greet.hello"] == "/welcome/ada"


def test_a_newer_version_brings_its_downstreams_and_conflicts_and_keeps_the_old_downstreams():
    """What the reconciler takes of a newer catalogue version: its conflicts, and its
    downstreams over the ones known before (a task accepted earlier may still name one)."""
    before = parse_config({}, parse_catalogue(yaml.safe_load(OLD)))
    after = with_catalogue(before, parse_catalogue(yaml.safe_load(NEW)))
    assert sorted(after.downstreams) == ["fresh", "legacy"]
    assert after.downstreams["fresh"].base_url == "http://127.0.0.1:9"
    assert set(after.arbitration.conflicts) == {"claim"}
    assert before.arbitration.conflicts == {}  # the config in hand is not changed


OLD = """
downstreams: {legacy: {base_url: "http://127.0.0.1:8"}}
cells:
  old: {actions: {a: {kind: noop}}}
"""
NEW = """
downstreams: {fresh: {base_url: "http://127.0.0.1:9"}}
cells:
  claim:
    fields: {target: string}
    conflict: {key: target}
    actions: {a: {kind: noop}}
"""
