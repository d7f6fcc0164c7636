"""The drift repairs the reconciler decides and the pool applies (``pool.v1.RepairKind``),
declared once here with their proto conversion. Stored values are the enum values
(``remove_orphan``)."""

from __future__ import annotations

import enum

from dispo.libs.api.pool.v1 import pool_pb2
from dispo.libs.errors import InvalidArgument
from dispo.libs.proto_enums import from_short_name
from dispo.libs.validation import enum_rule


class RepairKind(enum.StrEnum):
    REMOVE_ORPHAN = "remove_orphan"
    RECREATE_MISSING = "recreate_missing"
    RELEASE_FINISHED = "release_finished"
    REQUEUE_EVALUATION = "requeue_evaluation"
    REWRITE_STATE = "rewrite_state"


REPAIR_KIND_TO_PB = {k: from_short_name(pool_pb2.RepairKind, k.name) for k in RepairKind}
REPAIR_KIND_FROM_PB = {v: k for k, v in REPAIR_KIND_TO_PB.items()}


def repair_kind_from_pb(value: pool_pb2.RepairKind.ValueType, field: str = "kind") -> RepairKind:
    """The domain repair kind of a proto value; unspecified or unknown is ``InvalidArgument``."""
    try:
        return REPAIR_KIND_FROM_PB[value]
    except KeyError:
        raise InvalidArgument(field, enum_rule(pool_pb2.RepairKind.DESCRIPTOR)) from None
