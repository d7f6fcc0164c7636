"""Schedules (ADR-0104): a submission the gateway makes on a cron expression or an interval,
and the record of its last firings.

``due_at`` is the next fire time plus its jitter: the firing pass takes the schedules due by
it, ``FOR UPDATE SKIP LOCKED``, so two gateways never take the same one at once. A firing's
task is in ``tasks`` (its idempotency key ``schedule:<id>:<fire time>``); the firings table
keeps which task each fire time submitted, for GetSchedule and the console.

Revision ID: 0014
Revises: 0011
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE schedules ("
        " schedule_id text PRIMARY KEY,"
        " business text NOT NULL,"
        " definition bytea NOT NULL,"
        " paused boolean NOT NULL DEFAULT false,"
        " next_fire_at timestamptz,"
        " due_at timestamptz,"
        " buffered_fire_at timestamptz,"
        " last_task_id text,"
        " skipped_overlap bigint NOT NULL DEFAULT 0,"
        " skipped_catchup bigint NOT NULL DEFAULT 0,"
        " created_at timestamptz NOT NULL,"
        " updated_at timestamptz NOT NULL,"
        " CHECK (paused OR (next_fire_at IS NOT NULL AND due_at IS NOT NULL)))"
    )
    op.execute("CREATE INDEX ix_schedules_due ON schedules (due_at) WHERE NOT paused")
    op.execute("CREATE INDEX ix_schedules_business ON schedules (business, schedule_id)")
    op.execute(
        "CREATE INDEX ix_schedules_buffered ON schedules (last_task_id)"
        " WHERE buffered_fire_at IS NOT NULL AND NOT paused"
    )
    op.execute(
        "CREATE TABLE schedule_firings ("
        " schedule_id text NOT NULL REFERENCES schedules ON DELETE CASCADE,"
        " fire_time timestamptz NOT NULL,"
        " fired_at timestamptz NOT NULL,"
        " outcome text NOT NULL CHECK (outcome IN ('submitted', 'refused')),"
        " task_id text,"
        " reason text NOT NULL DEFAULT '',"
        " manual boolean NOT NULL DEFAULT false,"
        " PRIMARY KEY (schedule_id, fire_time))"
    )


def downgrade() -> None:
    op.execute("DROP TABLE schedule_firings")
    op.execute("DROP TABLE schedules")
