"""The wire contracts are declared once (dispo.libs.contracts) and the shared outbox holds
every publisher to them (tests/platform/test_outbox.py: an undeclared subject is refused
before anything is written)."""

from __future__ import annotations

import pytest
from dispo.libs import contracts
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.contracts import evaluations, tasks

TS = common_pb2.TaskStatus


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("task.create", "task.create", True),
        ("task.create", "task.created", False),
        ("task.create", "task", False),
        ("task.status.>", "task.status.abc", True),
        ("task.status.>", "task.status.a.b", True),
        ("task.status.>", "task.status", False),
        ("task.status.>", "task.status.", False),
        ("pool.*.x", "pool.a.x", True),
        ("pool.*.x", "pool.a.b.x", False),
    ],
)
def test_subjects_match_as_nats_matches_them(pattern, subject, matches):
    assert contracts.subject_matches(pattern, subject) is matches


def test_every_subject_the_services_publish_is_declared():
    published = [
        tasks.TASK_CREATE,
        tasks.TASK_FAIL,
        tasks.TASK_DEMOTE,
        tasks.TASK_CANCEL,
        tasks.TASK_CLOSE,
        tasks.task_status("0123abcd", TS.TASK_STATUS_RUNNING),
        tasks.task_status("0123abcd", TS.TASK_STATUS_SUCCEEDED),
        "callbacks.orders.done",
        evaluations.EVALUATION_STARTED,
        evaluations.EVALUATION_RUN_RECORDED,
        evaluations.EVALUATION_COMPLETED,
    ]
    assert [s for s in published if not contracts.declared(s)] == []
    # pool.wake.<id> is core NATS, outside every stream: no outbox may write it.
    assert not contracts.declared(evaluations.pool_wake("c1"))


def test_message_ids_name_the_fact_they_carry():
    assert tasks.create_id("t1", 0) == "t1"
    assert tasks.create_id("t1", 3) == "t1:g3"
    assert tasks.fail_id("t1", 3) == "t1:fail:g3"
    assert tasks.demote_id("t1", 3) == "t1:demote:g3"
    assert tasks.cancel_id("t1") == "t1:cancel"
    assert tasks.cancel_id("t1", "abandon") == "t1:cancel:abandon"
    assert tasks.status_id("t1", 7) == "t1:v7"
    assert tasks.status_id("t1", 7, "reconciler") == "t1:reconciler:v7"
    assert tasks.close_id("t1", 3) == "t1:close:g3"
    assert evaluations.started_id("e1") == "e1:started"
    assert evaluations.completed_id("e1") == "e1:completed"
    ids = {
        tasks.create_id("t1", 1),
        tasks.fail_id("t1", 1),
        tasks.demote_id("t1", 1),
        tasks.cancel_id("t1"),
        tasks.close_id("t1", 1),
        tasks.status_id("t1", 1),
    }
    assert len(ids) == 6  # no two facts of one task share an id


async def test_streams_are_created_with_their_declared_settings(bus):
    for stream in contracts.STREAMS:
        await stream.ensure(bus)
        info = await bus.js.stream_info(stream.name)
        assert sorted(info.config.subjects or []) == sorted(stream.subjects)
        assert info.config.max_age == stream.max_age or (
            stream.max_age is None and not info.config.max_age
        )
        assert info.config.duplicate_window == stream.duplicate_window


@pytest.mark.parametrize("status", [s for s in TS.values() if s != TS.TASK_STATUS_UNSPECIFIED])
def test_status_subjects_name_the_status_and_the_terminal_filters_take_the_terminal_ones(status):
    subject = tasks.task_status("t1", status)
    assert contracts.declared(subject)
    assert contracts.subject_matches(tasks.task_status_of("t1"), subject)
    assert not contracts.subject_matches(tasks.task_status_of("t2"), subject)
    terminal = [f for f in tasks.TASK_STATUS_TERMINAL if contracts.subject_matches(f, subject)]
    assert len(terminal) == (1 if status in tasks.TERMINAL_TASK_STATUSES else 0)
