"""Completion facts by business and the time the task finished, for retention (ADR-0105):
the purge reads the oldest of each business past its cutoff from this index alone. A
fact is written once, with the time its task finished, so no update of it touches the index.

Revision ID: rec_0008
Revises: rec_0006
"""

from alembic import op

revision = "rec_0008"
down_revision = "rec_0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX completions_business_finished ON completions (business, finished_at)")


def downgrade() -> None:
    op.execute("DROP INDEX completions_business_finished")
