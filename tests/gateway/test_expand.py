"""Validation and cell expansion against the shipped catalogue (pure domain, no
infrastructure)."""

import pytest
from dispo.gateway.expand import CellRequest, Limits, Submission, expand, validate
from dispo.libs.catalogue import load_catalogue
from dispo.libs.errors import InvalidArgument, ResourceExhausted

CATALOGUE = load_catalogue()


def submission(*cells, business="shop"):
    return Submission(business, list(cells))


def test_cells_merge_into_one_dag_with_cross_cell_dependencies():
    sub = submission(
        CellRequest("update_quality_level", payload={"content_id": "c/1", "level": 3}),
        CellRequest(
            "notify_owner",
            payload={"owner_id": "u1", "message": "hi"},
            depends_on=["update_quality_level"],
        ),
        CellRequest("start_review", payload={"content_id": "c/1"}),
    )
    validate(sub, CATALOGUE, Limits())

    nodes = expand("t1", sub, CATALOGUE, Limits())

    by_id = {n.node_id: n for n in nodes}
    # topological: cells level by level, each cell's actions in dependency order
    assert list(by_id) == [
        "update_quality_level.set_label",
        "update_quality_level.audit",
        "start_review.open_ticket",
        "notify_owner.send",
    ]
    assert by_id["update_quality_level.audit"].depends_on == ("update_quality_level.set_label",)
    assert by_id["notify_owner.send"].depends_on == ("update_quality_level.audit",)
    assert by_id["start_review.open_ticket"].depends_on == ()
    assert (
        by_id["update_quality_level.set_label"].path == "/labels/c%2F1"
    )  # payload values are URL-quoted
    assert by_id["notify_owner.send"].probe_path == "/effects/t1/notify_owner.send"
    assert by_id["notify_owner.send"].idempotency_key == "t1/notify_owner.send"


def test_cycle_between_cells_is_refused():
    sub = submission(
        CellRequest("noop", ref="a", depends_on=["b"]),
        CellRequest("noop", ref="b", depends_on=["a"]),
    )
    with pytest.raises(InvalidArgument) as refused:
        validate(sub, CATALOGUE, Limits())
    assert refused.value.violations[0].field == "cells"


def test_integer_field_accepts_integers_only():
    ok = submission(CellRequest("update_quality_level", payload={"content_id": "c", "level": 3}))
    validate(ok, CATALOGUE, Limits())
    # Payloads reach validation as parsed at the edge: a Struct's 3.0 is already 3 there
    # (tests/gateway/test_payload.py), so a float here was written as a float.
    for value in (3.5, 3.0, True, "3"):
        bad = submission(
            CellRequest("update_quality_level", payload={"content_id": "c", "level": value})
        )
        with pytest.raises(InvalidArgument) as refused:
            validate(bad, CATALOGUE, Limits())
        assert refused.value.violations[0].field == "cells[0].payload.level", value


def test_size_limits_name_the_field():
    big = submission(CellRequest("notify_owner", payload={"owner_id": "u", "message": "x" * 100}))
    with pytest.raises(ResourceExhausted) as refused:
        validate(big, CATALOGUE, Limits(max_payload_bytes=50))
    assert refused.value.violations[0].field == "cells[0].payload"
    many = submission(
        *[
            CellRequest(
                "update_quality_level", ref=f"c{i}", payload={"content_id": "c", "level": 1}
            )
            for i in range(3)
        ]
    )
    validate(many, CATALOGUE, Limits())
    with pytest.raises(ResourceExhausted):
        expand("t", many, CATALOGUE, Limits(max_nodes=5))
