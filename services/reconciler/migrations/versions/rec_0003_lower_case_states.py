"""Stored enum values are lower-case (ADR 0017): the data, the CHECKs and the partial
indexes that name a state, together. The task and node statuses the reconciler copies
from envelopes (completions.status, findings.recorded_status) follow the same rule.

Revision ID: rec_0003
Revises: rec_0002
"""

from alembic import op
from dispo.libs.db.checks import enum_recase_sql

revision = "rec_0003"
down_revision = "rec_0002"
branch_labels = None
depends_on = None

CHECKED = (
    (
        "recovery_tasks",
        "state",
        "ck_recovery_state",
        (
            "parked_failed",
            "awaiting_settlement",
            "awaiting_decision",
            "demoted",
            "redriven",
            "resolved",
            "failed",
            "abandoned",
        ),
    ),
    (
        "completions",
        "notify_state",
        "ck_completion_notify",
        ("none", "pending", "delivered", "gave_up"),
    ),
    (
        "completions",
        "reconcile_state",
        "ck_completion_reconcile",
        ("pending", "matched", "mismatch", "not_sampled", "nothing_to_probe"),
    ),
    ("claims", "state", "ck_claim_state", ("open", "won", "lost", "uncontested")),
    ("settlements", "method", "ck_settlement_method", ("probe", "idempotent_rerun", "operator")),
    ("settlements", "outcome", "ck_settlement_outcome", ("succeeded", "pending")),
    ("compensations", "state", "ck_compensation_state", ("pending", "submitted", "failed")),
)
UNCHECKED = (("completions", "status"), ("findings", "recorded_status"))
# Partial indexes whose predicate names a state: (name, table, column, predicate column, state).
INDEXES = (
    ("recovery_tasks_due", "recovery_tasks", "next_redrive_at", "state", "parked_failed"),
    ("completions_notify_due", "completions", "notify_next_at", "notify_state", "pending"),
    ("completions_reconcile_due", "completions", "reconcile_next_at", "reconcile_state", "pending"),
    ("compensations_due", "compensations", "next_at", "state", "pending"),
)


def _apply(case: str) -> None:
    for name, *_ in INDEXES:
        op.execute(f"DROP INDEX {name}")
    for table, column, constraint, values in CHECKED:
        cased = [getattr(v, case)() for v in values]
        for statement in enum_recase_sql(table, column, constraint, cased, case=case):
            op.execute(statement)
    for table, column in UNCHECKED:
        op.execute(f"UPDATE {table} SET {column} = {case}({column})")
    for name, table, column, where, state in INDEXES:
        value = getattr(state, case)()
        op.execute(f"CREATE INDEX {name} ON {table} ({column}) WHERE {where} = '{value}'")


def upgrade() -> None:
    _apply("lower")


def downgrade() -> None:
    _apply("upper")
