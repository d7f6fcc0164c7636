"""Task deadlines (ADR-0103): the tasks that have one, by deadline, for the sweep that
closes those past theirs that no pass holds, and for the guard that claims no node past it.
A table of their own: an index on ``task_runs`` covering its status or lease would make
every update of a run row a non-HOT one (ADR-0061). A row goes once its task has ended
or was closed; tasks recorded before have none here (their passes still read the deadline
from the envelope).

Revision ID: 0011
Revises: 0008
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE task_deadlines (task_id text PRIMARY KEY, deadline timestamptz NOT NULL)"
    )
    op.execute("CREATE INDEX ix_task_deadlines_deadline ON task_deadlines (deadline)")


def downgrade() -> None:
    op.execute("DROP TABLE task_deadlines")
