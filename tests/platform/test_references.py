"""References to an upstream node's output (:mod:`dispo.libs.references`): found, checked,
written with full node ids, and resolved against recorded outputs."""

import pytest
from dispo.libs import references as refs
from dispo.libs.references import MissingOutput, Reference, ReferenceError

OUTPUTS = {
    "review.open_ticket": {"ticket_id": "T-7", "count": 3, "labels": ["a", "b/c"], "ok": True},
    "review.empty": {},
}


def test_references_are_found_with_their_node_and_key_path():
    assert refs.find("/t/{nodes.open_ticket.output.ticket_id}/{nodes.a.b.output}") == [
        Reference("open_ticket", ("ticket_id",), "{nodes.open_ticket.output.ticket_id}"),
        Reference("a.b", (), "{nodes.a.b.output}"),
    ]
    # The node part is the shortest that is followed by .output: a key may be "output".
    [ref] = refs.find("{nodes.review.open_ticket.output.output.labels.1}")
    assert (ref.node, ref.keys, ref.field) == (
        "review.open_ticket",
        ("output", "labels", 1),
        "output",
    )
    assert refs.find("no reference, {task_id} neither") == []


@pytest.mark.parametrize(
    "text",
    [
        "{nodes.a}",
        "{nodes.a.outputs.x}",
        "{nodes..output}",
        "{nodes.a.output.}",
        "{nodes.a.output.x y}",
    ],
)
def test_a_malformed_reference_is_refused(text):
    with pytest.raises(ReferenceError, match=r"\{nodes.<node>.output"):
        refs.find(text)


def test_references_in_a_payload_are_named_by_where_they_are():
    payload = {"ticket": "{nodes.r.a.output.id}", "tags": ["x", "{nodes.r.b.output}"], "n": 1}
    assert [(where, ref.node) for where, ref in refs.in_value(payload)] == [
        ("ticket", "r.a"),
        ("tags[1]", "r.b"),
    ]
    with pytest.raises(ReferenceError, match=r"^deep.er\[0\]: "):
        list(refs.in_value({"deep": {"er": ["{nodes.x}"]}}))


def test_a_reference_is_rewritten_with_the_node_s_full_id():
    full = {"open_ticket": "review.open_ticket"}.get
    text = "/t/{nodes.open_ticket.output.id}/{nodes.other.send.output}"
    assert refs.rewrite(text, lambda node: full(node) or node) == (
        "/t/{nodes.review.open_ticket.output.id}/{nodes.other.send.output}"
    )
    value = {"a": ["{nodes.open_ticket.output}"], "b": 2}
    assert refs.rewrite_value(value, lambda n: full(n) or n) == {
        "a": ["{nodes.review.open_ticket.output}"],
        "b": 2,
    }


def test_a_whole_value_reference_keeps_its_type_and_an_embedded_one_becomes_text():
    payload = {
        "count": "{nodes.review.open_ticket.output.count}",
        "ok": "{nodes.review.open_ticket.output.ok}",
        "labels": "{nodes.review.open_ticket.output.labels}",
        "message": "ticket {nodes.review.open_ticket.output.ticket_id} has"
        " {nodes.review.open_ticket.output.labels}",
        "second": ["{nodes.review.open_ticket.output.labels.1}"],
        "kept": "{task_id}",
    }
    assert refs.resolve_value(payload, OUTPUTS) == {
        "count": 3,
        "ok": True,
        "labels": ["a", "b/c"],
        "message": 'ticket T-7 has ["a","b/c"]',
        "second": ["b/c"],
        "kept": "{task_id}",
    }


def test_a_path_reference_is_one_encoded_segment():
    path = "/tickets/{nodes.review.open_ticket.output.labels.1}/{nodes.review.open_ticket.output.count}"
    assert refs.resolve_path(path, OUTPUTS) == "/tickets/b%2Fc/3"
    with pytest.raises(MissingOutput, match="cannot stand in the action's path"):
        refs.resolve_path("/{nodes.n.output.d}", {"n": {"d": ".."}})


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{nodes.review.gone.output.x}", "node review.gone recorded no output"),
        ("{nodes.review.empty.output.x}", "the output of node review.empty has no 'x'"),
        (
            "{nodes.review.open_ticket.output.labels.5}",
            "the output.labels of node review.open_ticket has no 5",
        ),
        (
            "{nodes.review.open_ticket.output.ticket_id.x}",
            "the output.ticket_id of node review.open_ticket has no 'x'",
        ),
    ],
)
def test_a_reference_the_outputs_cannot_answer_names_what_is_missing(text, reason):
    with pytest.raises(MissingOutput) as missing:
        refs.resolve_value({"v": text}, OUTPUTS)
    assert missing.value.reason == reason and str(missing.value) == f"{text}: {reason}"
