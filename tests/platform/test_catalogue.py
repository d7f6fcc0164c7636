"""The one cell catalogue: its loader, its example shipped as package data, the setting
that names it, and the refusals of a broken file."""

import pytest
import yaml
from dispo.libs.catalogue import (
    EXAMPLE,
    CatalogueError,
    CatalogueSettings,
    Conflict,
    Downstream,
    load_catalogue,
    load_configured_catalogue,
    parse_catalogue,
)
from dispo.reconciler.settings import parse_config

NOOP = {"fields": {"id": {"type": "string"}}, "actions": {"a": {"kind": "noop"}}}


def test_the_example_ships_inside_the_package_and_loads_whole():
    assert EXAMPLE.is_file() and EXAMPLE.name == "content_governance.yaml"
    catalogue = load_catalogue()
    cell = catalogue.cells["update_quality_level"]
    assert [a.name for a in cell.actions] == ["set_label", "audit"]
    assert cell.sinks == ["audit"] and cell.roots == ["set_label"]
    assert cell.conflict == Conflict(key="content_id", effect="quality_level")
    assert catalogue.conflicts == {"update_quality_level": cell.conflict}
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
    ],
)
def test_broken_catalogue_is_refused_at_load(data, message):
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
