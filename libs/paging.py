"""One page-token codec for every list RPC.

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

from dispo.libs.errors import InvalidArgument

TOKEN_FIELD = "page.page_token"
KeyPart = str | int | datetime


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


__all__ = ["TOKEN_FIELD", "decode_page_token", "encode_page_token", "invalid_page_token"]
