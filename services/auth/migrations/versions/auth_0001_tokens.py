"""The token store: API tokens by the SHA-256 of their secret (dispo.libs.auth, ADR-0040).

Every service reads it to check the callers of its RPCs; only the gateway writes it: the
schema is the gateway's role's, and the other services' roles are granted SELECT on its
tables by the database bootstrap (dispo.libs.db.roles.SCHEMAS).

Revision ID: auth_0001
Revises:
"""

from alembic import op

revision = "auth_0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE auth.tokens (
            id text PRIMARY KEY,
            secret_sha256 text NOT NULL UNIQUE,
            kind text NOT NULL CONSTRAINT tokens_kind_check
                CHECK (kind IN ('business', 'admin', 'service')),
            business text NOT NULL DEFAULT '',
            service text NOT NULL DEFAULT '',
            label text NOT NULL DEFAULT '',
            created_at timestamptz NOT NULL,
            expires_at timestamptz,
            revoked_at timestamptz,
            CONSTRAINT tokens_binding_check CHECK (
                (kind = 'business') = (business <> '') AND (kind = 'service') = (service <> '')
            )
        )
        """
    )
    op.execute("CREATE INDEX tokens_business_idx ON auth.tokens (business, created_at)")


def downgrade() -> None:
    op.execute("DROP TABLE auth.tokens")
