"""The catalogue's types and its parser: cells (payload fields, the actions with
dependencies each one expands into, the conflict it declares for arbitration) and the
downstreams those actions call.

Parsing checks the whole file at once, so a broken catalogue stops a service at start
instead of surfacing on some later call.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from dispo.libs import references
from dispo.libs.payload import fields_problem
from dispo.libs.validation import LABEL_KEY

ACTION_KINDS = ("http", "noop", "worker", "wait")
# What a wait action's timeout does: fail its node, or succeed it with its default output.
ON_TIMEOUT = ("fail", "succeed")
FIELD_TYPES = ("string", "integer", "number", "boolean", "object", "list")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,62}")  # fullmatch: no trailing newline
# A worker action's queue (and a worker token's queues): a name as above.
QUEUE_PATTERN = _NAME


class CatalogueError(ValueError):
    """The catalogue file itself is wrong (a deployment error, not a caller's)."""


@dataclass(frozen=True)
class BusinessLimit:
    """What one business may have of a downstream, whatever the others do: calls in flight
    at once and calls started in one second (0: no limit of its own; ADR-0108)."""

    max_concurrency: int = 0
    max_calls_per_second: int = 0

    def __bool__(self) -> bool:
        return bool(self.max_concurrency or self.max_calls_per_second)


@dataclass(frozen=True)
class Downstream:
    """A system the actions call: where it is, how long a call may take, how many calls
    may be in flight at once and how many may start in one second (0: no limit), across
    every executor (ADR-0108), and where its health is checked ("" for nowhere)."""

    name: str
    base_url: str
    timeout_ms: int = 5000
    max_concurrency: int = 16
    health_url: str = ""
    max_calls_per_second: int = 0
    # Each business's own limits on this downstream, across every executor (0: none).
    per_business: BusinessLimit = BusinessLimit()


@dataclass(frozen=True)
class Queue:
    """A worker actions' queue: how many of its runs may be taken at once, and how many in
    one second, across every worker and executor (0: no limit; ADR-0101, ADR-0108)."""

    name: str
    max_concurrency: int = 0
    max_calls_per_second: int = 0


@dataclass(frozen=True)
class Conflict:
    """A cell's declared effect on a target named by one of its payload fields: claims of
    different businesses on the same target within the arbitration window conflict."""

    key: str
    effect: str
    # A cell submitted for the losing task (same payload) to undo its effect; "" for none.
    compensate: str = ""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    type: str
    required: bool = False


@dataclass(frozen=True)
class ActionDef:
    name: str
    kind: str
    downstream: str = ""
    method: str = "POST"
    path: str = ""
    probe_path: str = ""
    idempotent: bool = False
    timeout_ms: int = 0
    depends_on: tuple[str, ...] = ()
    # How long after a request reaches the downstream its effect may still land, in
    # seconds: declared, or :func:`default_max_effect_seconds` of the call's timeout once
    # the catalogue is parsed (0 for a noop action).
    max_effect_seconds: int = 0
    # The largest output it may record, in bytes of canonical JSON: declared, else the
    # catalogue's ``max_output_bytes`` once parsed.
    max_output_bytes: int = 0
    # The output fields it declares (checked when its output is recorded); () for none.
    output: tuple[FieldSpec, ...] = ()
    # A worker action's queue: the workers serving it take its runs (ADR-0099).
    queue: str = ""
    # A wait action (ADR-0102): the signal it waits for, for how long, what its timeout
    # does (``fail`` or ``succeed`` with ``default_output``), and its named choices (the
    # console's buttons), each a payload.
    signal: str = ""
    timeout_seconds: int = 0
    on_timeout: str = ""
    default_output: dict[str, Any] | None = None
    choices: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def output_names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.output)


# An output's size limit when the catalogue names none (issue: 64 KiB).
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
# No output may be larger, whatever the catalogue says: it travels in one gRPC answer.
MAX_OUTPUT_BYTES = 1024 * 1024

# A worker run's deadline when its action declares no ``timeout_ms`` (ADR-0099).
DEFAULT_WORKER_TIMEOUT_MS = 60_000

# However short a call's timeout, an effect may land this long after its request.
MIN_MAX_EFFECT_SECONDS = 30


def default_max_effect_seconds(timeout_ms: int) -> int:
    """An action's ``max_effect_seconds`` when the catalogue declares none: ten times its
    call's timeout, and at least :data:`MIN_MAX_EFFECT_SECONDS`."""
    return max(MIN_MAX_EFFECT_SECONDS, math.ceil(10 * timeout_ms / 1000))


