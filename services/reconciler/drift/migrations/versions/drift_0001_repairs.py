"""Drift checks and the repairs they made, each with its reason.

Revision ID: drift_0001
Revises:
"""

from alembic import op

revision = "drift_0001"
down_revision = None
branch_labels = None
depends_on = None

REPAIR_KINDS = (
    "remove_orphan",
    "recreate_missing",
    "release_finished",
    "requeue_evaluation",
    "rewrite_state",
)
OUTCOMES = ("applied", "skipped", "failed")


def upgrade() -> None:
    op.execute("""
    CREATE TABLE drift_checks (
        check_id        text PRIMARY KEY,
        at              timestamptz NOT NULL,
        crons_in_db     integer NOT NULL,
        crons_in_driver integer NOT NULL,
        driver          text NOT NULL
    )""")
    kinds = ", ".join(f"'{k}'" for k in REPAIR_KINDS)
    outcomes = ", ".join(f"'{o}'" for o in OUTCOMES)
    op.execute(f"""
    CREATE TABLE drift_repairs (
        id            bigserial PRIMARY KEY,
        check_id      text NOT NULL REFERENCES drift_checks(check_id),
        kind          text NOT NULL CHECK (kind IN ({kinds})),
        cron_id       text NOT NULL,
        evaluation_id text NOT NULL DEFAULT '',
        reason        text NOT NULL CHECK (char_length(reason) <= 500),
        outcome       text NOT NULL CHECK (outcome IN ({outcomes})),
        detail        text NOT NULL DEFAULT '' CHECK (char_length(detail) <= 500),
        at            timestamptz NOT NULL
    )""")
    op.execute("CREATE INDEX drift_repairs_kind ON drift_repairs (kind, id DESC)")


def downgrade() -> None:
    op.execute("DROP TABLE drift_repairs")
    op.execute("DROP TABLE drift_checks")
