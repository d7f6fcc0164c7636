"""Completion facts kept apart: finished (from the executor) and caller notified (callback).

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
ALTER TABLE tasks ADD COLUMN finished_at timestamptz;
ALTER TABLE tasks ADD COLUMN notified_at timestamptz;
ALTER TABLE tasks ADD COLUMN notify_attempts integer NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN notify_next_at timestamptz;
ALTER TABLE tasks ADD COLUMN notify_error text NOT NULL DEFAULT ''
    CONSTRAINT ck_notify_error_length CHECK (char_length(notify_error) <= 500);
CREATE INDEX ix_tasks_to_notify ON tasks (notify_next_at)
    WHERE finished_at IS NOT NULL AND notified_at IS NULL AND callback_url <> ''
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    op.execute("DROP INDEX ix_tasks_to_notify")
    for column in ("callback_url", "finished_at", "notified_at", "notify_attempts", "notify_next_at", "notify_error"):
        op.execute(f"ALTER TABLE tasks DROP COLUMN {column}")