@dataclass(frozen=True)
class CellDef:
    name: str
    description: str
    fields: tuple[FieldSpec, ...]
    # In topological order.
    actions: tuple[ActionDef, ...]
    conflict: Conflict | None = None
    # The action whose output is the cell's part of its task's result ("": its sinks).
    result: str = ""
    # The longest a task with this cell may run, in seconds from its start: past it the
    # task ends FAILED, "deadline reached" (0: no limit; ADR-0103).
    max_duration_seconds: int = 0
    # The payload fields whose values become the task's labels (ADR-0110).
    labels: tuple[str, ...] = ()

    @property
    def result_actions(self) -> list[str]:
        """The actions whose outputs make the cell's part of its task's result."""
        return [self.result] if self.result else self.sinks

    @property
    def sinks(self) -> list[str]:
        """Actions nothing else in the cell depends on: the cell is done when these are."""
        needed = {dep for action in self.actions for dep in action.depends_on}
        return [a.name for a in self.actions if a.name not in needed]

    @property
    def roots(self) -> list[str]:
        return [a.name for a in self.actions if not a.depends_on]


@dataclass(frozen=True)
class Catalogue:
    cells: dict[str, CellDef] = field(default_factory=dict)
    downstreams: dict[str, Downstream] = field(default_factory=dict)
    # The queues the catalogue declares (a worker action's queue need not be declared:
    # then it has no limit).
    queues: dict[str, Queue] = field(default_factory=dict)

    def get(self, name: str) -> CellDef | None:
        return self.cells.get(name)

    @property
    def conflicts(self) -> dict[str, Conflict]:
        """The declared conflict of each cell that has one, by cell name."""
        return {name: c.conflict for name, c in self.cells.items() if c.conflict is not None}


def topological(names: list[str], deps: dict[str, tuple[str, ...] | list[str]]) -> list[str] | None:
    """Kahn's order of ``names`` (stable); ``None`` when the dependencies have a cycle."""
    remaining = {n: set(deps.get(n, ())) for n in names}
    order: list[str] = []
    while remaining:
        ready = [n for n in names if n in remaining and not remaining[n]]
        if not ready:
            return None
        for n in ready:
            order.append(n)
            del remaining[n]
        for pending in remaining.values():
            pending.difference_update(ready)
    return order


def _action(cell: str, name: str, raw: dict[str, Any]) -> ActionDef:
    where = f"cells.{cell}.actions.{name}"
    kind = raw.get("kind", "")
    if kind not in ACTION_KINDS:
        raise CatalogueError(f"{where}.kind: must be one of {ACTION_KINDS}, got {kind!r}")
    if kind == "http" and not (raw.get("downstream") and raw.get("path")):
        raise CatalogueError(f"{where}: an http action needs downstream and path")
    queue = str(raw.get("queue", ""))
    if kind == "worker" and not _NAME.fullmatch(queue):
        raise CatalogueError(
            f"{where}.queue: a worker action needs a queue (a letter, then letters, digits,"
            f" '_' or '-', at most 63), got {queue!r}"
        )
    if kind != "worker" and queue:
        raise CatalogueError(f"{where}.queue: only a worker action has a queue")
    output = _fields(f"{where}.output", raw.get("output"))
    wait = _wait(where, kind, raw, output)
    return ActionDef(
        name=name,
        kind=kind,
        downstream=str(raw.get("downstream", "")),
        method=str(raw.get("method", "POST")).upper(),
        path=str(raw.get("path", "")),
        probe_path=str(raw.get("probe_path", "")),
        idempotent=bool(raw.get("idempotent", False)),
        timeout_ms=int(raw.get("timeout_ms", 0)),
        depends_on=tuple(raw.get("depends_on", ())),
        max_effect_seconds=_positive_seconds(where, raw.get("max_effect_seconds", 0)),
        max_output_bytes=_output_limit(f"{where}.max_output_bytes", raw.get("max_output_bytes", 0)),
        output=output,
        queue=queue,
        **wait,
    )


_WAIT_KEYS = ("signal", "timeout_seconds", "on_timeout", "default_output", "choices")


