"""The task contract (protos/dispo/task/v1/task.proto) on the bus: streams, subjects and
message ids. The gateway, the executor and the reconciler publish and consume these, and
each ensures the streams at start.

Message ids make a republication a no-op within the stream's duplicate window, so each
names the fact it carries: the envelope's generation for task.create / task.fail /
task.demote, the snapshot's version for a status event, the cause for a cancel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import Bus
from dispo.libs.contracts._streams import Durable, Flow, Stream
from dispo.libs.error_text import ERROR_TEXT_LIMIT
from dispo.libs.proto_enums import task_status_name

# Subjects of the TASKS stream.
TASK_CREATE = "task.create"  # Task envelope: run it (gateway, executor retry, reconciler redrive)
TASK_FAIL = (
    "task.fail"  # Task envelope: retries spent, an outcome unknown, or ended FAILED (executor)
)
TASK_DEMOTE = "task.demote"  # Task envelope: parked behind a degraded downstream (executor)
TASK_CANCEL = "task.cancel"  # CancelRequest (gateway, reconciler)
TASK_CLOSE = "task.close"  # CloseRequest: a parked task ended for good (reconciler)
TASK_SIGNAL = "task.signal"  # SignalRequest: a caller's signal to a task's wait nodes (gateway)
TASK_ERASE = "task.erase"  # EraseRequest: a finished task's user data was erased (gateway)

# task.status.<task_id>.<status>: a Task snapshot of node states, without payloads (executor,
# reconciler for a terminal failure); <status> is the snapshot's task status in lower case
# (``running``, ``succeeded``, ...). Read by the gateway's view (all of them) and the
# reconciler (the terminal ones only: the server filters the others out).
TASK_STATUS_ALL = "task.status.>"
TERMINAL_TASK_STATUSES = (
    common_pb2.TASK_STATUS_SUCCEEDED,
    common_pb2.TASK_STATUS_FAILED,
    common_pb2.TASK_STATUS_CANCELLED,
)

# A parked task closed FAILED (task.close): what each node that can no longer run ends as.
# A parked task has nothing ready, so a PENDING node waits for a dependency that did not
# succeed: DEPENDENCY_FAILED. A DEMOTED node will not be released any more: FAILED, with
# the close's reason as its error. A WAITING node will not be resumed: CANCELLED (a
# deadline closes it so too). Every other node keeps its state (an UNKNOWN one stays
# UNKNOWN: its effect may have happened). The executor applies this to its table, the
# reconciler to the final snapshot it publishes, so the two agree.
CLOSED_NODE = {
    common_pb2.NODE_STATUS_PENDING: common_pb2.NODE_STATUS_DEPENDENCY_FAILED,
    common_pb2.NODE_STATUS_DEMOTED: common_pb2.NODE_STATUS_FAILED,
    common_pb2.NODE_STATUS_WAITING: common_pb2.NODE_STATUS_CANCELLED,
}
DEPENDENCY_FAILED_ERROR = "a dependency failed"


# What a DEMOTED node waits for, as the reconciler names it: its downstream (an http
# action behind an open breaker), or ``queue:<name>`` (a worker action whose queue had no
# live worker, ADR-0101), whose health is asked of the executor (ListQueues).
QUEUE_PREFIX = "queue:"


# A task's priority (SubmitRequest.priority, Task.priority): 1 goes first within its
# business's share, 5 last; 3 when the caller gives none (ADR-0109).
HIGHEST_PRIORITY = 1
LOWEST_PRIORITY = 5
DEFAULT_PRIORITY = 3


def priority_of(given: int) -> int:
    """A task's priority as given on Submit or in its envelope (0: not given)."""
    return given or DEFAULT_PRIORITY


def blocker(downstream: str, queue: str) -> str:
    """The name of what a demoted node of this action waits for."""
    return f"{QUEUE_PREFIX}{queue}" if queue else downstream


def blocker_queue(name: str) -> str | None:
    """The queue a blocker names (None: it names a downstream)."""
    return name.removeprefix(QUEUE_PREFIX) if name.startswith(QUEUE_PREFIX) else None


def closed_node_error(status: int, reason: str) -> str:
    """The error a node closed to ``status`` (a value of :data:`CLOSED_NODE`) records."""
    return DEPENDENCY_FAILED_ERROR if status == common_pb2.NODE_STATUS_DEPENDENCY_FAILED else reason


# Completion notifications to a caller's nats:callbacks.<business>.<...> subject
# (reconciler); a task's callback may name only its own business's (dispo.libs.egress).
CALLBACK_ALL = "callbacks.>"

# Status snapshots are for live views; the services' tables keep the history.
STATUS_MAX_AGE = 7 * 24 * 3600.0

