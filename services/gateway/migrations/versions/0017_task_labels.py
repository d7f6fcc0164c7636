"""Task labels (ADR-0110): a jsonb map per task, NULL for a task without any, and a GIN
index (``jsonb_path_ops``: containment only) over the labelled tasks alone, so that a task
without labels writes no index entry and a status update never touches the index (the
labels never change: every update stays HOT as before).

Revision ID: 0017
Revises: 0014
"""

from alembic import op

revision = "0017"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE tasks ADD COLUMN labels jsonb")
    op.execute(
        "CREATE INDEX ix_tasks_labels ON tasks USING gin (labels jsonb_path_ops)"
        " WHERE labels IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_tasks_labels")
    op.execute("ALTER TABLE tasks DROP COLUMN labels")
