"""The read model speaks of evaluations, as every other context does (docs/glossary.md):
``campaigns`` becomes ``evaluations``, ``campaign_runs`` becomes ``evaluation_runs`` and
every ``campaign_id`` column, constraint and index is renamed to match. Renames only; no
data changes.

Revision ID: 0002
Revises: 0001
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# (kind, table, old, new) in the order they apply; downgrade runs them backwards.
RENAMES = [
    ("TABLE", "campaigns", "campaigns", "evaluations"),
    ("COLUMN", "evaluations", "campaign_id", "evaluation_id"),
    ("CONSTRAINT", "evaluations", "campaigns_pkey", "evaluations_pkey"),
    ("CONSTRAINT", "evaluations", "ck_campaign_line", "ck_evaluation_line"),
    ("CONSTRAINT", "evaluations", "ck_campaign_status", "ck_evaluation_status"),
    ("INDEX", "", "ix_campaigns_baseline", "ix_evaluations_baseline"),
    ("TABLE", "campaign_runs", "campaign_runs", "evaluation_runs"),
    ("COLUMN", "evaluation_runs", "campaign_id", "evaluation_id"),
    ("CONSTRAINT", "evaluation_runs", "campaign_runs_pkey", "evaluation_runs_pkey"),
    (
        "CONSTRAINT",
        "evaluation_runs",
        "campaign_runs_campaign_id_fkey",
        "evaluation_runs_evaluation_id_fkey",
    ),
    (
        "CONSTRAINT",
        "evaluation_runs",
        "campaign_runs_latency_ms_check",
        "evaluation_runs_latency_ms_check",
    ),
    ("INDEX", "", "ix_campaign_runs_campaign", "ix_evaluation_runs_evaluation"),
    ("COLUMN", "intelligence_jobs", "campaign_id", "evaluation_id"),
    ("COLUMN", "intelligence_jobs", "baseline_campaign_id", "baseline_evaluation_id"),
    (
        "CONSTRAINT",
        "intelligence_jobs",
        "intelligence_jobs_campaign_id_fkey",
        "intelligence_jobs_evaluation_id_fkey",
    ),
]


def _statement(kind: str, table: str, old: str, new: str) -> str:
    if kind == "TABLE":
        return f"ALTER TABLE {old} RENAME TO {new}"
    if kind == "INDEX":
        return f"ALTER INDEX {old} RENAME TO {new}"
    return f"ALTER TABLE {table} RENAME {kind} {old} TO {new}"


def upgrade() -> None:
    for kind, table, old, new in RENAMES:
        op.execute(_statement(kind, table, old, new))


def downgrade() -> None:
    # Backwards, a table's columns and constraints are renamed while it still has its new
    # name, and the table itself last.
    for kind, table, old, new in reversed(RENAMES):
        op.execute(_statement(kind, table, new, old))
