"""Retention (ADR-0105): each task run records its business and when it finished, and an
index by business and creation time, which the purge reads each business's oldest runs by.

``finished_at`` is set when a task reaches SUCCEEDED, FAILED or CANCELLED and cleared when
a resume opens it again; rows that finished before are stamped with their last change. A
row recorded before this migration (or recorded by a cancel before its task.create) has
no business (``''``): it is kept as long as the longest retention of the policy. The index
is on columns no update changes, so a task's updates stay HOT (ADR-0061).

Revision ID: 0012
Revises: 0008
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE task_runs ADD COLUMN business text NOT NULL DEFAULT ''")
    op.execute("ALTER TABLE task_runs ADD COLUMN finished_at timestamptz")
    op.execute(
        "UPDATE task_runs SET finished_at = updated_at"
        " WHERE status IN ('succeeded', 'failed', 'cancelled')"
    )
    op.execute("CREATE INDEX task_runs_business_created ON task_runs (business, created_at)")


def downgrade() -> None:
    op.execute("DROP INDEX task_runs_business_created")
    op.execute("ALTER TABLE task_runs DROP COLUMN finished_at")
    op.execute("ALTER TABLE task_runs DROP COLUMN business")