def _wait(
    where: str, kind: str, raw: dict[str, Any], output: tuple[FieldSpec, ...]
) -> dict[str, Any]:
    """A wait action's own keys, checked: a signal name, a timeout in whole seconds, what
    the timeout does, the default output (``on_timeout: succeed``, as the output declares)
    and the named choices (each a payload as the output declares). Another kind has none."""
    if kind != "wait":
        stray = [k for k in _WAIT_KEYS if k in raw]
        if stray:
            raise CatalogueError(f"{where}.{stray[0]}: only a wait action has one")
        return {}
    signal = str(raw.get("signal", ""))
    if not _NAME.fullmatch(signal):
        raise CatalogueError(
            f"{where}.signal: a wait action needs a signal name (a letter, then letters,"
            f" digits, '_' or '-', at most 63), got {signal!r}"
        )
    timeout = raw.get("timeout_seconds")
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 0 < timeout <= 2**31 - 1:
        raise CatalogueError(
            f"{where}.timeout_seconds: a wait action needs a positive whole number of seconds,"
            f" got {timeout!r}"
        )
    on_timeout = str(raw.get("on_timeout", "fail"))
    if on_timeout not in ON_TIMEOUT:
        raise CatalogueError(f"{where}.on_timeout: must be one of {ON_TIMEOUT}, got {on_timeout!r}")
    default = raw.get("default_output")
    if on_timeout == "succeed":
        _declared_value(f"{where}.default_output", default, output)
    elif default is not None:
        raise CatalogueError(f"{where}.default_output: only with on_timeout: succeed")
    choices = raw.get("choices") or {}
    if not isinstance(choices, dict):
        raise CatalogueError(f"{where}.choices: must be a mapping of choice name to its payload")
    for name, payload in choices.items():
        if not _NAME.fullmatch(str(name)):
            raise CatalogueError(f"{where}.choices.{name}: bad choice name")
        _declared_value(f"{where}.choices.{name}", payload, output)
    return {
        "signal": signal,
        "timeout_seconds": timeout,
        "on_timeout": on_timeout,
        "default_output": default,
        "choices": tuple((str(n), p) for n, p in choices.items()),
    }


def _declared_value(where: str, value: Any, output: tuple[FieldSpec, ...]) -> None:
    """A payload the catalogue writes for a wait action: a JSON object, as its output's
    declared fields say."""
    if not isinstance(value, dict):
        raise CatalogueError(f"{where}: must be a JSON object")
    if (problem := declared_problem(value, output)) is not None:
        raise CatalogueError(f"{where}: {problem}")


def declared_problem(value: Any, output: tuple[FieldSpec, ...]) -> str | None:
    """Why ``value`` is not as the declared ``output`` fields say (None: it is)."""
    return fields_problem(value, tuple((f.name, f.type, f.required) for f in output))


