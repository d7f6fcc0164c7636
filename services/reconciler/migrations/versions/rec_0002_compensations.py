"""Arbitration compensations: the losing cell's payload on each claim, and the compensating
cells to submit for losers whose conflict declares one.

Revision ID: rec_0002
Revises: rec_0001
"""

from alembic import op

revision = "rec_0002"
down_revision = "rec_0001"
branch_labels = None
depends_on = None

# Value list mirrors dispo.reconciler.states.CompensationState.
UPGRADE = """
ALTER TABLE claims ADD COLUMN payload jsonb NOT NULL DEFAULT '{}';

CREATE TABLE compensations (
    verdict_id         bigint NOT NULL REFERENCES verdicts (id),
    task_id            text NOT NULL,
    business           text NOT NULL,
    cell               text NOT NULL,
    payload            jsonb NOT NULL,
    state              text NOT NULL CONSTRAINT ck_compensation_state CHECK (state IN ('PENDING', 'SUBMITTED', 'FAILED')),
    attempts           integer NOT NULL DEFAULT 0,
    next_at            timestamptz,
    submitted_task_id  text NOT NULL DEFAULT '',
    error              text NOT NULL DEFAULT '',
    PRIMARY KEY (verdict_id, task_id)
);
CREATE INDEX compensations_due ON compensations (next_at) WHERE state = 'PENDING';
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE compensations")
    op.execute("ALTER TABLE claims DROP COLUMN payload")