# The durables that must see each TASKS subject (the executor's and the reconciler's, named
# as their settings name them by default): the stream keeps a message until each of those on
# its subject has acknowledged it (ADR-0092).
TASK_DURABLES = (
    Durable("executor", (TASK_CREATE,)),
    Durable("executor-cancel", (TASK_CANCEL,)),
    Durable("executor-close", (TASK_CLOSE,)),
    Durable("executor-signal", (TASK_SIGNAL,)),
    Durable("reconciler-claims", (TASK_CREATE,)),
    Durable("reconciler-fail", (TASK_FAIL,)),
    Durable("reconciler-demote", (TASK_DEMOTE,)),
    Durable("executor-erase", (TASK_ERASE,)),
    Durable("reconciler-erase", (TASK_ERASE,)),
)

TASKS = Stream(
    "TASKS",
    (TASK_CREATE, TASK_FAIL, TASK_DEMOTE, TASK_CANCEL, TASK_CLOSE, TASK_SIGNAL, TASK_ERASE),
    retention="interest",
    durables=TASK_DURABLES,
)
# Read back for a task's history (ADR-0052): kept for its age, whoever acknowledged it.
TASK_STATUS = Stream("TASK_STATUS", (TASK_STATUS_ALL,), max_age=STATUS_MAX_AGE)
CALLBACKS = Stream("CALLBACKS", (CALLBACK_ALL,), max_age=STATUS_MAX_AGE)

# Who publishes and who consumes each subject (the bus users' permissions follow from it).
FLOWS = (
    Flow(TASK_CREATE, ("gateway", "executor", "reconciler"), ("executor", "reconciler"), TASKS),
    Flow(TASK_FAIL, ("executor",), ("reconciler",), TASKS),
    Flow(TASK_DEMOTE, ("executor",), ("reconciler",), TASKS),
    Flow(TASK_CANCEL, ("gateway", "reconciler"), ("executor",), TASKS),
    Flow(TASK_CLOSE, ("reconciler",), ("executor",), TASKS),
    Flow(TASK_SIGNAL, ("gateway",), ("executor",), TASKS),
    Flow(TASK_ERASE, ("gateway",), ("executor", "reconciler"), TASKS),
    # The gateway also reads one task's snapshots back (ListTaskEvents, Bus.read_subject);
    # the executor purges an erased task's (ADR-0113: they carry its nodes' paths and errors).
    Flow(
        TASK_STATUS_ALL,
        ("executor", "reconciler"),
        ("gateway", "reconciler"),
        TASK_STATUS,
        readers=("gateway",),
        purgers=("executor",),
    ),
    Flow(CALLBACK_ALL, ("reconciler",), (), CALLBACKS),  # read by the callers who asked
)


def task_status(task_id: str, status: int) -> str:
    """The subject of one task's status snapshot with that ``TaskStatus``."""
    return f"task.status.{task_id}.{task_status_name(status).lower()}"


def task_status_of(task_id: str) -> str:
    """Every status snapshot of one task (a filter)."""
    return f"task.status.{task_id}.*"


# The terminal snapshots of every task (filters of the reconciler's completion consumer).
TASK_STATUS_TERMINAL = tuple(
    f"task.status.*.{task_status_name(s).lower()}" for s in TERMINAL_TASK_STATUSES
)


# ---- message ids ---------------------------------------------------------------------


def create_id(task_id: str, generation: int) -> str:
    """task.create: the gateway's first publication (generation 0) is ``<task_id>``; every
    republication (short retry, redrive) increments the generation: ``<task_id>:g<n>``."""
    return task_id if generation == 0 else f"{task_id}:g{generation}"


def fail_id(task_id: str, generation: int) -> str:
    return f"{task_id}:fail:g{generation}"


def demote_id(task_id: str, generation: int) -> str:
    return f"{task_id}:demote:g{generation}"


def cancel_id(task_id: str, cause: str = "") -> str:
    """task.cancel: ``<task_id>:cancel`` for a caller's cancel, ``<task_id>:cancel:<cause>``
    for one the reconciler decides (an arbitration verdict, an operator's abandon)."""
    return f"{task_id}:cancel" + (f":{cause}" if cause else "")


def signal_id(task_id: str, signal_id: str) -> str:
    """task.signal: one message per signal of a task (``<task_id>:signal:<signal_id>``)."""
    return f"{task_id}:signal:{signal_id}"


def erase_id(task_id: str) -> str:
    """task.erase: one message per task (``<task_id>:erase``); an erasure is never undone."""
    return f"{task_id}:erase"


def close_id(task_id: str, generation: int) -> str:
    """task.close for the envelope of that generation: a task resumed and closed again is
    closed again, not dropped as a duplicate."""
    return f"{task_id}:close:g{generation}"


