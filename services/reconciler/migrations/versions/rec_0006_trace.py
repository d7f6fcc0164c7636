"""Trace contexts (libs/tracing.py): a parked task and a finished one keep the trace of the
event that recorded them, so a redrive (its task.create, on the outbox) and the callback
continue the task's trace.

Revision ID: rec_0006
Revises: rec_0005
"""

from alembic import op
from dispo.libs.outbox import trace_downgrade, trace_upgrade

revision = "rec_0006"
down_revision = "rec_0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    trace_upgrade()
    op.execute("ALTER TABLE recovery_tasks ADD COLUMN trace text")
    op.execute("ALTER TABLE completions ADD COLUMN trace text")


def downgrade() -> None:
    op.execute("ALTER TABLE completions DROP COLUMN trace")
    op.execute("ALTER TABLE recovery_tasks DROP COLUMN trace")
    trace_downgrade()
