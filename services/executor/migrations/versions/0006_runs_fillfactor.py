"""Room on each page of ``task_runs`` and ``node_runs`` for the versions their rows are
updated to (ADR-0061): a task's and a node's row is inserted when the task is opened and
updated at each step, claim and result. Pages filled to half at insert keep the next version
on the row's own page (a HOT update, which writes no index entry); full pages (the default)
sent most updates to another page, each with a new primary key entry. Only pages filled
from now on are affected; nothing is rewritten.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE task_runs SET (fillfactor = 50)")
    op.execute("ALTER TABLE node_runs SET (fillfactor = 50)")


def downgrade() -> None:
    op.execute("ALTER TABLE task_runs RESET (fillfactor)")
    op.execute("ALTER TABLE node_runs RESET (fillfactor)")
