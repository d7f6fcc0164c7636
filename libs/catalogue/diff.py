"""The difference between two catalogue documents, as people review it: a unified diff of
their YAML (what `dispo catalogue apply` shows before it applies a file, and
what the console shows between two versions)."""

from __future__ import annotations

import difflib
from typing import Any

import yaml


def document_yaml(document: dict[str, Any]) -> str:
    """A catalogue document as YAML, its keys in their order (a cell's actions and a wait's
    choices are in the author's): what `dispo catalogue export` prints."""
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False)


def document_diff(
    old: dict[str, Any], new: dict[str, Any], old_label: str = "old", new_label: str = "new"
) -> list[str]:
    """The lines of a unified diff from ``old`` to ``new`` (empty: the same catalogue)."""
    return list(
        difflib.unified_diff(
            document_yaml(old).splitlines(),
            document_yaml(new).splitlines(),
            old_label,
            new_label,
            lineterm="",
        )
    )
