"""Pool outbox in the shared shape of libs/outbox.py: published_at becomes sent_at and its
partial index is named outbox_unsent, as in every other service (the predicate follows the
renamed column).

Revision ID: pool_0002
Revises: pool_0001
"""

from alembic import op

revision = "pool_0002"
down_revision = "pool_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE outbox RENAME COLUMN published_at TO sent_at")
    op.execute("ALTER INDEX outbox_unpublished RENAME TO outbox_unsent")


def downgrade() -> None:
    op.execute("ALTER INDEX outbox_unsent RENAME TO outbox_unpublished")
    op.execute("ALTER TABLE outbox RENAME COLUMN sent_at TO published_at")
