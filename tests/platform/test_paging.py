"""One page-size rule and one page-token codec: a token carries the last row's sort key and only that; anything
else is INVALID_ARGUMENT on page.page_token."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.errors import InvalidArgument
from dispo.libs.paging import (
    DEFAULT_PAGE_SIZE,
    SIZE_FIELD,
    TOKEN_FIELD,
    decode_page_token,
    encode_page_token,
    page_size,
    page_size_violation,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
AT = datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=UTC)


def test_a_key_comes_back_as_it_went_in():
    token = encode_page_token(AT, "task-é|1", 7)
    assert decode_page_token(token, datetime, str, int) == (AT, "task-é|1", 7)
    assert token.isascii() and not set(token) & set("+/")  # URL-safe text
    offset = datetime(2026, 3, 1, 14, 30, tzinfo=timezone(timedelta(hours=2)))
    assert decode_page_token(encode_page_token(offset), datetime) == (offset,)


def test_the_empty_token_is_the_first_page():
    assert decode_page_token("", datetime, str) is None


@pytest.mark.parametrize(
    "token",
    [
        "garbage!",  # not base64
        base64.urlsafe_b64encode(b"not json").decode(),
        base64.urlsafe_b64encode(b'{"a": 1}').decode(),  # not a key
        encode_page_token(AT),  # a key of another list: too short
        encode_page_token(AT, "t-1", "extra"),  # too long
        encode_page_token("yesterday", "t-1"),  # not a time
        encode_page_token(5, "t-1"),
        encode_page_token(AT, 5),  # not a string
    ],
)
def test_a_token_this_list_did_not_make_names_the_field(token):
    with pytest.raises(InvalidArgument) as refused:
        decode_page_token(token, datetime, str)
    assert [v.field for v in refused.value.violations] == [TOKEN_FIELD]


def test_an_integer_part_refuses_other_json_numbers_and_booleans():
    for value in (1.5, True, "3"):
        with pytest.raises(InvalidArgument):
            decode_page_token(encode_page_token(value), int)


def test_no_service_spells_its_own_token_encoding():
    copies = [
        str(path.relative_to(REPO_ROOT))
        for root in ("services", "libs", "sdk", "tools")
        for path in sorted((REPO_ROOT / root).rglob("*.py"))
        if path.name != "paging.py"
        and "libs/api" not in path.as_posix()
        and "page_token" in (text := path.read_text())
        and ("b64" in text or "int(request.page_token" in text)
    ]
    assert copies == []


def test_the_page_size_defaults_is_capped_and_refuses_a_negative_size():
    assert page_size(common_pb2.PageRequest(), maximum=500) == DEFAULT_PAGE_SIZE == 50
    assert page_size(common_pb2.PageRequest(page_size=7), maximum=500) == 7
    assert page_size(common_pb2.PageRequest(page_size=9000), maximum=500) == 500
    with pytest.raises(InvalidArgument) as refused:
        page_size(common_pb2.PageRequest(page_size=-1), maximum=500)
    assert [v.field for v in refused.value.violations] == [SIZE_FIELD] == ["page.page_size"]
    assert page_size_violation(common_pb2.PageRequest(page_size=3)) is None
