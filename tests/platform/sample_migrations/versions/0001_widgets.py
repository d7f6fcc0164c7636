"""A sample schema for the migration runner's own tests."""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "widgets", sa.Column("id", sa.Integer, primary_key=True), sa.Column("name", sa.Text)
    )


def downgrade() -> None:
    op.drop_table("widgets")
