"""Error text as stored: at most :data:`ERROR_TEXT_LIMIT` characters, cut in one place.

Every service that records an error, a reason or a failure detail in a row, an envelope or
an audit record passes it through :func:`truncate_error`; the columns that hold such text
may refuse anything longer.
"""

from __future__ import annotations

ERROR_TEXT_LIMIT = 500


def truncate_error(text: str) -> str:
    """``text`` cut to its first :data:`ERROR_TEXT_LIMIT` characters (shorter text unchanged)."""
    return text[:ERROR_TEXT_LIMIT]


__all__ = ["ERROR_TEXT_LIMIT", "truncate_error"]
