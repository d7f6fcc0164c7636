"""The task as accepted kept apart from its status view, so a status event needs no read.

``accepted`` holds the envelope recorded at acceptance (its payloads are what the view
shows beside the executor's node states). A task's first status event moves the view as it
stood into it (``COALESCE(accepted, view)``), in the same statement that writes the
snapshot: rows written before this revision, whose view still holds the payloads, work the
same way.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE tasks ADD COLUMN accepted bytea")


def downgrade() -> None:
    op.execute("ALTER TABLE tasks DROP COLUMN accepted")
