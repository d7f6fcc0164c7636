"""A business token's maximum priority (ADR-0109): the highest Submit priority it may ask
for, 1 (any) to 5. Tokens made before it may ask for any.

Revision ID: auth_0004
Revises: auth_0003
"""

from alembic import op

revision = "auth_0004"
down_revision = "auth_0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE auth.tokens ADD COLUMN max_priority smallint NOT NULL DEFAULT 1"
        " CONSTRAINT tokens_max_priority_check CHECK (max_priority BETWEEN 1 AND 5)"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE auth.tokens DROP COLUMN max_priority")
