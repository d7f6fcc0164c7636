"""A heartbeat on every job row: ``heartbeat_at`` is the last sign of life of whoever holds
the row (the replica that queued it, then the owner of its claim, extending it while the
job runs); NULL on a row handed back by a stopping replica, which is nobody's. Recovery
takes over only rows whose heartbeat is stale. Rows still queued or generating start from
their claim (or last change).

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE intelligence_jobs ADD COLUMN heartbeat_at timestamptz")
    op.execute(
        "UPDATE intelligence_jobs SET heartbeat_at = COALESCE(claimed_at, updated_at)"
        " WHERE status IN ('queued', 'generating')"
    )
    op.execute(
        "CREATE INDEX ix_intelligence_jobs_heartbeat ON intelligence_jobs (status, heartbeat_at)"
    )


def downgrade() -> None:
    op.execute("DROP INDEX ix_intelligence_jobs_heartbeat")
    op.execute("ALTER TABLE intelligence_jobs DROP COLUMN heartbeat_at")
