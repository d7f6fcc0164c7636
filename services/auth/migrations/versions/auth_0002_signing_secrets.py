"""Webhook signing secrets per business (dispo.auth.signing, ADR-0043).

Each row holds a random salt, never a secret: the secret is derived from the salt under the
signing key only the gateway and the reconciler hold, so the SELECT every service's role has
on this schema reveals nothing that signs. A business has at most one current secret
(``retires_at`` NULL); during a rotation its previous one stays valid until ``retires_at``.

Revision ID: auth_0002
Revises: auth_0001
"""

from alembic import op

revision = "auth_0002"
down_revision = "auth_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE auth.signing_secrets (
            id text PRIMARY KEY,
            business text NOT NULL CONSTRAINT signing_secrets_business_check
                CHECK (business <> ''),
            salt bytea NOT NULL,
            key_id text NOT NULL,
            created_at timestamptz NOT NULL,
            retires_at timestamptz
        )
        """
    )
    op.execute(
        "CREATE UNIQUE INDEX signing_secrets_current_idx ON auth.signing_secrets (business)"
        " WHERE retires_at IS NULL"
    )
    op.execute(
        "CREATE INDEX signing_secrets_business_idx ON auth.signing_secrets (business, created_at)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE auth.signing_secrets")
