"""Delayed starts and deadlines (ADR-0103): a task's ``not_before`` and ``deadline``, for
ListTasks and its ``scheduled`` filter, and a delayable outbox, whose task.create rows wait
for their ``available_at``. The unsent index leaves the delayed rows out; they have one of
their own. Adding nullable columns rewrites nothing.

Revision ID: 0013
Revises: 0011
"""

from alembic import op
from dispo.libs.outbox import delay_downgrade, delay_upgrade

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE tasks ADD COLUMN not_before timestamptz, ADD COLUMN deadline timestamptz"
    )
    # Not on the status: an index over it would make every status update of a task a
    # non-HOT one (ADR-0061); a start never changes.
    op.execute("CREATE INDEX ix_tasks_scheduled ON tasks (not_before) WHERE not_before IS NOT NULL")
    delay_upgrade()


def downgrade() -> None:
    delay_downgrade()
    op.execute("DROP INDEX ix_tasks_scheduled")
    op.execute("ALTER TABLE tasks DROP COLUMN not_before, DROP COLUMN deadline")
