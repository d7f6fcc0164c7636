"""The bound Submit puts on an envelope's growth is counted from the bytes already encoded
and the node ids, not by encoding anything again: it must be exactly what encoding the
largest redrive would give."""

from __future__ import annotations

from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.contracts import tasks
from hypothesis import given
from hypothesis import strategies as st

node_ids = st.lists(st.text(max_size=300), max_size=40)


def encoded_bound(env: task_pb2.Task) -> int:
    """The bound as encoding gives it: the envelope's bytes, the largest task and node
    state, and a redrive naming every node twice, encoded."""
    ids = [n.node_id for n in env.nodes]
    redrive = task_pb2.Redrive(reset_nodes=ids, settled_nodes=ids)
    return (
        env.ByteSize() + tasks._TASK_STATE + redrive.ByteSize() + 6 + len(ids) * tasks._NODE_STATE
    )


@given(node_ids, st.binary(max_size=2000))
def test_the_counted_bound_is_the_encoded_one(ids, payload):
    env = task_pb2.Task(task_id="t", nodes=[task_pb2.Node(node_id=i) for i in ids])
    env.payloads["p"].data = payload
    view = env.SerializeToString()
    assert tasks.largest_envelope_size(len(view), ids) == encoded_bound(env)
