"""What the Catalogue page shows (ADR-0111): a version's cells with their owners and
actions, its downstreams, the versions with who made each, and the difference between two
versions, as plain values from the gateway's CatalogueService replies."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dispo.libs.api.gateway.v1 import catalogue_pb2 as cpb
from dispo.libs.catalogue.diff import document_diff


@dataclass(frozen=True)
class ActionRow:
    name: str
    kind: str
    target: str  # "demo POST /labels/{payload.id}", "queue tickets", "signal approve"
    depends_on: str


@dataclass(frozen=True)
class CellRow:
    name: str
    owner: str  # a business, or "shared"
    description: str
    fields: str
    actions: list[ActionRow]


@dataclass(frozen=True)
class DownstreamRow:
    name: str
    base_url: str
    timeout_ms: Any
    max_concurrency: Any


@dataclass(frozen=True)
class VersionRow:
    version: int
    parent: int
    author: str
    change: str
    created_at: datetime


def _target(raw: dict[str, Any]) -> str:
    kind = raw.get("kind", "")
    if kind == "http":
        method = str(raw.get("method", "POST")).upper()
        return f"{raw.get('downstream', '')} {method} {raw.get('path', '')}"
    if kind == "worker":
        return f"queue {raw.get('queue', '')}"
    if kind == "wait":
        return f"signal {raw.get('signal', '')}"
    return ""


def document(version: cpb.CatalogueVersion) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(version.document_json or "{}")
    return found


def cell_rows(version: cpb.CatalogueVersion) -> list[CellRow]:
    rows = []
    for name, raw in sorted((document(version).get("cells") or {}).items()):
        raw = raw or {}
        actions = [
            ActionRow(
                a,
                str((araw or {}).get("kind", "")),
                _target(araw or {}),
                ", ".join((araw or {}).get("depends_on") or ()),
            )
            for a, araw in (raw.get("actions") or {}).items()
        ]
        rows.append(
            CellRow(
                name,
                version.owners.get(name) or "shared",
                str(raw.get("description", "")),
                ", ".join(raw.get("fields") or {}),
                actions,
            )
        )
    return rows


def catalogue_downstream_rows(version: cpb.CatalogueVersion) -> list[DownstreamRow]:
    return [
        DownstreamRow(
            name,
            str((raw or {}).get("base_url", "")),
            (raw or {}).get("timeout_ms", "—"),
            (raw or {}).get("max_concurrency", "—"),
        )
        for name, raw in sorted((document(version).get("downstreams") or {}).items())
    ]


def version_rows(versions: list[cpb.CatalogueVersion]) -> list[VersionRow]:
    return [
        VersionRow(v.version, v.parent, v.author, v.change, v.created_at.ToDatetime(tzinfo=UTC))
        for v in versions
    ]


def version_diff(old: cpb.CatalogueVersion, new: cpb.CatalogueVersion) -> list[str]:
    """The unified diff from ``old`` to ``new`` (their documents as YAML)."""
    return document_diff(
        document(old), document(new), f"version {old.version}", f"version {new.version}"
    )
