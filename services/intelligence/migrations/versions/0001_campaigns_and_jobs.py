"""Campaign read model (campaigns, runs) and intelligence jobs.

Revision ID: 0001
Revises:
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Mirrors of the status machines in dispo.intelligence.campaigns / .jobs (a test compares them).
UPGRADE = """
CREATE TABLE campaigns (
    campaign_id     text PRIMARY KEY,
    series          text NOT NULL,
    line            text NOT NULL CONSTRAINT ck_campaign_line CHECK (line IN ('formal', 'trial')),
    status          text NOT NULL CONSTRAINT ck_campaign_status
                    CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    period          text NOT NULL,
    configuration   jsonb NOT NULL,
    fingerprint     text NOT NULL,
    analysis_model  text,
    created_at      timestamptz NOT NULL,
    updated_at      timestamptz NOT NULL,
    completed_at    timestamptz
);
CREATE INDEX ix_campaigns_baseline ON campaigns (series, line, fingerprint, status, period);

CREATE TABLE campaign_runs (
    run_id          text PRIMARY KEY,
    campaign_id     text NOT NULL REFERENCES campaigns (campaign_id),
    case_id         text NOT NULL,
    verdict         text NOT NULL CONSTRAINT ck_run_verdict CHECK (verdict IN ('pass', 'fail', 'error')),
    score           double precision NOT NULL,
    latency_ms      bigint NOT NULL CHECK (latency_ms >= 0),
    failure_reason  text NOT NULL DEFAULT '',
    recorded_at     timestamptz NOT NULL
);
CREATE INDEX ix_campaign_runs_campaign ON campaign_runs (campaign_id);

CREATE TABLE intelligence_jobs (
    kind                  text NOT NULL CONSTRAINT ck_job_kind CHECK (kind IN ('analysis', 'comparison')),
    campaign_id           text NOT NULL REFERENCES campaigns (campaign_id),
    status                text NOT NULL CONSTRAINT ck_job_status
                          CHECK (status IN ('queued', 'generating', 'completed', 'failed')),
    error                 text CONSTRAINT ck_job_error_length CHECK (char_length(error) <= 500),
    attempts              integer NOT NULL DEFAULT 0,
    recovery_attempts     integer NOT NULL DEFAULT 0,
    analysis_model        text,
    baseline_campaign_id  text,
    fingerprint           text,
    result                jsonb,
    claim_token           text,
    claimed_at            timestamptz,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    started_at            timestamptz,
    finished_at           timestamptz,
    PRIMARY KEY (kind, campaign_id),
    CONSTRAINT ck_job_generating_claimed CHECK (status <> 'generating' OR claim_token IS NOT NULL)
);
CREATE INDEX ix_intelligence_jobs_status ON intelligence_jobs (status, updated_at);
CREATE INDEX ix_intelligence_jobs_created ON intelligence_jobs (created_at, campaign_id, kind);
"""


def upgrade() -> None:
    for statement in UPGRADE.split(";"):
        if statement.strip():
            op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TABLE intelligence_jobs; DROP TABLE campaign_runs; DROP TABLE campaigns")
