"""Stored task and node states are lower-case (ADR 0017): the data and the CHECKs together.

Revision ID: 0002
Revises: 0001
"""

from alembic import op
from dispo.libs.db.checks import enum_recase_sql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TASK_STATES = (
    "accepted",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "retry_exhausted",
    "demoted",
)
NODE_STATES = (
    "pending",
    "running",
    "succeeded",
    "failed",
    "unknown",
    "dependency_failed",
    "demoted",
    "cancelled",
)
COLUMNS = (
    ("task_runs", "status", "ck_task_run_status", TASK_STATES),
    ("node_runs", "status", "ck_node_run_status", NODE_STATES),
)


def upgrade() -> None:
    for table, column, constraint, values in COLUMNS:
        for statement in enum_recase_sql(table, column, constraint, values, case="lower"):
            op.execute(statement)


def downgrade() -> None:
    for table, column, constraint, values in COLUMNS:
        upper = [v.upper() for v in values]
        for statement in enum_recase_sql(table, column, constraint, upper, case="upper"):
            op.execute(statement)
