"""The one page-token codec: a token carries the last row's sort key and only that; anything
else is INVALID_ARGUMENT on page.page_token."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from dispo.libs.errors import InvalidArgument
from dispo.libs.paging import TOKEN_FIELD, decode_page_token, encode_page_token

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
        for root in ("services", "libs")
        for path in sorted((REPO_ROOT / root).rglob("*.py"))
        if path.name != "paging.py"
        and "libs/api" not in path.as_posix()
        and "page_token" in (text := path.read_text())
        and ("b64" in text or "int(request.page_token" in text)
    ]
    assert copies == []
