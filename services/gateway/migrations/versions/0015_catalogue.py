"""The catalogue's versions (ADR-0111): each change to the cell catalogue records the whole
catalogue again as a new immutable row, with its owners, its retired cells, who made it and
when (the document as ``json``: its keys keep the order they were written in). A change
is the insert of version ``parent + 1``: of two changes made from the same
version the primary key lets one in, and the other is told which version won.

Revision ID: gateway_cat
Revises: 0014
"""

from alembic import op

revision = "gateway_cat"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE catalogue_versions ("
        " version bigint PRIMARY KEY CHECK (version > 0),"
        " parent bigint NOT NULL CHECK (parent = version - 1),"
        # json, not jsonb: the document's text as written, its keys in their order (the
        # order of a cell's actions and of a wait's choices is the author's).
        " document json NOT NULL,"
        " owners jsonb NOT NULL,"
        " retired jsonb NOT NULL DEFAULT '[]',"
        " author text NOT NULL,"
        " change text NOT NULL,"
        " created_at timestamptz NOT NULL)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE catalogue_versions")
