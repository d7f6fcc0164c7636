"""Worker runs (ADR-0099): the run of a ``worker`` node offered on its queue, taken by a
worker under a run lease, completed with its outcome; deleted once its node is recorded.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE worker_runs (
            task_id text NOT NULL,
            node_id text NOT NULL,
            queue text NOT NULL,
            owner text NOT NULL,
            attempt integer NOT NULL,
            idempotency_key text NOT NULL,
            action text NOT NULL,
            idempotent boolean NOT NULL,
            timeout_ms integer NOT NULL,
            payload bytea NOT NULL,
            offered_at timestamptz NOT NULL,
            worker_id text,
            lease_until timestamptz,
            deadline timestamptz,
            state text NOT NULL CHECK (state IN ('offered', 'taken', 'done')),
            outcome text CHECK (outcome IN ('output', 'error', 'not_sent', 'lost')),
            output bytea,
            message text,
            retryable boolean,
            PRIMARY KEY (task_id, node_id)
        )
        """
    )
    op.execute(
        "CREATE INDEX worker_runs_offered ON worker_runs (queue, offered_at)"
        " WHERE state = 'offered'"
    )


def downgrade() -> None:
    op.execute("DROP TABLE worker_runs")
