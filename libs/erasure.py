"""Erasure (ADR-0113): what a finished task's user data becomes when it is erased, decided
once for every service. Pure: each service applies it to its own rows through its store.

A *tombstone* stands where a payload, an output or a text that may quote one was: the
keys, ids, statuses and times stay (the audit skeleton), the values go.
"""

from __future__ import annotations

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from google.protobuf.message import DecodeError

# The encoding a tombstone payload declares, and the bytes that replace a raw payload or
# output column (valid JSON, so a reader that parses it still can).
ERASED_ENCODING = b"erased"
TOMBSTONE = b'{"erased":true}'
# What replaces a text that may quote a payload or a downstream's answer (a node's last
# error, a delivery's error).
ERASED_TEXT = "erased"


def erase_request(data: bytes) -> task_pb2.EraseRequest | str:
    """A ``task.erase`` message's request, or why a consumer refuses it (its bytes are not
    one, or it names no task)."""
    try:
        request = task_pb2.EraseRequest.FromString(data)
    except DecodeError:
        return "malformed erase request"
    return request if request.task_id else "erase request needs task_id"


def tombstone_payload() -> common_pb2.Payload:
    return common_pb2.Payload(metadata={"encoding": ERASED_ENCODING}, data=TOMBSTONE)


def is_tombstone(payload: common_pb2.Payload) -> bool:
    return payload.metadata.get("encoding") == ERASED_ENCODING


def erased(task: task_pb2.Task) -> bool:
    """Whether ``task``'s payloads were erased (it cannot run again)."""
    return any(is_tombstone(p) for p in task.payloads.values())


def erase_task(task: task_pb2.Task) -> task_pb2.Task:
    """A copy of ``task`` with its payloads, its result, its nodes' outputs, their last errors and their
    expanded paths and probe paths (which may carry payload fields) replaced by tombstones."""
    erased = task_pb2.Task()
    erased.CopyFrom(task)
    if erased.HasField("result"):
        erased.result.CopyFrom(tombstone_payload())
    for ref in list(erased.payloads):
        erased.payloads[ref].CopyFrom(tombstone_payload())
    for node in erased.nodes:
        if node.HasField("output"):
            node.output.CopyFrom(tombstone_payload())
        if node.last_error:
            node.last_error = ERASED_TEXT
        node.spec.path = ""
        node.spec.probe_path = ""
    return erased


def erase_task_bytes(data: bytes | None) -> bytes | None:
    """:func:`erase_task` of a serialised Task (None stays None)."""
    if data is None:
        return None
    return erase_task(task_pb2.Task.FromString(data)).SerializeToString()
