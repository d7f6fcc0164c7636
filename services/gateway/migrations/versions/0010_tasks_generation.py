"""The generation of the snapshot a task's view holds, for the terminal guard (ADR-0077).

A snapshot may replace a FAILED view with another status only under a newer generation (an
operator's resume, ADR-0033); SUCCEEDED and CANCELLED views are never replaced by another
status. Rows written before hold 0: any resume's generation is newer. Adding a column with
a constant default rewrites nothing.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE tasks ADD COLUMN generation bigint NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE tasks DROP COLUMN generation")
