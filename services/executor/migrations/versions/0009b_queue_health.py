"""Queue health and limits (ADR-0101): when a worker last showed itself on each queue it
serves (``worker_presence``, written at most once a second per worker), and an index for
counting a queue's taken runs (its ``max_concurrency``, checked as runs are taken).

Revision ID: 0009b
Revises: 0008
"""

from alembic import op

revision = "0009b"
down_revision = "0009a"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE worker_presence (
            queue text NOT NULL,
            worker_id text NOT NULL,
            seen_at timestamptz NOT NULL,
            PRIMARY KEY (queue, worker_id)
        ) WITH (fillfactor = 70)
        """
    )
    op.execute("CREATE INDEX worker_runs_taken ON worker_runs (queue) WHERE state = 'taken'")


def downgrade() -> None:
    op.execute("DROP INDEX worker_runs_taken")
    op.execute("DROP TABLE worker_presence")
