"""Room on each page of ``tasks`` for the versions its rows are updated to (ADR-0061).

A task's row is inserted with the accepted envelope and updated with each status snapshot;
the first update also keeps the accepted envelope aside (``accepted``), so the row grows by
about half. Pages filled to 40 % at insert keep that growth and the next version on the
row's own page: the update is a HOT update, which writes none of the table's five indexes.
Full pages (the default 100 %) sent nine updates in ten to another page, each with an
entry in every index. Only pages filled from now on are affected; nothing is rewritten.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE tasks SET (fillfactor = 40)")


def downgrade() -> None:
    op.execute("ALTER TABLE tasks RESET (fillfactor)")
