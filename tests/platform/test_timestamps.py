"""The Timestamp conversions at the gRPC and event edges say exactly what protobuf's own
``FromDatetime`` / ``ToDatetime`` say, over the whole range, aware or naive."""

import random
from datetime import UTC, datetime, timedelta, timezone

from dispo.libs.timestamps import from_timestamp, set_timestamp, to_timestamp
from google.protobuf.timestamp_pb2 import Timestamp

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FIRST, LAST = datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC)


def moments(n: int):
    rng = random.Random(7)
    span = int((LAST - FIRST).total_seconds() * 1_000_000)
    edges = [FIRST, LAST, EPOCH, EPOCH - timedelta(microseconds=1), EPOCH + timedelta(days=1)]
    for moment in edges + [FIRST + timedelta(microseconds=rng.randrange(span)) for _ in range(n)]:
        offset = timezone(timedelta(minutes=rng.choice([0, 330, -480, 765])))
        yield moment.astimezone(offset)
        yield moment.replace(tzinfo=None)  # naive: read as UTC


def test_set_timestamp_writes_what_from_datetime_writes():
    ours, theirs = Timestamp(), Timestamp()
    for moment in moments(20_000):
        set_timestamp(ours, moment)
        theirs.FromDatetime(moment)
        assert (ours.seconds, ours.nanos) == (theirs.seconds, theirs.nanos), moment
        assert to_timestamp(moment) == theirs


def test_from_timestamp_reads_what_to_datetime_reads():
    stamp = Timestamp()
    for moment in moments(20_000):
        stamp.FromDatetime(moment)
        stamp.nanos += 999 if stamp.nanos < 999_999_000 else 0  # sub-microsecond: cut off
        read = from_timestamp(stamp, True)
        assert read == stamp.ToDatetime(tzinfo=UTC) and read.tzinfo is UTC, moment
    assert from_timestamp(stamp, False) is None
