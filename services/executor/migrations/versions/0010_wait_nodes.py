"""Wait nodes and signals (ADR-0102): a node may be ``waiting``; the signals a task was
sent are kept until a node waiting for them takes one; each waiting node's time is kept
in ``waits``, where the timeout sweep finds those whose time is up (an index on
``node_runs`` instead would make its updates no longer HOT, ADR-0061).

Revision ID: 0010
Revises: 0008
"""

from alembic import op

revision = "0010"
down_revision = "0009b"
branch_labels = None
depends_on = None

NODE_STATES = (
    "pending",
    "running",
    "succeeded",
    "failed",
    "unknown",
    "dependency_failed",
    "demoted",
    "cancelled",
)


def _check(states: tuple[str, ...]) -> None:
    values = ", ".join(f"'{s}'" for s in states)
    op.execute("ALTER TABLE node_runs DROP CONSTRAINT ck_node_run_status")
    op.execute(
        f"ALTER TABLE node_runs ADD CONSTRAINT ck_node_run_status CHECK (status IN ({values}))"
    )


def upgrade() -> None:
    _check((*NODE_STATES, "waiting"))
    op.execute(
        """
        CREATE TABLE signals (
            task_id text NOT NULL,
            signal_id text NOT NULL,
            signal text NOT NULL,
            payload bytea NOT NULL,
            received_at timestamptz NOT NULL,
            seq bigserial NOT NULL,
            taken_by text,
            taken_at timestamptz,
            PRIMARY KEY (task_id, signal_id)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE waits (
            task_id text NOT NULL,
            node_id text NOT NULL,
            until timestamptz NOT NULL,
            PRIMARY KEY (task_id, node_id)
        )
        """
    )
    op.execute("CREATE INDEX waits_until ON waits (until)")


def downgrade() -> None:
    op.execute("DROP TABLE waits")
    op.execute("DROP TABLE signals")
    op.execute("UPDATE node_runs SET status = 'pending' WHERE status = 'waiting'")
    _check(NODE_STATES)
