"""The one cell catalogue: its loader, its example shipped as package data, the setting
that names it, and the refusals of a broken file."""

import pytest
import yaml
from dispo.libs.catalogue import (
    EXAMPLE,
    BusinessLimit,
    CatalogueError,
    CatalogueSettings,
    Conflict,
    Downstream,
    Queue,
    load_catalogue,
    load_configured_catalogue,
    parse_catalogue,
)
from dispo.reconciler.settings import parse_config

NOOP = {"fields": {"id": {"type": "string"}}, "actions": {"a": {"kind": "noop"}}}
NOOP_CATALOGUE = {"cells": {"y": NOOP}}
HTTP = {"kind": "http", "downstream": "d", "path": "/a"}


def test_the_example_ships_inside_the_package_and_loads_whole():
    assert EXAMPLE.is_file() and EXAMPLE.name == "content_governance.yaml"
    catalogue = load_catalogue()
    cell = catalogue.cells["update_quality_level"]
    assert [a.name for a in cell.actions] == ["set_label", "audit"]
    assert cell.sinks == ["audit"] and cell.roots == ["set_label"]
    assert cell.conflict == Conflict(key="content_id", effect="quality_level")
    assert catalogue.conflicts == {"update_quality_level": cell.conflict}
    assert cell.labels == ("content_id",)  # its conflict key: what its tasks are about
    assert catalogue.downstreams["labels"] == Downstream(
        "labels", "http://127.0.0.1:8181", 2000, 16, "http://127.0.0.1:8181/healthz"
    )
    assert catalogue.downstreams["notify"].health_url == ""


def test_dispo_catalogue_names_the_file_every_service_reads(tmp_path, monkeypatch):
    path = tmp_path / "other.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "downstreams": {"d": {"base_url": "http://d"}},
                "cells": {"x": {**NOOP, "conflict": {"key": "id", "compensate": "x"}}},
            }
        )
    )
    monkeypatch.setenv("DISPO_CATALOGUE", str(path))
    assert CatalogueSettings().catalogue == str(path)
    catalogue = load_configured_catalogue()
    assert list(catalogue.cells) == ["x"]
    assert catalogue.downstreams == {"d": Downstream("d", "http://d")}
    # The effect defaults to the cell's name.
    assert catalogue.conflicts == {"x": Conflict("id", "x", "x")}
    monkeypatch.delenv("DISPO_CATALOGUE")
    assert "update_quality_level" in load_configured_catalogue().cells


