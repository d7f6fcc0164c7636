"""The drift planner on hand-made views (pure)."""

from dispo.libs.repairs import RepairKind
from dispo.reconciler.drift.planner import DbCron, View, plan_repairs

IDLE = {"status": "idle", "eval_id": ""}


def test_consistent_view_needs_no_repair():
    view = View(
        "local",
        {"a": DbCron("a", "idle", ""), "b": DbCron("b", "busy", "ev")},
        {"a": IDLE, "b": {"status": "busy", "eval_id": "ev"}},
        {"ev": ("executing", "b")},
    )
    assert plan_repairs(view) == []


def test_each_kind_is_planned_with_a_reason():
    view = View(
        "openclaw",
        {
            "missing": DbCron("missing", "idle", ""),
            "done": DbCron("done", "busy", "finished"),
            "idle": DbCron("idle", "idle", ""),
            "lost": DbCron("lost", "busy", "ev-lost"),
            "odd": DbCron("odd", "idle", ""),
            "stuck": DbCron("stuck", "stuck", ""),
        },
        {
            "orphan": IDLE,
            "done": {"status": "busy", "eval_id": "finished"},
            "idle": IDLE,
            "lost": IDLE,
            "odd": {"status": "busy", "eval_id": "ghost"},
        },
        {
            "finished": ("completed", ""),
            "ev-idle": ("executing", "idle"),
            "ev-lost": ("executing", "lost"),
        },
    )
    plan = [(p.kind, p.cron_id, p.evaluation_id) for p in plan_repairs(view)]
    assert plan == [
        (RepairKind.REMOVE_ORPHAN, "orphan", ""),
        (RepairKind.RECREATE_MISSING, "missing", ""),
        (RepairKind.RELEASE_FINISHED, "done", "finished"),
        (RepairKind.REQUEUE_EVALUATION, "idle", "ev-idle"),
        (RepairKind.REQUEUE_EVALUATION, "lost", "ev-lost"),
        (RepairKind.REWRITE_STATE, "odd", ""),
    ]
    reasons = {p.cron_id: p.reason for p in plan_repairs(view)}
    assert "openclaw has cron orphan" in reasons["orphan"]
    assert "which is idle in the database" in reasons["idle"]
    assert "whose openclaw state is idle" in reasons["lost"]
