"""Shares of the businesses' cluster-wide Submit rate (ADR-0108): one row per business
and gateway, the Submits a second the gateway may accept (``granted``), what it would
accept (``wanted``) and until when it is leased. Rows whose lease ran out are deleted by
the next renewal of the same business's rate.

Revision ID: 0015
Revises: 0014
"""

from alembic import op

revision = "0015"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE limit_shares ("
        " limit_key text NOT NULL,"
        " holder text NOT NULL,"
        " granted integer NOT NULL,"
        " wanted integer NOT NULL,"
        " lease_until timestamptz NOT NULL,"
        " PRIMARY KEY (limit_key, holder))"
    )


def downgrade() -> None:
    op.execute("DROP TABLE limit_shares")