def test_the_reconciler_takes_downstreams_and_conflicts_from_the_catalogue():
    catalogue = load_catalogue()
    config = parse_config({}, catalogue)
    assert config.downstreams == catalogue.downstreams
    assert config.arbitration.conflicts == catalogue.conflicts
    with pytest.raises(ValueError, match="declared beside their cells in the catalogue"):
        parse_config({"arbitration": {"conflicts": {"x": {"key": "id"}}}}, catalogue)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"cells": {"x": {"actions": {}}}}, "at least one action"),
        ({"cells": {"x": {"actions": {"a": {"kind": "ftp"}}}}}, "kind"),
        ({"cells": {"x": {"actions": {"a": {"kind": "http"}}}}}, "downstream and path"),
        (
            {"cells": {"x": {"actions": {"a": {"kind": "noop", "depends_on": ["b"]}}}}},
            "unknown action",
        ),
        (
            {
                "cells": {
                    "x": {
                        "actions": {
                            "a": {"kind": "noop", "depends_on": ["b"]},
                            "b": {"kind": "noop", "depends_on": ["a"]},
                        }
                    }
                }
            },
            "cycle",
        ),
        ({"downstreams": {"d": {"timeout_ms": 10}}}, "downstreams.d.base_url is required"),
        ({"downstreams": ["d"]}, "downstreams: must be a mapping"),
        (
            {"queues": {"q": {"max_calls_per_second": -1}}},
            r"queues.q.max_calls_per_second: must be a whole number of runs \(0: no limit\)",
        ),
        (
            {"queues": {"q": {"max_calls_per_second": 2.5}}},
            r"queues.q.max_calls_per_second: must be a whole number of runs",
        ),
        (
            {"queues": {"q": {"max_runs_per_second": 2}}},
            r"queues.q: a mapping with max_concurrency, max_calls_per_second",
        ),
        (
            {"cells": {"x": {"actions": {"a": {"kind": "noop"}}, "conflict": {"key": "id"}}}},
            r"cells.x.conflict.key: must name a field of the cell, got 'id'",
        ),
        (
            {"cells": {"x": {**NOOP, "conflict": {"key": "id", "target": "y"}}}},
            r"cells.x.conflict: unknown keys \['target'\]",
        ),
        (
            {"cells": {"x": {**NOOP, "conflict": {"key": "id", "compensate": "undo_x"}}}},
            "cells.x.conflict.compensate: unknown cell 'undo_x'",
        ),
        (
            {"cells": {"x": {"actions": {"a": {"kind": "noop", "max_effect_seconds": -1}}}}},
            r"cells.x.actions.a.max_effect_seconds: must be a whole number of seconds, got -1",
        ),
        (
            {"cells": {"x": {"actions": {"a": {"kind": "noop", "max_effect_seconds": "1m"}}}}},
            r"cells.x.actions.a.max_effect_seconds: must be a whole number of seconds",
        ),
        ({"max_output_bytes": -1}, r"max_output_bytes: must be a number of bytes up to 1048576"),
        (
            {"cells": {"x": {"actions": {"a": {"kind": "noop", "max_output_bytes": 2**21}}}}},
            r"cells.x.actions.a.max_output_bytes: must be a number of bytes up to 1048576",
        ),
        (
            {"cells": {"x": {"actions": {"a": {"kind": "noop", "output": {"id": "uuid"}}}}}},
            r"cells.x.actions.a.output.id.type: must be one of",
        ),
        ({"cells": {"x": {**NOOP, "result": "b"}}}, r"cells.x.result: unknown action 'b'"),
        (
            {"cells": {"x": {"actions": {"a": {**HTTP, "path": "/{nodes.a}"}}}}},
            r"cells.x.actions.a.path: a reference is written \{nodes.<node>.output\}",
        ),
        (
            {
                "cells": {
                    "x": {"actions": {"a": {**HTTP, "path": "/{nodes.b.output.id}"}, "b": HTTP}}
                }
            },
            r"cells.x.actions.a.path: \{nodes.b.output.id\} must name an action of cell 'x' that"
            r" 'a' depends on",
        ),
        (
            {
                "cells": {
                    "x": {
                        "actions": {
                            "a": {**HTTP, "output": {"id": "string"}},
                            "b": {**HTTP, "path": "/{nodes.a.output.ticket}", "depends_on": ["a"]},
                        }
                    }
                }
            },
            r"cells.x.actions.b.path: \{nodes.a.output.ticket\}: action 'a' declares no output"
            r" field 'ticket'",
        ),
    ],
)
def test_broken_catalogue_is_refused_at_load(data, message):
    """Each refusal names the key that is wrong."""
    with pytest.raises(CatalogueError, match=message):
        parse_catalogue(data)


def test_an_http_action_may_land_its_effect_ten_call_timeouts_after_its_request_at_least_30_s():
    """``max_effect_seconds``: declared, else ten times the call's own timeout, else its
    downstream's, and never under 30 s; a noop has none."""
    catalogue = parse_catalogue(
        {
            "downstreams": {"slow": {"base_url": "http://127.0.0.1:1", "timeout_ms": 8000}},
            "cells": {
                "x": {
                    "actions": {
                        "declared": {
                            "kind": "http", "downstream": "slow", "path": "/a",
                            "max_effect_seconds": 7,
                        },
                        "by_downstream": {"kind": "http", "downstream": "slow", "path": "/b"},
                        "by_call": {
                            "kind": "http", "downstream": "slow", "path": "/c", "timeout_ms": 1500,
                        },
                        "quiet": {"kind": "noop"},
                    }
                }
            },
        }
    )  # fmt: skip
    effects = {a.name: a.max_effect_seconds for a in catalogue.cells["x"].actions}
    assert effects == {"declared": 7, "by_downstream": 80, "by_call": 30, "quiet": 0}


