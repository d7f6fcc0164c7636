"""Paused businesses (ADR-0109): an operator's pause of one business's work; every executor
reads the table and starts none of its tasks while its row is here.

Revision ID: 0013
Revises: 0011
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE business_pauses (business text PRIMARY KEY,"
        " paused_at timestamptz NOT NULL, paused_by text NOT NULL DEFAULT '',"
        " reason text NOT NULL DEFAULT '')"
    )


def downgrade() -> None:
    op.execute("DROP TABLE business_pauses")
