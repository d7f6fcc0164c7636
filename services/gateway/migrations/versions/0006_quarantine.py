"""The service's quarantine: the JetStream messages its consumers gave up on
(dispo.libs.quarantine).

Revision ID: 0006
Revises: 0005
"""

from dispo.libs.quarantine.schema import create_quarantine, drop_quarantine

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_quarantine()


def downgrade() -> None:
    drop_quarantine()
