"""Pages of every list RPC: one page-size rule and one page-token codec.

A page holds ``page.page_size`` rows (0: :data:`DEFAULT_PAGE_SIZE`), at most the list's
maximum; a negative size is ``INVALID_ARGUMENT`` on ``page.page_size``.

A token is the sort key of the last row a page returned (strings, integers, aware
datetimes), as URL-safe base64 of compact JSON. It is opaque to callers; a token this
codec did not make, or one for another list, is refused with ``INVALID_ARGUMENT`` naming
``page.page_token``, never answered with ``INTERNAL``::

    after = decode_page_token(request.page.page_token, datetime, str)   # None: first page
    ...
    next_token = encode_page_token(last.created_at, last.task_id)
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.errors import FieldViolation, InvalidArgument

TOKEN_FIELD = "page.page_token"
SIZE_FIELD = "page.page_size"
DEFAULT_PAGE_SIZE = 50
KeyPart = str | int | datetime


def page_size_violation(page: common_pb2.PageRequest) -> FieldViolation | None:
    """What is wrong with the requested size, for a request that collects its violations."""
    return FieldViolation(SIZE_FIELD, "must not be negative") if page.page_size < 0 else None


def page_size(
    page: common_pb2.PageRequest, *, maximum: int, default: int = DEFAULT_PAGE_SIZE
) -> int:
    """Rows the page holds: the requested size (0: ``default``), at most ``maximum``."""
    violation = page_size_violation(page)
    if violation is not None:
        raise InvalidArgument(violations=[violation])
    return min(page.page_size or default, maximum)


def encode_page_token(*key: KeyPart) -> str:
    """The token of the page after the row whose sort key is ``key``."""
    parts = [part.isoformat() if isinstance(part, datetime) else part for part in key]
    raw = json.dumps(parts, separators=(",", ":"), ensure_ascii=False)
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_page_token(token: str, *kinds: type) -> tuple[Any, ...] | None:
    """The key in ``token``, each part checked to be of its kind (``str``, ``int`` or
    ``datetime``); ``None`` for the empty token (the first page)."""
    if not token:
        return None
    try:
        parts = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, binascii.Error):
        raise invalid_page_token() from None
    if not isinstance(parts, list) or len(parts) != len(kinds):
        raise invalid_page_token()
    return tuple(_part(value, kind) for value, kind in zip(parts, kinds, strict=True))


def invalid_page_token() -> InvalidArgument:
    return InvalidArgument(TOKEN_FIELD, "not a token from a previous response")


def _part(value: object, kind: type) -> KeyPart:
    if kind is datetime:
        if not isinstance(value, str):
            raise invalid_page_token()
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise invalid_page_token() from None
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    if kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise invalid_page_token()
        return value
    if kind is str:
        if not isinstance(value, str):
            raise invalid_page_token()
        return value
    raise TypeError(f"a page token holds str, int or datetime, not {kind.__name__}")


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "SIZE_FIELD",
    "TOKEN_FIELD",
    "decode_page_token",
    "encode_page_token",
    "invalid_page_token",
    "page_size",
    "page_size_violation",
]
