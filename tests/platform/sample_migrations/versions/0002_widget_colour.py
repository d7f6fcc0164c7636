import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.add_column("widgets", sa.Column("colour", sa.Text, nullable=False, server_default="blue"))


def downgrade() -> None:
    op.drop_column("widgets", "colour")
