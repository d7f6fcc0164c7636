"""The service's quarantine: the JetStream messages its consumers gave up on
(dispo.libs.quarantine).

Revision ID: rec_0005
Revises: rec_0004
"""

from dispo.libs.quarantine.schema import create_quarantine, drop_quarantine

revision = "rec_0005"
down_revision = "rec_0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    create_quarantine()


def downgrade() -> None:
    drop_quarantine()
