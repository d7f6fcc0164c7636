"""Worker tokens (ADR-0100): a token of kind ``worker`` serves the runs of the queues it
names, and nothing else; every other kind names none.

Revision ID: auth_0003
Revises: auth_0002
"""

from alembic import op

revision = "auth_0003"
down_revision = "auth_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE auth.tokens ADD COLUMN queues text[] NOT NULL DEFAULT '{}'")
    op.execute("ALTER TABLE auth.tokens DROP CONSTRAINT tokens_kind_check")
    op.execute(
        "ALTER TABLE auth.tokens ADD CONSTRAINT tokens_kind_check"
        " CHECK (kind IN ('business', 'admin', 'service', 'worker'))"
    )
    op.execute(
        "ALTER TABLE auth.tokens ADD CONSTRAINT tokens_queues_check"
        " CHECK ((kind = 'worker') = (cardinality(queues) > 0))"
    )


def downgrade() -> None:
    op.execute("DELETE FROM auth.tokens WHERE kind = 'worker'")
    op.execute("ALTER TABLE auth.tokens DROP CONSTRAINT tokens_queues_check")
    op.execute("ALTER TABLE auth.tokens DROP CONSTRAINT tokens_kind_check")
    op.execute(
        "ALTER TABLE auth.tokens ADD CONSTRAINT tokens_kind_check"
        " CHECK (kind IN ('business', 'admin', 'service'))"
    )
    op.execute("ALTER TABLE auth.tokens DROP COLUMN queues")
