"""Stored task statuses are lower-case (ADR 0017): the data and the CHECK together.

Revision ID: 0003
Revises: 0002
"""

from alembic import op
from dispo.libs.db.checks import enum_recase_sql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

STATUSES = ("accepted", "running", "succeeded", "failed", "cancelled", "retry_exhausted", "demoted")


def upgrade() -> None:
    for statement in enum_recase_sql("tasks", "status", "ck_task_status", STATUSES, case="lower"):
        op.execute(statement)


def downgrade() -> None:
    upper = [s.upper() for s in STATUSES]
    for statement in enum_recase_sql("tasks", "status", "ck_task_status", upper, case="upper"):
        op.execute(statement)
