"""A task's priority (ADR-0109): 1 (highest) to 5 within its business's share, 3 when the
Submit gave none; ListTasks shows it. Tasks accepted before it are 3.

Revision ID: 0016
Revises: 0014
"""

from alembic import op

revision = "0016"
down_revision = "gateway_cat"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE tasks ADD COLUMN priority smallint NOT NULL DEFAULT 3"
        " CONSTRAINT tasks_priority_check CHECK (priority BETWEEN 1 AND 5)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE tasks DROP COLUMN priority")
