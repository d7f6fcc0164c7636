"""``auto_intelligence_eligible``: the one guard for automatic triggers.

Used by both automatic chains: a completed campaign starts its analysis, and a completed
analysis starts the period comparison.
"""

from __future__ import annotations

from dispo.intelligence.campaigns import Campaign, Line
from dispo.intelligence.models import ModelRegistry


def auto_intelligence_eligible(campaign: Campaign, models: ModelRegistry) -> bool:
    """Formal-line campaigns whose analysis model resolves; trial lines never run by themselves."""
    return (
        campaign.line == Line.FORMAL and models.resolve(campaign.analysis_model).model is not None
    )
