"""An index of idempotency keys alone, for ListTasks and CountTasks by key across every
business (an admin's search): the unique (business, idempotency_key) index serves a key
within one business only. Tasks without a key are left out of it.

Revision ID: 0008
Revises: 0007
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE INDEX ix_tasks_idempotency_key ON tasks (idempotency_key)"
        " WHERE idempotency_key IS NOT NULL"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_tasks_idempotency_key")
