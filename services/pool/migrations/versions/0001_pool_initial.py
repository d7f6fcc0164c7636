"""Pool tables: evaluations, runs, crons, assignments, resizes, bounds, outbox.

Revision ID: pool_0001
Revises:
"""

from alembic import op

revision = "pool_0001"
down_revision = None
branch_labels = None
depends_on = None

EVALUATION_STATUSES = ("queued", "executing", "paused", "stuck", "completed", "cancelled")
CRON_STATUSES = ("idle", "busy", "stuck")


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def upgrade() -> None:
    op.execute(f"""
    CREATE TABLE evaluations (
        id                 text PRIMARY KEY,
        series             text NOT NULL,
        line               text NOT NULL CHECK (line IN ('formal', 'trial')),
        period             text NOT NULL,
        configuration_json text NOT NULL,
        analysis_model     text NOT NULL DEFAULT '',
        target_url         text NOT NULL,
        cases              jsonb NOT NULL,
        window_start       timestamptz NOT NULL,
        window_seconds     integer NOT NULL CHECK (window_seconds > 0),
        slot_count         integer NOT NULL CHECK (slot_count > 0),
        runs_per_slot      integer NOT NULL CHECK (runs_per_slot > 0),
        status             text NOT NULL CHECK (status IN ({_in(EVALUATION_STATUSES)})),
        priority_boost     integer NOT NULL DEFAULT 0,
        runs_done          integer NOT NULL DEFAULT 0,
        assigned_cron_id   text UNIQUE,
        assigned_at        timestamptz,
        waiting_since      timestamptz NOT NULL,
        created_at         timestamptz NOT NULL,
        started_at         timestamptz,
        completed_at       timestamptz,
        CHECK ((assigned_cron_id IS NULL) = (assigned_at IS NULL)),
        CHECK (assigned_cron_id IS NULL OR status = 'executing')
    )""")
    op.execute("""
    CREATE INDEX evaluations_servable ON evaluations (waiting_since)
        WHERE status IN ('queued', 'executing', 'stuck') AND assigned_cron_id IS NULL""")
    op.execute("""
    CREATE TABLE runs (
        run_id         text PRIMARY KEY,
        evaluation_id  text NOT NULL REFERENCES evaluations(id),
        run_index      integer NOT NULL,
        case_id        text NOT NULL,
        cron_id        text NOT NULL,
        verdict        text NOT NULL CHECK (verdict IN ('pass', 'fail', 'error')),
        score          double precision NOT NULL,
        latency_ms     bigint NOT NULL,
        failure_reason text NOT NULL DEFAULT '',
        recorded_at    timestamptz NOT NULL,
        UNIQUE (evaluation_id, run_index)
    )""")
    op.execute(f"""
    CREATE TABLE crons (
        id            text PRIMARY KEY,
        status        text NOT NULL CHECK (status IN ({_in(CRON_STATUSES)})),
        evaluation_id text UNIQUE,
        last_activity timestamptz NOT NULL,
        created_at    timestamptz NOT NULL,
        CHECK ((status = 'busy') = (evaluation_id IS NOT NULL) OR status = 'stuck')
    )""")
    op.execute("""
    CREATE TABLE assignments (
        id            bigserial PRIMARY KEY,
        cron_id       text NOT NULL,
        evaluation_id text NOT NULL,
        started_at    timestamptz NOT NULL,
        ended_at      timestamptz,
        end_reason    text
    )""")
    # No evaluation is ever held by two crons, and no cron holds two evaluations.
    op.execute(
        "CREATE UNIQUE INDEX assignments_open_evaluation ON assignments (evaluation_id) WHERE ended_at IS NULL"
    )
    op.execute(
        "CREATE UNIQUE INDEX assignments_open_cron ON assignments (cron_id) WHERE ended_at IS NULL"
    )
    op.execute("""
    CREATE TABLE resizes (
        id        bigserial PRIMARY KEY,
        from_size integer NOT NULL,
        to_size   integer NOT NULL,
        reason    text NOT NULL,
        at        timestamptz NOT NULL
    )""")
    op.execute("""
    CREATE TABLE bounds (
        singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
        min_size  integer NOT NULL,
        max_size  integer NOT NULL,
        CHECK (0 < min_size AND min_size <= max_size)
    )""")
    op.execute("""
    CREATE TABLE outbox (
        id           bigserial PRIMARY KEY,
        subject      text NOT NULL,
        msg_id       text NOT NULL,
        payload      bytea NOT NULL,
        created_at   timestamptz NOT NULL,
        published_at timestamptz
    )""")
    op.execute("CREATE INDEX outbox_unpublished ON outbox (id) WHERE published_at IS NULL")


def downgrade() -> None:
    for table in ("outbox", "bounds", "resizes", "assignments", "crons", "runs", "evaluations"):
        op.execute(f"DROP TABLE {table}")
