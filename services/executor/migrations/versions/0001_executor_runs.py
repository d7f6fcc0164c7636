"""Executor: task runs (lease, generation, version), node runs, outbox.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Status lists mirror dispo.executor.states (a test compares them).
UPGRADE = """
CREATE TABLE task_runs (
    task_id           text PRIMARY KEY,
    status            text NOT NULL CONSTRAINT ck_task_run_status CHECK (status IN
                      ('ACCEPTED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'RETRY_EXHAUSTED', 'DEMOTED')),
    generation        bigint NOT NULL DEFAULT 0,
    version           bigint NOT NULL DEFAULT 0,
    cancel_requested  boolean NOT NULL DEFAULT false,
    lease_owner       text,
    lease_until       timestamptz,
    envelope          bytea,
    status_reason     text NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL
);

CREATE TABLE node_runs (
    task_id          text NOT NULL REFERENCES task_runs (task_id),
    node_id          text NOT NULL,
    position         integer NOT NULL,
    status           text NOT NULL CONSTRAINT ck_node_run_status CHECK (status IN
                     ('PENDING', 'RUNNING', 'SUCCEEDED', 'FAILED', 'UNKNOWN', 'DEPENDENCY_FAILED', 'DEMOTED', 'CANCELLED')),
    attempts         integer NOT NULL DEFAULT 0,
    round_attempts   integer NOT NULL DEFAULT 0,
    not_before       timestamptz,
    retryable        boolean NOT NULL DEFAULT false,
    last_error       text NOT NULL DEFAULT '' CONSTRAINT ck_node_error_length CHECK (char_length(last_error) <= 500),
    run_owner        text,
    started_at       timestamptz,
    finished_at      timestamptz,
    PRIMARY KEY (task_id, node_id)
);

CREATE TABLE outbox (
    id          bigserial PRIMARY KEY,
    subject     text NOT NULL,
    msg_id      text NOT NULL,
    payload     bytea NOT NULL,
    created_at  timestamptz NOT NULL,
    sent_at     timestamptz
);
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE outbox")
    op.execute("DROP TABLE node_runs")
    op.execute("DROP TABLE task_runs")
