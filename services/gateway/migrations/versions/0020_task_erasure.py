"""Erasure (ADR-0113): who erased a task's user data and when, on its row.

Revision ID: 0020
Revises: 0017
"""

from alembic import op

revision = "0020"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE tasks ADD COLUMN erased_at timestamptz")
    op.execute("ALTER TABLE tasks ADD COLUMN erased_by text")


def downgrade() -> None:
    op.execute("ALTER TABLE tasks DROP COLUMN erased_by")
    op.execute("ALTER TABLE tasks DROP COLUMN erased_at")
