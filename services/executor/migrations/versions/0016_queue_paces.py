"""A worker queue's runs a second across the cluster (ADR-0108, "Worker queues"): one row
per queue with a ``max_calls_per_second``, the runs of it taken in its latest ``second``
(whole seconds since the epoch, of the takers' clocks) and in the second before that one
(``last``), written by the claim that takes them, under the queue's lock.

Revision ID: 0016
Revises: 0015
"""

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE queue_paces ("
        " queue text PRIMARY KEY,"
        " second bigint NOT NULL,"
        " taken integer NOT NULL,"
        " last integer NOT NULL DEFAULT 0)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE queue_paces")
