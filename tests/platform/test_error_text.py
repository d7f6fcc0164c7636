"""Stored error text: one limit, one behaviour, in every service."""

from __future__ import annotations

import re
from pathlib import Path

from dispo.libs.error_text import ERROR_TEXT_LIMIT, truncate_error

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_error_text_is_cut_to_exactly_the_first_500_characters():
    assert ERROR_TEXT_LIMIT == 500
    long = "".join(chr(ord("a") + i % 26) for i in range(900))
    assert truncate_error(long) == long[:500]
    assert truncate_error("x" * 500) == "x" * 500
    assert truncate_error("short") == "short"
    assert truncate_error("") == ""


def test_no_service_cuts_text_by_hand():
    """Every stored error goes through ``truncate_error``: no slice to the limit elsewhere."""
    by_hand = re.compile(r"\[:\s*(500|ERROR_\w*LIMIT)\s*\]|ERROR_LIMIT\s*=")
    offenders = [
        f"{path.relative_to(REPO_ROOT)}:{number}"
        for root in ("services", "libs", "sdk", "tools")
        for path in sorted((REPO_ROOT / root).rglob("*.py"))
        if path.name != "error_text.py" and "libs/api" not in path.as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert offenders == []
