"""Bulk actions (ADR-0112): the record of each CancelByFilter, kept and listable — who asked
(token id), when, its filter as asked, the cutoff it took tasks before, and how far it is
(its cursor over (created_at, task_id) and its counts). The bulk pass takes the RUNNING ones.

Revision ID: 0019
Revises: 0014
"""

from alembic import op

revision = "0019"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE bulk_actions ("
        " action_id text PRIMARY KEY,"
        " kind text NOT NULL CHECK (kind IN ('cancel')),"
        " business text NOT NULL,"
        " actor text NOT NULL,"
        " reason text NOT NULL DEFAULT '',"
        " request bytea NOT NULL,"
        " rate double precision NOT NULL CHECK (rate > 0),"
        " cutoff timestamptz NOT NULL,"
        " state text NOT NULL CHECK (state IN ('running', 'done')),"
        " matched bigint NOT NULL,"
        " processed bigint NOT NULL DEFAULT 0,"
        " acted bigint NOT NULL DEFAULT 0,"
        " skipped bigint NOT NULL DEFAULT 0,"
        " cursor_created timestamptz,"
        " cursor_task text,"
        " created_at timestamptz NOT NULL,"
        " updated_at timestamptz NOT NULL,"
        " finished_at timestamptz)"
    )
    op.execute("CREATE INDEX ix_bulk_actions_created ON bulk_actions (created_at, action_id)")
    op.execute(
        "CREATE INDEX ix_bulk_actions_business ON bulk_actions (business, created_at, action_id)"
    )
    op.execute(
        "CREATE INDEX ix_bulk_actions_running ON bulk_actions (action_id) WHERE state = 'running'"
    )


def downgrade() -> None:
    op.execute("DROP TABLE bulk_actions")
