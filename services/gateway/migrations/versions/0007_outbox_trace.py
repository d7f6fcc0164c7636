"""The outbox keeps each row's trace context (libs/tracing.py): a Submit's trace travels
with its task.create message to the executor.

Revision ID: 0007
Revises: 0006
"""

from dispo.libs.outbox import trace_downgrade as downgrade
from dispo.libs.outbox import trace_upgrade as upgrade

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

__all__ = ["downgrade", "upgrade"]
