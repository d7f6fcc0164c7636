"""datetime <-> google.protobuf.Timestamp at the gRPC and event edges (UTC, unset = None)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

from google.protobuf.timestamp_pb2 import Timestamp


@overload
def to_timestamp(moment: datetime) -> Timestamp: ...
@overload
def to_timestamp(moment: None) -> None: ...
@overload
def to_timestamp(moment: datetime | None) -> Timestamp | None: ...
def to_timestamp(moment: datetime | None) -> Timestamp | None:
    """A Timestamp for ``moment``; None stays None (an unset message field)."""
    if moment is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(moment)
    return stamp


def from_timestamp(stamp: Timestamp, present: bool) -> datetime | None:
    """The aware UTC datetime of a field, or None when the field is not set (``present``)."""
    return stamp.ToDatetime(tzinfo=UTC) if present else None
