"""``auto_intelligence_eligible``: the one guard for automatic triggers.

Used by both automatic chains: a completed evaluation starts its analysis, and a completed
analysis starts the period comparison.
"""

from __future__ import annotations

from dispo.intelligence.analysis_models import ModelRegistry
from dispo.intelligence.evaluations import Evaluation
from dispo.libs.evaluation import Line


def auto_intelligence_eligible(evaluation: Evaluation, models: ModelRegistry) -> bool:
    """Formal-line evaluations whose analysis model resolves; trial lines never run by themselves."""
    return (
        evaluation.line == Line.FORMAL
        and models.resolve(evaluation.analysis_model).model is not None
    )