def test_outputs_are_declared_bounded_and_read_by_the_actions_that_wait_for_them():
    """An action's output fields and size limit (its own, else the catalogue's, else 64 KiB);
    a path may read an output of an action of its cell it depends on, even through
    another; a cell's result is the action it names, else its sinks."""
    catalogue = parse_catalogue(
        {
            "max_output_bytes": 4096,
            "cells": {
                "x": {
                    "result": "open",
                    "actions": {
                        "open": {**HTTP, "output": {"id": "string", "n": {"type": "integer"}}},
                        "mid": {**HTTP, "depends_on": ["open"], "max_output_bytes": 10},
                        "tell": {
                            **HTTP, "depends_on": ["mid"], "path": "/t/{nodes.open.output.id}",
                        },
                    },
                },
                "y": NOOP,
            },
        }
    )  # fmt: skip
    x = catalogue.cells["x"]
    actions = {a.name: a for a in x.actions}
    assert [(f.name, f.type) for f in actions["open"].output] == [
        ("id", "string"),
        ("n", "integer"),
    ]
    assert {a.name: a.max_output_bytes for a in x.actions} == {
        "open": 4096,
        "mid": 10,
        "tell": 4096,
    }
    assert x.result_actions == ["open"] and x.sinks == ["tell"]
    assert catalogue.cells["y"].result_actions == ["a"]
    assert parse_catalogue(NOOP_CATALOGUE).cells["y"].actions[0].max_output_bytes == 65536


WAIT = {"kind": "wait", "signal": "verdict", "timeout_seconds": 60}
VERDICT = {"verdict": {"type": "string", "required": True}}


def wait_cell(**action) -> dict:
    return {"cells": {"r": {"fields": {}, "actions": {"w": {**WAIT, **action}}}}}


def test_a_wait_action_names_its_signal_timeout_default_and_choices_as_its_output_declares():
    [action] = (
        parse_catalogue(
            wait_cell(
                on_timeout="succeed",
                default_output={"verdict": "approved"},
                output=VERDICT,
                choices={"approve": {"verdict": "approved"}, "reject": {"verdict": "rejected"}},
            )
        )
        .cells["r"]
        .actions
    )
    assert (action.signal, action.timeout_seconds, action.on_timeout) == ("verdict", 60, "succeed")
    assert action.default_output == {"verdict": "approved"}
    assert [name for name, _ in action.choices] == ["approve", "reject"]
    assert parse_catalogue(wait_cell()).cells["r"].actions[0].on_timeout == "fail"  # the default
    assert "await_review" in load_catalogue().cells  # the example's review waits for a verdict


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({"signal": ""}, "actions.w.signal: a wait action needs a signal name"),
        ({"timeout_seconds": 0}, "actions.w.timeout_seconds: a wait action needs a positive"),
        ({"on_timeout": "retry"}, "actions.w.on_timeout: must be one of"),
        ({"on_timeout": "succeed"}, "actions.w.default_output: must be a JSON object"),
        (
            {"on_timeout": "succeed", "default_output": {"verdict": 1}, "output": VERDICT},
            "actions.w.default_output: verdict: must be string",
        ),
        ({"default_output": {}}, "actions.w.default_output: only with on_timeout: succeed"),
        (
            {"choices": {"approve": {}}, "output": VERDICT},
            "actions.w.choices.approve: verdict: required",
        ),
    ],
)
def test_a_wait_action_without_what_it_needs_is_refused_at_load(action, message):
    with pytest.raises(CatalogueError, match=message):
        parse_catalogue(wait_cell(**action))


