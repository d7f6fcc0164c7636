"""Worker runs taken in the fair order (ADR-0109): each run records its task's business and
priority when it is offered, and the offered runs are indexed by queue, kind, business,
priority and arrival, so a taker reads each business's next runs of a queue from the index.
This index replaces ``worker_runs_offered`` (queue, offered_at), whose reads (a queue's
probe runs, its count of offered runs) it serves by its leading columns.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE worker_runs ADD COLUMN business text NOT NULL DEFAULT '',"
        " ADD COLUMN priority smallint NOT NULL DEFAULT 3"
    )
    op.execute("DROP INDEX worker_runs_offered")
    op.execute(
        "CREATE INDEX worker_runs_offered ON worker_runs"
        " (queue, kind, business, priority, offered_at) WHERE state = 'offered'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX worker_runs_offered")
    op.execute(
        "CREATE INDEX worker_runs_offered ON worker_runs (queue, offered_at)"
        " WHERE state = 'offered'"
    )
    op.execute("ALTER TABLE worker_runs DROP COLUMN business, DROP COLUMN priority")
