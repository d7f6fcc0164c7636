"""Signals as accepted (ADR-0102): one row per (task, signal id), written with its
task.signal outbox row; a repeated signal id finds its row and changes nothing.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE signals (
            task_id text NOT NULL,
            signal_id text NOT NULL,
            signal text NOT NULL,
            payload bytea NOT NULL,
            created_at timestamptz NOT NULL,
            PRIMARY KEY (task_id, signal_id)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE signals")