def test_only_a_wait_action_has_a_signal():
    with pytest.raises(CatalogueError, match="actions.a.signal: only a wait action has one"):
        parse_catalogue({"cells": {"x": {"actions": {"a": {**HTTP, "signal": "s"}}}}})


def labelled(labels, fields=None):
    fields = fields or {"content_id": "string", "Big": "string", "flag": "boolean"}
    return {"cells": {"x": {"fields": fields, "labels": labels, "actions": {"a": HTTP}}}}


def test_a_cells_label_fields_are_string_or_integer_fields_named_as_label_keys():
    assert parse_catalogue(labelled(["content_id"])).cells["x"].labels == ("content_id",)
    assert parse_catalogue(NOOP_CATALOGUE).cells["y"].labels == ()
    for labels, message in [
        ("content_id", "must be a list"),
        (["missing"], "'missing' is not a string or integer field"),
        (["flag"], "'flag' is not a string or integer field"),
        (["Big"], "'Big' is not a label key"),
    ]:
        with pytest.raises(CatalogueError, match=message):
            parse_catalogue(labelled(labels))


def test_a_queue_declares_its_runs_at_once_and_a_second():
    catalogue = parse_catalogue(
        {"queues": {"a": {"max_concurrency": 2, "max_calls_per_second": 5}, "b": None}}
    )
    assert catalogue.queues["a"] == Queue("a", max_concurrency=2, max_calls_per_second=5)
    assert catalogue.queues["b"] == Queue("b")


D = {"base_url": "http://d", "max_concurrency": 4, "max_calls_per_second": 10}


def test_a_downstream_declares_what_each_business_may_have_of_it():
    catalogue = parse_catalogue(
        {
            "downstreams": {
                "a": {**D, "per_business": {"max_concurrency": 2, "max_calls_per_second": 5}},
                "b": {**D, "per_business": {"max_concurrency": 4}},
                "c": {"base_url": "http://c", "per_business": {"max_calls_per_second": 50}},
                "d": D,
            }
        }
    )
    limits = {n: d.per_business for n, d in catalogue.downstreams.items()}
    assert limits == {
        "a": BusinessLimit(2, 5),
        "b": BusinessLimit(4, 0),
        "c": BusinessLimit(0, 50),  # the downstream has no rate of its own to stay under
        "d": BusinessLimit(),
    }
    assert not limits["d"] and limits["c"]


@pytest.mark.parametrize(
    ("per_business", "message"),
    [
        (
            {"max_concurrency": 5},
            r"downstreams.d.per_business.max_concurrency: 5 is more than the downstream's own"
            r" max_concurrency \(4\)",
        ),
        (
            {"max_calls_per_second": 11},
            r"downstreams.d.per_business.max_calls_per_second: 11 is more than the"
            r" downstream's own max_calls_per_second \(10\)",
        ),
        (
            {"max_concurrency": -1},
            r"downstreams.d.per_business.max_concurrency: must be a whole number of at least 0",
        ),
        (
            {"max_calls_per_second": 1.5},
            r"downstreams.d.per_business.max_calls_per_second: must be a whole number",
        ),
        (
            {"max_runs": 1},
            r"downstreams.d.per_business: a mapping with max_concurrency, max_calls_per_second",
        ),
        ({}, r"downstreams.d.per_business: a mapping with max_concurrency"),
        (3, r"downstreams.d.per_business: a mapping with max_concurrency"),
    ],
)
def test_a_per_business_limit_beyond_the_downstreams_own_is_refused_naming_the_field(
    per_business, message
):
    with pytest.raises(CatalogueError, match=message):
        parse_catalogue({"downstreams": {"d": {**D, "per_business": per_business}}})
