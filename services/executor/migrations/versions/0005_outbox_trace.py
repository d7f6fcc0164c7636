"""The outbox keeps each row's trace context (libs/tracing.py): the status, task.fail and
task.demote events of a task carry the trace its task.create came with.

Revision ID: 0005
Revises: 0004
"""

from dispo.libs.outbox import trace_downgrade as downgrade
from dispo.libs.outbox import trace_upgrade as upgrade

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

__all__ = ["downgrade", "upgrade"]
