"""Labels: what a task is about, to find it by (ADR-0110). Pure: no I/O.

A task's labels are the pairs its Submit gave and those its cells' payloads gave (the fields
a catalogue cell declares under ``labels``). Keys and values are checked here, for a Submit
and for a filter alike; every refusal names ``labels.<key>``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dispo.libs.catalogue import Catalogue
from dispo.libs.errors import FieldViolation, InvalidArgument
from dispo.libs.validation import LABEL_KEY

MAX_VALUE_LENGTH = 128
MAX_LABELS = 16


def _shown(key: str) -> str:
    """A key as a field name shows it: a refused key may be long or odd; cut it short."""
    return key if len(key) <= 64 else key[:64] + "…"


def label_problem(key: str, value: str) -> str | None:
    """Why ``key=value`` cannot be a label (None: it can)."""
    if not LABEL_KEY.fullmatch(key):
        return "a label key is 1 to 63 of a-z, 0-9, '_', '.', '-', starting with a letter or digit"
    if len(value) > MAX_VALUE_LENGTH:
        return f"a label value is at most {MAX_VALUE_LENGTH} characters"
    if not value.isprintable():
        return "a label value is printable characters only"
    return None


def checked(labels: Mapping[str, str], field: str = "labels") -> dict[str, str]:
    """``labels`` once every pair may be a label and there are at most
    :data:`MAX_LABELS`; INVALID_ARGUMENT naming ``<field>.<key>`` (or ``field``) otherwise."""
    bad = [
        FieldViolation(f"{field}.{_shown(k)}", problem)
        for k, v in labels.items()
        if (problem := label_problem(k, v)) is not None
    ]
    if bad:
        raise InvalidArgument(violations=bad)
    if len(labels) > MAX_LABELS:
        raise InvalidArgument(field, f"at most {MAX_LABELS} labels, not {len(labels)}")
    return dict(labels)


def _label_value(value: Any) -> str | None:
    """A payload value as a label's value: a string as it is, an integer in decimal."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str | int):
        return str(value)
    return None


def task_labels(
    given: Mapping[str, str],
    cells: Sequence[tuple[str, Mapping[str, Any]]],
    catalogue: Catalogue,
) -> dict[str, str]:
    """The labels of a task: ``given`` (checked) and, for each (cell name, payload) of its
    cells, the payload fields its cell declares as labels. A key given two values (by the
    Submit and a cell, or by two cells) is INVALID_ARGUMENT naming ``labels.<key>``; a
    derived value that cannot be a label names the payload field."""
    out = checked(given)
    bad: list[FieldViolation] = []
    for i, (name, payload) in enumerate(cells):
        cell = catalogue.get(name)
        if cell is None:
            continue
        for key in cell.labels:
            if key not in payload:
                continue
            value = _label_value(payload[key])
            where = f"cells[{i}].payload.{key}"
            if value is None:
                bad.append(FieldViolation(where, "a label field is a string or an integer"))
                continue
            if (problem := label_problem(key, value)) is not None:
                bad.append(FieldViolation(where, problem))
                continue
            if out.setdefault(key, value) != value:
                bad.append(
                    FieldViolation(
                        f"labels.{key}",
                        f"given {out[key]!r}, and {value!r} by {where} (cell {name!r} declares"
                        f" {key!r} a label)",
                    )
                )
    if bad:
        raise InvalidArgument(violations=bad)
    if len(out) > MAX_LABELS:
        raise InvalidArgument(
            "labels", f"at most {MAX_LABELS} labels, not {len(out)} (with the cells' own)"
        )
    return out