def status_id(task_id: str, version: int, publisher: str = "") -> str:
    """task.status.<id>: ``<task_id>:v<version>`` for the executor's snapshots,
    ``<task_id>:<publisher>:v<version>`` for another publisher's."""
    return f"{task_id}:{publisher + ':' if publisher else ''}v{version}"


def task_status_all(task_id: str) -> str:
    """Every status snapshot subject of one task (``task.status.<task_id>.*``)."""
    return f"{TASK_STATUS_ALL.removesuffix('>')}{task_id}.*"


def status_publisher(task_id: str, msg_id: str) -> str:
    """Who published a status snapshot of ``task_id``, from its message id
    (:func:`status_id`): the publisher it names, else ``"executor"``; empty for an id that
    is not a status id of that task."""
    rest = msg_id.removeprefix(f"{task_id}:")
    if rest == msg_id:
        return ""
    publisher, _, version = rest.rpartition(":")
    if not version.startswith("v"):
        return ""
    return publisher or "executor"


def completion_id(task_id: str) -> str:
    """The completion notification published to a caller's NATS subject."""
    return f"{task_id}:completion"


def status_snapshot(env: task_pb2.Task) -> task_pb2.Task:
    """What a task.status.<task_id> event carries: the envelope without its payloads.
    Status consumers (the gateway's view, the reconciler's completion facts) read node
    states; the payloads were recorded once at acceptance and travel only with the
    envelopes that run the task (task.create, task.fail, task.demote)."""
    out = task_pb2.Task()
    out.CopyFrom(env)
    out.ClearField("payloads")
    return out


# ---- how large an envelope can grow ----------------------------------------------------

_LARGEST_GENERATION = 2**63 - 1
_LARGEST_TEXT = "\U0010ffff" * ERROR_TEXT_LIMIT  # the most bytes truncate_error lets through


def _largest_stamp(stamp: Any) -> None:
    stamp.seconds, stamp.nanos = -(2**63), 999_999_999


def _largest_node_state() -> int:
    """The most bytes the executor's state can add to one node: every field it records at
    its longest, plus the growth of the node's own length prefix."""
    node = task_pb2.Node(status=max(common_pb2.NodeStatus.values()), last_error=_LARGEST_TEXT)
    node.retry.attempts = node.retry.round_attempts = -1  # the longest int32 varint
    node.retry.retryable = True
    for stamp in (node.retry.not_before, node.started_at, node.finished_at):
        _largest_stamp(stamp)
    return node.ByteSize() + 4


def _largest_task_state() -> int:
    """The most bytes the executor and the reconciler can add to the task's own fields."""
    task = task_pb2.Task(
        generation=-1,
        version=-1,
        status=max(common_pb2.TaskStatus.values()),
        cancel_requested=True,
        status_reason=_LARGEST_TEXT,
    )
    _largest_stamp(task.updated_at)
    return task.ByteSize()


_NODE_STATE = _largest_node_state()
_TASK_STATE = _largest_task_state()


def _string_field_size(value: str) -> int:
    """Bytes of one ``string`` field numbered below 16: its tag, its length, its text."""
    length = len(value.encode())
    return 1 + (length.bit_length() + 6) // 7 + length if length else 2


def largest_envelope_size(size: int, node_ids: Sequence[str]) -> int:
    """The most bytes an envelope of ``size`` bytes as accepted, with these nodes, can become
    while it runs: every node with the largest state the executor records (last error,
    retries, times), the task with the largest status reason, and a redrive naming every
    node twice (reset and settled). An envelope republished on task.create, task.fail or
    task.demote is never larger. Counted, not encoded: the caller has the envelope's bytes
    already."""
    redrive = 2 * sum(_string_field_size(i) for i in node_ids)  # reset_nodes, settled_nodes
    return size + _TASK_STATE + redrive + 6 + len(node_ids) * _NODE_STATE


def longest_envelope_id(task_id: str) -> str:
    """The longest message id an envelope of ``task_id`` can be published under."""
    g = _LARGEST_GENERATION
    return max(create_id(task_id, g), fail_id(task_id, g), demote_id(task_id, g), key=len)


async def ensure_task_streams(bus: Bus, service: str = "") -> None:
    """Ensure TASKS and TASK_STATUS as ``service`` (every service that uses them does at
    start): it brings to their declarations those it publishes to, and only creates the
    others (its bus user may not change them, ADR-0037). No ``service``: a publisher of both."""

    def publishes(stream: Stream) -> bool:
        return not service or any(f.stream == stream and service in f.publishers for f in FLOWS)

    await TASKS.ensure(bus, update=publishes(TASKS))
    await TASK_STATUS.ensure(bus, update=publishes(TASK_STATUS))
