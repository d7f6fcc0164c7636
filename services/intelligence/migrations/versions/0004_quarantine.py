"""The service's quarantine: the JetStream messages its consumers gave up on
(dispo.libs.quarantine).

Revision ID: 0004
Revises: 0003
"""

from dispo.libs.quarantine.schema import create_quarantine, drop_quarantine

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_quarantine()


def downgrade() -> None:
    drop_quarantine()
