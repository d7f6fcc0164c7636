"""Gateway: tasks as accepted (with the status view kept from executor events) and outbox.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# status mirrors dispo.common.v1.TaskStatus (a test compares them).
UPGRADE = """
CREATE TABLE tasks (
    task_id           text PRIMARY KEY,
    business          text NOT NULL,
    idempotency_key   text,
    request_hash      text NOT NULL,
    status            text NOT NULL CONSTRAINT ck_task_status CHECK (status IN
                      ('ACCEPTED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'RETRY_EXHAUSTED', 'DEMOTED')),
    cancel_requested  boolean NOT NULL DEFAULT false,
    node_count        integer NOT NULL,
    version           bigint NOT NULL DEFAULT 0,
    view              bytea NOT NULL,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    CONSTRAINT uq_task_idempotency UNIQUE (business, idempotency_key)
);
CREATE INDEX ix_tasks_created ON tasks (created_at, task_id);
CREATE INDEX ix_tasks_business_created ON tasks (business, created_at, task_id);

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
    op.execute("DROP TABLE tasks")
