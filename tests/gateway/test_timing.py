"""When a submission starts and by when it must end (dispo.gateway.timing, pure): the
horizon, a start in the past, and the earliest of the deadline and the cells'
``max_duration_seconds`` counted from the start (ADR-0103)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from dispo.gateway.timing import Timing, timing
from dispo.libs.catalogue import Catalogue, CellDef
from dispo.libs.catalogue.model import ActionDef
from dispo.libs.errors import InvalidArgument

NOW = datetime(2027, 1, 1, tzinfo=UTC)
YEAR = 366 * 24 * 3600
NOOP = CellDef("plain", "", (), (ActionDef("noop", "noop"),))
CATALOGUE = Catalogue(
    {
        "plain": NOOP,
        "hour": replace(NOOP, name="hour", max_duration_seconds=3600),
        "minute": replace(NOOP, name="minute", max_duration_seconds=60),
    }
)


def at(**delta: float) -> datetime:
    return NOW + timedelta(**delta)


def test_no_time_asked_is_no_delay_and_no_deadline():
    assert timing(None, None, ["plain"], CATALOGUE, NOW, YEAR) == Timing()


def test_a_start_in_the_past_is_no_delay():
    assert timing(at(minutes=-5), None, ["plain"], CATALOGUE, NOW, YEAR) == Timing()


def test_the_earliest_of_the_deadline_and_the_cells_durations_from_the_start_wins():
    start = at(hours=2)
    assert timing(start, None, ["hour", "minute"], CATALOGUE, NOW, YEAR) == Timing(
        start, start + timedelta(seconds=60)
    )
    assert timing(start, at(hours=2, seconds=30), ["minute"], CATALOGUE, NOW, YEAR) == Timing(
        start, at(hours=2, seconds=30)
    )
    assert timing(None, None, ["hour"], CATALOGUE, NOW, YEAR) == Timing(None, at(hours=1))


@pytest.mark.parametrize(
    ("not_before", "deadline", "field"),
    [
        (at(seconds=YEAR + 1), None, "not_before"),
        (None, at(seconds=YEAR + 1), "deadline"),
        (None, NOW, "deadline"),
        (at(hours=2), at(hours=1), "deadline"),
    ],
)
def test_refusals_name_their_field(not_before, deadline, field):
    with pytest.raises(InvalidArgument) as refused:
        timing(not_before, deadline, ["plain"], CATALOGUE, NOW, YEAR)
    assert [v.field for v in refused.value.violations] == [field]


def test_at_the_horizon_is_accepted():
    assert timing(at(seconds=YEAR), None, [], CATALOGUE, NOW, YEAR).not_before == at(seconds=YEAR)


@pytest.mark.parametrize("field", ["not_before", "deadline"])
def test_a_timestamp_out_of_its_range_is_refused_naming_the_field(field):
    from dispo.gateway.convert import submission_from_proto
    from dispo.libs.api.gateway.v1 import gateway_pb2

    request = gateway_pb2.SubmitRequest(business="b", cells=[gateway_pb2.CellRequest(cell="noop")])
    getattr(request, field).seconds = 2**62
    with pytest.raises(InvalidArgument) as refused:
        submission_from_proto(request)
    assert [v.field for v in refused.value.violations] == [field]
