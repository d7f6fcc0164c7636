"""Outbox attempts and quarantine (libs/outbox.py, ADR-0034): a row that cannot be
published counts its attempts and keeps its last error, and after the last attempt is
quarantined, skipped by the relay, so the rows behind it go out.

Revision ID: 0005
Revises: 0004
"""

from dispo.libs.outbox import quarantine_downgrade as downgrade
from dispo.libs.outbox import quarantine_upgrade as upgrade

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

__all__ = ["downgrade", "upgrade"]
