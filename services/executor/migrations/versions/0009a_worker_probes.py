"""Probe runs (ADR-0100): a ``worker_runs`` row of kind ``probe`` asks a worker of the
node's queue whether an UNKNOWN node's effect happened; its answer is ``done`` (with the
output, kept on the row until the redrive that settles the node records it) or
``not_done`` (``fenced``: the worker will refuse the key from now on).

Revision ID: 0009a
Revises: 0008
"""

from alembic import op

revision = "0009a"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE worker_runs ADD COLUMN kind text NOT NULL DEFAULT 'action'"
        " CONSTRAINT worker_runs_kind_check CHECK (kind IN ('action', 'probe')),"
        " ADD COLUMN fenced boolean"
    )
    op.execute("ALTER TABLE worker_runs DROP CONSTRAINT worker_runs_outcome_check")
    op.execute(
        "ALTER TABLE worker_runs ADD CONSTRAINT worker_runs_outcome_check CHECK (outcome IN"
        " ('output', 'error', 'not_sent', 'lost', 'done', 'not_done'))"
    )


def downgrade() -> None:
    op.execute("DELETE FROM worker_runs WHERE kind = 'probe'")
    op.execute("ALTER TABLE worker_runs DROP CONSTRAINT worker_runs_outcome_check")
    op.execute(
        "ALTER TABLE worker_runs ADD CONSTRAINT worker_runs_outcome_check CHECK (outcome IN"
        " ('output', 'error', 'not_sent', 'lost'))"
    )
    op.execute("ALTER TABLE worker_runs DROP COLUMN kind, DROP COLUMN fenced")
