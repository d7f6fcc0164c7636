"""Enum value names without their prefix: one rule for every enum the protos declare."""

from __future__ import annotations

import importlib
import pkgutil

import dispo.libs.api as api
import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.proto_enums import (
    from_short_name,
    node_status_name,
    short_name,
    task_status_name,
)
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper


def all_enums() -> list[EnumTypeWrapper]:
    found = []
    for info in pkgutil.walk_packages(api.__path__, f"{api.__name__}."):
        if info.name.endswith("_pb2"):
            module = importlib.import_module(info.name)
            found += [
                getattr(module, name)
                for name in module.DESCRIPTOR.enum_types_by_name
                if isinstance(getattr(module, name, None), EnumTypeWrapper)
            ]
    return found


def test_the_common_statuses():
    assert task_status_name(common_pb2.TASK_STATUS_SUCCEEDED) == "SUCCEEDED"
    assert node_status_name(common_pb2.NODE_STATUS_DEPENDENCY_FAILED) == "DEPENDENCY_FAILED"
    assert from_short_name(common_pb2.TaskStatus, "FAILED") == common_pb2.TASK_STATUS_FAILED
    with pytest.raises(ValueError):
        from_short_name(common_pb2.TaskStatus, "NO_SUCH_STATUS")
    with pytest.raises(ValueError):
        task_status_name(999)


def test_every_enum_value_carries_its_enums_prefix_and_round_trips():
    enums = all_enums()
    assert len(enums) > 5
    for enum in enums:
        for full, value in enum.items():
            name = short_name(enum, value)
            assert name != full, f"{full} does not start with its enum's prefix"
            assert from_short_name(enum, name) == value
