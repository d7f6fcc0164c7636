"""The evaluation vocabulary the pool and intelligence share: an evaluation's line and a
run's verdict, declared once here (and once in ``dispo.common.v1``), with their proto
conversion. Stored values are the enum values (``formal``, ``pass``)."""

from __future__ import annotations

import enum

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.errors import InvalidArgument


class Line(enum.StrEnum):
    FORMAL = "formal"
    TRIAL = "trial"


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"


LINE_TO_PB = {Line.FORMAL: common_pb2.LINE_FORMAL, Line.TRIAL: common_pb2.LINE_TRIAL}
LINE_FROM_PB = {v: k for k, v in LINE_TO_PB.items()}
VERDICT_TO_PB = {
    Verdict.PASS: common_pb2.VERDICT_PASS,
    Verdict.FAIL: common_pb2.VERDICT_FAIL,
    Verdict.ERROR: common_pb2.VERDICT_ERROR,
}
VERDICT_FROM_PB = {v: k for k, v in VERDICT_TO_PB.items()}

LINE_RULE = "must be LINE_FORMAL or LINE_TRIAL"
# How the error of a comparison that has no earlier period to compare with begins: the first
# period of a series, expected, which the console shows as such rather than as a failure.
NO_BASELINE = "no baseline for evaluation"
# Longest evaluation id, series, period, case id or model name either context accepts.
MAX_ID_CHARS = 128
VERDICT_RULE = "must be VERDICT_PASS, VERDICT_FAIL or VERDICT_ERROR"


def verdict_from_pb(value: common_pb2.Verdict.ValueType, field: str = "verdict") -> Verdict:
    """The domain verdict of a proto value; unspecified or unknown is ``InvalidArgument``."""
    try:
        return VERDICT_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(field, VERDICT_RULE) from None
