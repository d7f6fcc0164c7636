"""An index to find tasks by priority (ListTasks, CountTasks and CancelByFilter's
``priorities``): by business, priority and creation, over the tasks not at the default
priority 3 alone. A Submit at the default priority writes no entry in it, and a task's
priority never changes, so a status update stays HOT (ADR-0110's reasoning for the labels).

Revision ID: 0021
Revises: 0020
"""

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_tasks_priority ON tasks (business, priority, created_at, task_id)"
        " WHERE priority <> 3"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_tasks_priority")
