"""The idempotency hash of a Submit: stored with every task, so its bytes must not change —
a retry after an upgrade would otherwise be refused as a different request."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, fields
from datetime import UTC

from dispo.gateway.expand import CellRequest, Submission
from dispo.gateway.operations import request_hash
from dispo.libs.contracts.tasks import DEFAULT_PRIORITY
from dispo.libs.payload import canonical_json
from hypothesis import given
from hypothesis import strategies as st

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=10,
)
cells = st.builds(
    CellRequest,
    cell=text,
    ref=text,
    payload=st.dictionaries(text, json_values, max_size=4),
    depends_on=st.lists(text, max_size=3),
)
submissions = st.builds(
    Submission,
    business=text,
    cells=st.lists(cells, max_size=4),
    idempotency_key=text,
    callback_url=text,
    labels=st.dictionaries(text, text, max_size=3),
    priority=st.integers(1, 5),
)


def _document(sub: Submission) -> dict:
    """The request as hashed: a delayed start and a deadline only when asked, as ISO 8601
    in UTC, labels only when given and a priority only when not the default (the hashes of
    requests without them are those stored before they existed)."""
    whole = asdict(sub)
    if not whole["labels"]:
        del whole["labels"]
    if whole["priority"] == DEFAULT_PRIORITY:
        del whole["priority"]
    for name in ("not_before", "deadline"):
        moment = whole.pop(name)
        if moment is not None:
            whole[name] = moment.astimezone(UTC).isoformat()
    return whole


@given(submissions)
def test_the_hash_is_that_of_the_whole_request_in_canonical_json(sub):
    assert request_hash(sub) == hashlib.sha256(canonical_json(_document(sub))).hexdigest()


@given(
    submissions,
    st.none() | st.datetimes(timezones=st.just(UTC)),
    st.none() | st.datetimes(timezones=st.just(UTC)),
)
def test_a_start_and_a_deadline_are_part_of_the_request(sub, not_before, deadline):
    sub.not_before, sub.deadline = not_before, deadline
    assert request_hash(sub) == hashlib.sha256(canonical_json(_document(sub))).hexdigest()


def test_a_known_request_keeps_its_stored_hash():
    sub = Submission(
        business="shop",
        cells=[CellRequest(cell="noop", ref="a", payload={"b": [1, 2.5], "a": "é"})],
        idempotency_key="k-1",
        callback_url="",
    )
    assert request_hash(sub) == (
        hashlib.sha256(
            b'{"business":"shop","callback_url":"","cells":[{"cell":"noop","depends_on":[],'
            b'"payload":{"a":"\xc3\xa9","b":[1,2.5]},"ref":"a"}],"idempotency_key":"k-1"}'
        ).hexdigest()
    )


def test_every_field_of_a_request_is_hashed():
    """The hash is written out field by field: a field added to either dataclass must be
    added to it (and this list) deliberately."""
    assert [f.name for f in fields(Submission)] == [
        "business",
        "cells",
        "idempotency_key",
        "callback_url",
        "not_before",
        "deadline",
        "labels",
        "priority",
    ]
    assert [f.name for f in fields(CellRequest)] == ["cell", "ref", "payload", "depends_on"]
