"""The quarantine table's DDL, for the migration that adds it to a service's chain.

    from dispo.libs.quarantine.schema import create_quarantine, drop_quarantine

    def upgrade() -> None:
        create_quarantine()

This is the table's shape (the statements of :mod:`dispo.libs.quarantine.store` read and
write it); a later change to the table gets migrations of its own.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


def create_quarantine(name: str = "quarantine") -> None:
    op.create_table(
        name,
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("consumer", sa.Text, nullable=False),
        sa.Column("stream", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("stream_sequence", sa.BigInteger, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("deliveries", sa.Integer, nullable=False),
        sa.Column("replays", sa.Integer, nullable=False, server_default="0"),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("consumer", "stream", "stream_sequence", name=f"uq_{name}_message"),
        sa.CheckConstraint("char_length(error) <= 500", name=f"ck_{name}_error_length"),
    )


def drop_quarantine(name: str = "quarantine") -> None:
    op.drop_table(name)
