"""Names of protobuf enum values without their prefix, as logs and the SDK spell them:
``TASK_STATUS_SUCCEEDED`` is ``SUCCEEDED`` (a stored row holds the same name in lower case,
ADR 0017). The prefix is the enum's own name in upper snake case, as protos spell every
value."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any, TypeVar

from dispo.libs.api.common.v1 import common_pb2

if TYPE_CHECKING:  # the stubs' generic wrapper; at run time protobuf's EnumTypeWrapper
    from google.protobuf.internal.enum_type_wrapper import _EnumTypeWrapper

V = TypeVar("V", bound=int)


def _prefix(enum: Any) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", enum.DESCRIPTOR.name).upper() + "_"


@functools.cache  # an event's subject names its status: looked up for every event
def short_name(enum: Any, value: int) -> str:
    """``short_name(common_pb2.TaskStatus, 3)`` → ``"SUCCEEDED"``; ValueError if unknown."""
    return str(enum.Name(value)).removeprefix(_prefix(enum))


def from_short_name(enum: _EnumTypeWrapper[V], name: str) -> V:
    """The value ``short_name`` names; ValueError if there is none."""
    return enum.Value(_prefix(enum) + name)


def task_status_name(value: int) -> str:
    return short_name(common_pb2.TaskStatus, value)


def node_status_name(value: int) -> str:
    return short_name(common_pb2.NodeStatus, value)


__all__ = ["from_short_name", "node_status_name", "short_name", "task_status_name"]
