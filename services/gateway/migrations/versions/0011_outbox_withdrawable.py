"""The outbox marks the rows no publisher has taken yet (ADR-0090): a cancel withdraws a
task.create only if it is still withdrawable, so never one the relay may have published.

Rows written before may be on their way to the bus: they take the default, not withdrawable.
Adding a column with a constant default rewrites nothing.

Revision ID: 0011
Revises: 0010
"""

from dispo.libs.outbox import withdraw_downgrade as downgrade
from dispo.libs.outbox import withdraw_upgrade as upgrade

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

__all__ = ["downgrade", "upgrade"]
