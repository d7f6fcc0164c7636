"""Reconciler recovery: failed/demoted task store, failure history, redrive log,
settlements, downstream state, completion facts, deliveries, findings, arbitration
claims and verdicts, outbox.

Revision ID: rec_0001
Revises:
"""

from alembic import op

revision = "rec_0001"
down_revision = None
branch_labels = None
depends_on = None

# Value lists mirror dispo.reconciler.states (tests/reconciler/test_states.py compares them).
UPGRADE = """
CREATE TABLE recovery_tasks (
    task_id          text PRIMARY KEY,
    business         text NOT NULL,
    state            text NOT NULL CONSTRAINT ck_recovery_state CHECK (state IN
                     ('PARKED_FAILED', 'AWAITING_SETTLEMENT', 'AWAITING_DECISION', 'DEMOTED',
                      'REDRIVEN', 'RESOLVED', 'FAILED', 'ABANDONED')),
    kind             text NOT NULL CONSTRAINT ck_recovery_kind CHECK (kind IN ('fail', 'demote')),
    cells            text[] NOT NULL DEFAULT '{}',
    downstreams      text[] NOT NULL DEFAULT '{}',
    error_class      text NOT NULL DEFAULT '',
    reason           text NOT NULL DEFAULT '' CONSTRAINT ck_recovery_reason_length CHECK (char_length(reason) <= 500),
    envelope         bytea NOT NULL,
    generation       bigint NOT NULL,
    version          bigint NOT NULL DEFAULT 0,
    task_created_at  timestamptz NOT NULL,
    first_parked_at  timestamptz NOT NULL,
    parked_at        timestamptz NOT NULL,
    redrives         integer NOT NULL DEFAULT 0,
    releases         integer NOT NULL DEFAULT 0,
    next_redrive_at  timestamptz,
    redrive_trigger  text NOT NULL DEFAULT 'auto',
    last_redrive_at  timestamptz,
    updated_at       timestamptz NOT NULL
);
CREATE INDEX recovery_tasks_due ON recovery_tasks (next_redrive_at) WHERE state = 'PARKED_FAILED';
CREATE INDEX recovery_tasks_state ON recovery_tasks (state, parked_at);
CREATE INDEX recovery_tasks_downstreams ON recovery_tasks USING gin (downstreams);

CREATE TABLE failure_history (
    id           bigserial PRIMARY KEY,
    task_id      text NOT NULL REFERENCES recovery_tasks (task_id),
    kind         text NOT NULL,
    generation   bigint NOT NULL,
    received_at  timestamptz NOT NULL,
    reason       text NOT NULL DEFAULT '',
    error_class  text NOT NULL DEFAULT '',
    nodes        jsonb NOT NULL DEFAULT '[]'
);
CREATE UNIQUE INDEX failure_history_once ON failure_history (task_id, kind, generation);

CREATE TABLE redrive_log (
    id          bigserial PRIMARY KEY,
    task_id     text NOT NULL REFERENCES recovery_tasks (task_id),
    generation  bigint NOT NULL,
    trigger     text NOT NULL,
    actor       text NOT NULL DEFAULT '',
    reason      text NOT NULL DEFAULT '',
    downstream  text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL,
    nodes_reset text[] NOT NULL DEFAULT '{}'
);
CREATE INDEX redrive_log_task ON redrive_log (task_id, id);

CREATE TABLE settlements (
    id          bigserial PRIMARY KEY,
    task_id     text NOT NULL REFERENCES recovery_tasks (task_id),
    node_id     text NOT NULL,
    generation  bigint NOT NULL,
    method      text NOT NULL CONSTRAINT ck_settlement_method CHECK (method IN ('PROBE', 'IDEMPOTENT_RERUN', 'OPERATOR')),
    outcome     text NOT NULL CONSTRAINT ck_settlement_outcome CHECK (outcome IN ('SUCCEEDED', 'PENDING')),
    reason      text NOT NULL DEFAULT '',
    actor       text NOT NULL DEFAULT '',
    at          timestamptz NOT NULL
);
CREATE UNIQUE INDEX settlements_once ON settlements (task_id, node_id, generation);

CREATE TABLE downstream_state (
    name            text PRIMARY KEY,
    healthy         boolean,
    paused          boolean NOT NULL DEFAULT false,
    paused_reason   text NOT NULL DEFAULT '',
    paused_by       text NOT NULL DEFAULT '',
    last_probe_at   timestamptz,
    last_change_at  timestamptz,
    probe_error     text NOT NULL DEFAULT '',
    tokens          double precision NOT NULL DEFAULT 0,
    tokens_at       timestamptz
);

CREATE TABLE completions (
    task_id            text PRIMARY KEY,
    business           text NOT NULL,
    status             text NOT NULL,
    status_reason      text NOT NULL DEFAULT '',
    version            bigint NOT NULL,
    envelope           bytea NOT NULL,
    finished_at        timestamptz NOT NULL,
    recorded_at        timestamptz NOT NULL,
    callback_url       text NOT NULL DEFAULT '',
    notify_state       text NOT NULL CONSTRAINT ck_completion_notify CHECK (notify_state IN
                       ('NONE', 'PENDING', 'DELIVERED', 'GAVE_UP')),
    notify_attempts    integer NOT NULL DEFAULT 0,
    notify_next_at     timestamptz,
    notified_at        timestamptz,
    notify_last_error  text NOT NULL DEFAULT '',
    reconcile_state    text NOT NULL CONSTRAINT ck_completion_reconcile CHECK (reconcile_state IN
                       ('PENDING', 'MATCHED', 'MISMATCH', 'NOT_SAMPLED', 'NOTHING_TO_PROBE')),
    reconcile_attempts integer NOT NULL DEFAULT 0,
    reconcile_next_at  timestamptz,
    reconciled_at      timestamptz
);
CREATE INDEX completions_notify_due ON completions (notify_next_at) WHERE notify_state = 'PENDING';
CREATE INDEX completions_reconcile_due ON completions (reconcile_next_at) WHERE reconcile_state = 'PENDING';

CREATE TABLE deliveries (
    id           bigserial PRIMARY KEY,
    task_id      text NOT NULL REFERENCES completions (task_id),
    attempt      integer NOT NULL,
    target       text NOT NULL,
    at           timestamptz NOT NULL,
    ok           boolean NOT NULL,
    status_code  integer,
    error        text NOT NULL DEFAULT ''
);

CREATE TABLE findings (
    id               bigserial PRIMARY KEY,
    task_id          text NOT NULL REFERENCES completions (task_id),
    node_id          text NOT NULL,
    downstream       text NOT NULL DEFAULT '',
    recorded_status  text NOT NULL,
    observed         text NOT NULL,
    detail           text NOT NULL DEFAULT '',
    found_at         timestamptz NOT NULL
);
CREATE UNIQUE INDEX findings_once ON findings (task_id, node_id);

CREATE TABLE verdicts (
    id              bigserial PRIMARY KEY,
    target          text NOT NULL,
    effect          text NOT NULL,
    winner_task_id  text NOT NULL,
    loser_task_ids  text[] NOT NULL,
    reason          text NOT NULL,
    decided_at      timestamptz NOT NULL
);

CREATE TABLE claims (
    task_id      text NOT NULL,
    cell_ref     text NOT NULL,
    business     text NOT NULL,
    cell         text NOT NULL,
    target       text NOT NULL,
    effect       text NOT NULL,
    accepted_at  timestamptz NOT NULL,
    state        text NOT NULL CONSTRAINT ck_claim_state CHECK (state IN ('OPEN', 'WON', 'LOST', 'UNCONTESTED')),
    verdict_id   bigint REFERENCES verdicts (id),
    PRIMARY KEY (task_id, cell_ref)
);
CREATE INDEX claims_target ON claims (target, effect, accepted_at);
CREATE INDEX claims_open ON claims (accepted_at) WHERE state = 'OPEN';

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

TABLES = (
    "outbox",
    "claims",
    "verdicts",
    "findings",
    "deliveries",
    "completions",
    "downstream_state",
    "settlements",
    "redrive_log",
    "failure_history",
    "recovery_tasks",
)


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"DROP TABLE {table}")
