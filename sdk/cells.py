"""Typed builders for the cells of the shipped content governance catalogue.

Each returns a :class:`~dispo.sdk.CellSpec`; chain ``.named(ref)`` to use a cell twice
and ``.after(other)`` to order cells. Cells of other catalogues: :func:`dispo.sdk.cell`.
"""

from __future__ import annotations

from dispo.sdk._types import CellSpec, cell


def update_quality_level(content_id: str, level: int, reason: str | None = None) -> CellSpec:
    """Set a content item's quality label, then record the audit trail."""
    return cell("update_quality_level", content_id=content_id, level=level, reason=reason)


def start_review(content_id: str, queue: str | None = None) -> CellSpec:
    """Open a manual review ticket."""
    return cell("start_review", content_id=content_id, queue=queue)


def notify_owner(owner_id: str, message: str) -> CellSpec:
    """Tell the content owner what happened."""
    return cell("notify_owner", owner_id=owner_id, message=message)


def noop() -> CellSpec:
    """A cell that succeeds without calling anything (benchmarks, examples)."""
    return cell("noop")
