"""What a node's action returned (ADR-0093): canonical JSON, written with the move that
records the node SUCCEEDED; NULL for none.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE node_runs ADD COLUMN output bytea")


def downgrade() -> None:
    op.execute("ALTER TABLE node_runs DROP COLUMN output")
