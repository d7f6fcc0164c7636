"""The pool's enums on the wire: domain value <-> proto value, at the edge only (the servicer
and the pool-worker)."""

from __future__ import annotations

from dispo.libs.api.pool.v1 import pool_pb2 as pb
from dispo.libs.proto_enums import from_short_name
from dispo.pool.domain import RULE_KINDS, AssignmentEnd

RULE_KIND_TO_PB = {k: from_short_name(pb.RuleKind, k.upper()) for k in RULE_KINDS}
RULE_KIND_FROM_PB = {v: k for k, v in RULE_KIND_TO_PB.items()}
ASSIGNMENT_END_TO_PB = {e: from_short_name(pb.AssignmentEnd, e.name) for e in AssignmentEnd}


def rule_kind(value: pb.RuleKind.ValueType) -> str:
    """The domain rule kind of a proto value; "" (refused by validation) when not one."""
    return RULE_KIND_FROM_PB.get(value, "")


def assignment_end(reason: str | None) -> pb.AssignmentEnd.ValueType:
    return ASSIGNMENT_END_TO_PB[AssignmentEnd(reason)] if reason else pb.ASSIGNMENT_END_UNSPECIFIED
