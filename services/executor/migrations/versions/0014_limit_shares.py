"""Shares of the downstreams' cluster-wide limits (ADR-0108): one row per limit and
executor, what the executor holds of the limit (``granted``), what it would use
(``wanted``) and until when it is leased. Rows whose lease ran out are deleted by the next
renewal of the same limit.

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
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
