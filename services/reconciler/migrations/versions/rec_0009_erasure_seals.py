"""Erasure seals (ADR-0114): the tasks the gateway is erasing or has erased, which nothing
here may run again. A row per task, written before the gateway commits the erasure and
kept until retention deletes the task's records; the redrive statement refuses any task
that has one.

Revision ID: rec_0009
Revises: rec_0008
"""

from alembic import op

revision = "rec_0009"
down_revision = "rec_0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE erasure_seals (task_id text PRIMARY KEY, sealed_at timestamptz NOT NULL,"
        " erased_by text NOT NULL)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE erasure_seals")
