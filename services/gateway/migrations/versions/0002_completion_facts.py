"""The "finished" completion fact and the callback URL as columns of the task.

The caller-notified and reconciled facts are kept by the reconciler (from task.status).

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE tasks ADD COLUMN callback_url text NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN finished_at timestamptz
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    op.execute("ALTER TABLE tasks DROP COLUMN finished_at")
    op.execute("ALTER TABLE tasks DROP COLUMN callback_url")