def _fields(where: str, raw: Any) -> tuple[FieldSpec, ...]:
    """Declared fields (``name: {type: ..., required: ...}``, or ``name: type``)."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: must be a mapping of field name to its type")
    fields = []
    for fname, fraw in raw.items():
        spec = {"type": fraw} if isinstance(fraw, str) else (fraw or {})
        ftype = spec.get("type", "string")
        if ftype not in FIELD_TYPES:
            raise CatalogueError(f"{where}.{fname}.type: must be one of {FIELD_TYPES}")
        fields.append(FieldSpec(str(fname), ftype, bool(spec.get("required", False))))
    return tuple(fields)


def _output_limit(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OUTPUT_BYTES:
        raise CatalogueError(
            f"{where}: must be a number of bytes up to {MAX_OUTPUT_BYTES}, got {value!r}"
        )
    return value


def _positive_seconds(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CatalogueError(
            f"{where}.max_effect_seconds: must be a whole number of seconds, got {value!r}"
        )
    return value


def _resolved(action: ActionDef, downstreams: dict[str, Downstream], limit: int) -> ActionDef:
    """``action`` with its ``max_output_bytes`` (its own, else the catalogue's, else the
    default) and ``max_effect_seconds`` resolved (an http action's default from its call's
    timeout: its own, else its downstream's)."""
    if not action.max_output_bytes:
        action = dataclasses.replace(action, max_output_bytes=limit or DEFAULT_MAX_OUTPUT_BYTES)
    if action.kind == "worker" and not action.max_effect_seconds:
        timeout_ms = action.timeout_ms or DEFAULT_WORKER_TIMEOUT_MS
        return dataclasses.replace(
            action, max_effect_seconds=default_max_effect_seconds(timeout_ms)
        )
    if action.kind != "http" or action.max_effect_seconds:
        return action
    known = downstreams.get(action.downstream)
    timeout_ms = action.timeout_ms or (known.timeout_ms if known else Downstream.timeout_ms)
    return dataclasses.replace(action, max_effect_seconds=default_max_effect_seconds(timeout_ms))


def _conflict(cell: str, fields: tuple[FieldSpec, ...], raw: Any) -> Conflict | None:
    if raw is None:
        return None
    where = f"cells.{cell}.conflict"
    if not isinstance(raw, dict):
        raise CatalogueError(f"{where}: must be a mapping with key, effect and compensate")
    unknown = set(raw) - {"key", "effect", "compensate"}
    if unknown:
        raise CatalogueError(f"{where}: unknown keys {sorted(unknown)}")
    key = str(raw.get("key") or "")
    if key not in {f.name for f in fields}:
        raise CatalogueError(f"{where}.key: must name a field of the cell, got {key!r}")
    return Conflict(
        key=key, effect=str(raw.get("effect") or cell), compensate=str(raw.get("compensate", ""))
    )


def _cell(name: str, raw: dict[str, Any]) -> CellDef:
    if not _NAME.fullmatch(name):
        raise CatalogueError(f"cells.{name}: bad cell name")
    fields = list(_fields(f"cells.{name}.fields", raw.get("fields") or {}))
    actions = {a: _action(name, a, araw or {}) for a, araw in (raw.get("actions") or {}).items()}
    if not actions:
        raise CatalogueError(f"cells.{name}.actions: a cell needs at least one action")
    for action in actions.values():
        for dep in action.depends_on:
            if dep not in actions:
                raise CatalogueError(
                    f"cells.{name}.actions.{action.name}.depends_on: unknown action {dep!r}"
                )
    order = topological(list(actions), {a.name: a.depends_on for a in actions.values()})
    if order is None:
        raise CatalogueError(f"cells.{name}.actions: dependency cycle")
    for action in actions.values():
        _check_path_references(name, action, actions)
    result = str(raw.get("result", ""))
    if result and result not in actions:
        raise CatalogueError(f"cells.{name}.result: unknown action {result!r}")
    return CellDef(
        name,
        str(raw.get("description", "")),
        tuple(fields),
        tuple(actions[a] for a in order),
        _conflict(name, tuple(fields), raw.get("conflict")),
        result,
        _duration(f"cells.{name}.max_duration_seconds", raw.get("max_duration_seconds", 0)),
        _labels(f"cells.{name}.labels", tuple(fields), raw.get("labels")),
    )


def _labels(where: str, fields: tuple[FieldSpec, ...], raw: Any) -> tuple[str, ...]:
    """The payload fields a cell declares as labels: each a string or integer field of the
    cell whose name is a label key."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise CatalogueError(f"{where}: must be a list of field names")
    types = {f.name: f.type for f in fields}
    for name in raw:
        if types.get(name) not in ("string", "integer"):
            raise CatalogueError(f"{where}: {name!r} is not a string or integer field of the cell")
        if not LABEL_KEY.fullmatch(name):
            raise CatalogueError(f"{where}: {name!r} is not a label key (a-z, 0-9, '_', '.', '-')")
    return tuple(raw)


def _duration(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CatalogueError(f"{where}: must be a whole number of seconds, got {value!r}")
    return value


def upstream(action: str, actions: dict[str, ActionDef]) -> set[str]:
    """The actions of a cell that ``action`` waits for, directly or not."""
    seen: set[str] = set()
    todo = list(actions[action].depends_on)
    while todo:
        dep = todo.pop()
        if dep not in seen:
            seen.add(dep)
            todo.extend(actions[dep].depends_on)
    return seen


def _check_path_references(cell: str, action: ActionDef, actions: dict[str, ActionDef]) -> None:
    """A path may read the output of an action of its own cell that it waits for (by the
    action's name: the catalogue does not know the refs submissions give cells)."""
    for attr in ("path", "probe_path"):
        where = f"cells.{cell}.actions.{action.name}.{attr}"
        try:
            found = references.find(getattr(action, attr))
        except references.ReferenceError as error:
            raise CatalogueError(f"{where}: {error}") from None
        before = upstream(action.name, actions)
        for ref in found:
            if ref.node not in before:
                raise CatalogueError(
                    f"{where}: {ref.text} must name an action of cell {cell!r} that"
                    f" {action.name!r} depends on"
                )
            declared = actions[ref.node].output_names
            if declared and ref.field is not None and ref.field not in declared:
                raise CatalogueError(
                    f"{where}: {ref.text}: action {ref.node!r} declares no output field"
                    f" {ref.field!r}"
                )


def _downstream(name: str, raw: Any) -> Downstream:
    raw = raw or {}
    if not raw.get("base_url"):
        raise CatalogueError(f"downstreams.{name}.base_url is required")
    return Downstream(
        name=name,
        base_url=str(raw["base_url"]),
        timeout_ms=int(raw.get("timeout_ms", Downstream.timeout_ms)),
        max_concurrency=_whole(raw, "max_concurrency", Downstream.max_concurrency, name, 1),
        health_url=str(raw.get("health_url", "")),
        max_calls_per_second=_whole(raw, "max_calls_per_second", 0, name, 0),
        per_business=_per_business(name, raw),
    )


def _per_business(name: str, raw: dict[str, Any]) -> BusinessLimit:
    """A downstream's ``per_business`` limits: each at most the downstream's own, if set."""
    where = f"downstreams.{name}.per_business"
    given = raw.get("per_business")
    if given is None:
        return BusinessLimit()
    if not isinstance(given, dict) or not given or set(given) - set(_QUEUE_LIMITS):
        raise CatalogueError(f"{where}: a mapping with max_concurrency, max_calls_per_second")
    limits = []
    for key in _QUEUE_LIMITS:
        limit = _whole(given, key, 0, f"{name}.per_business", 0)
        whole = _whole(raw, key, getattr(Downstream, key), name, 0)
        if whole and limit > whole:
            raise CatalogueError(
                f"{where}.{key}: {limit} is more than the downstream's own {key} ({whole})"
            )
        limits.append(limit)
    return BusinessLimit(*limits)


def _whole(raw: dict[str, Any], key: str, default: int, name: str, least: int) -> int:
    """A downstream's limit ``key``: a whole number, at least ``least``."""
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise CatalogueError(
            f"downstreams.{name}.{key}: must be a whole number of at least {least}, got {value!r}"
        )
    return value


def _queue(name: str, raw: Any) -> Queue:
    where = f"queues.{name}"
    if not _NAME.fullmatch(name):
        raise CatalogueError(f"{where}: bad queue name")
    raw = raw or {}
    if not isinstance(raw, dict) or set(raw) - set(_QUEUE_LIMITS):
        raise CatalogueError(f"{where}: a mapping with max_concurrency, max_calls_per_second")
    limits = []
    for key in _QUEUE_LIMITS:
        limit = raw.get(key, 0)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise CatalogueError(
                f"{where}.{key}: must be a whole number of runs (0: no limit), got {limit!r}"
            )
        limits.append(limit)
    return Queue(name, *limits)


# A queue's limits, in the order Queue declares them.
_QUEUE_LIMITS = ("max_concurrency", "max_calls_per_second")


def parse_catalogue(data: dict[str, Any]) -> Catalogue:
    cells = data.get("cells") or {}
    if not isinstance(cells, dict):
        raise CatalogueError("cells: must be a mapping of cell name to definition")
    downstreams = data.get("downstreams") or {}
    if not isinstance(downstreams, dict):
        raise CatalogueError("downstreams: must be a mapping of downstream name to definition")
    known = {name: _downstream(name, raw) for name, raw in downstreams.items()}
    queues = data.get("queues") or {}
    if not isinstance(queues, dict):
        raise CatalogueError("queues: must be a mapping of queue name to definition")
    limit = _output_limit("max_output_bytes", data.get("max_output_bytes", 0))
    parsed = {name: _cell(name, raw or {}) for name, raw in cells.items()}
    catalogue = Catalogue(
        {
            name: dataclasses.replace(
                cell, actions=tuple(_resolved(a, known, limit) for a in cell.actions)
            )
            for name, cell in parsed.items()
        },
        known,
        {str(name): _queue(str(name), raw) for name, raw in queues.items()},
    )
    for name, conflict in catalogue.conflicts.items():
        if conflict.compensate and conflict.compensate not in catalogue.cells:
            raise CatalogueError(
                f"cells.{name}.conflict.compensate: unknown cell {conflict.compensate!r}"
            )
    return catalogue
