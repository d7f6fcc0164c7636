"""An assignment ended because its cron went silent now ends ``stuck``, the pool's one word
for that (docs/glossary.md), instead of ``stalled``.

Revision ID: pool_0003
Revises: pool_0002
"""

from alembic import op

revision = "pool_0003"
down_revision = "pool_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE assignments SET end_reason = 'stuck' WHERE end_reason = 'stalled'")


def downgrade() -> None:
    op.execute("UPDATE assignments SET end_reason = 'stalled' WHERE end_reason = 'stuck'")
