"""The bus refuses a message over the server's max_payload before sending anything, and
counts its size as the server does (payload and headers)."""

from __future__ import annotations

import pytest
from dispo.libs.bus import Bus, MessageTooLarge
from support.nats import nats_with_max_payload

LIMIT = 4096


@pytest.fixture
async def small_bus(tmp_path):
    with nats_with_max_payload(tmp_path / "nats", LIMIT) as server:
        bus = await Bus.connect([server.url], name="test-small", credentials=server.credentials())
        await bus.ensure_stream("TASKS", ["task.create"])
        yield bus
        await bus.close()


def sized(bus: Bus, msg_id: str, size: int) -> bytes:
    """A payload making a message of exactly ``size`` bytes with ``msg_id``."""
    data = b"x" * (size - bus.message_size(b"", msg_id=msg_id))
    assert bus.message_size(data, msg_id=msg_id) == size
    return data


async def test_the_limit_is_read_from_the_server_and_headers_count(small_bus):
    bus = small_bus
    assert bus.max_payload == LIMIT
    # Exactly at the limit: the server takes it (the size is counted as the server counts).
    ack = await bus.publish("task.create", sized(bus, "at-limit", LIMIT), msg_id="at-limit")
    assert ack.seq == 1
    # One byte more, though the payload alone is under the limit: refused, nothing sent.
    over = sized(bus, "over", LIMIT + 1)
    assert len(over) < LIMIT
    with pytest.raises(MessageTooLarge) as refused:
        await bus.publish("task.create", over, msg_id="over")
    assert (refused.value.size, refused.value.limit) == (LIMIT + 1, LIMIT)
    assert "4097 bytes on task.create" in str(refused.value)
    # The connection is still there (the server closes it on a message over its limit).
    assert bus.nc.is_connected
    assert (await bus.js.stream_info("TASKS")).state.messages == 1


async def test_publish_many_refuses_the_whole_batch_before_sending_any(small_bus):
    bus = small_bus
    batch = [
        ("task.create", b"a", "m-1"),
        ("task.create", sized(bus, "m-2", LIMIT + 1), "m-2"),
        ("task.create", b"c", "m-3"),
    ]
    with pytest.raises(MessageTooLarge):
        await bus.publish_many(batch)
    assert (await bus.js.stream_info("TASKS")).state.messages == 0
    acks = await bus.publish_many([batch[0], batch[2]])
    assert [a.seq for a in acks] == [1, 2]
    assert bus.nc.is_connected
