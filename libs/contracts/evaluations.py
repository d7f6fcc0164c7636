"""The cron pool's evaluation events (protos/dispo/pool/v1/events.proto) on the bus:
published by the pool through its outbox, consumed by the intelligence service in order
per evaluation (a completion reports its run count and waits for those runs)."""

from __future__ import annotations

from dispo.libs.bus import Bus
from dispo.libs.contracts._streams import Durable, Flow, Stream

EVALUATION_STARTED = "evaluation.started"  # EvaluationStarted
EVALUATION_RUN_RECORDED = "evaluation.run_recorded"  # EvaluationRunRecorded
EVALUATION_COMPLETED = "evaluation.completed"  # EvaluationCompleted
EVALUATION_ALL = "evaluation.>"

# Kept until the intelligence service's durable (its setting's default name) has acknowledged
# each event (ADR-0092).
EVALUATIONS = Stream(
    "EVALUATIONS",
    (EVALUATION_ALL,),
    retention="interest",
    durables=(Durable("intelligence-evaluations", (EVALUATION_ALL,)),),
)

# Core NATS (no stream): wakes one cron worker of the local driver, pool.wake.<cron_id>.
POOL_WAKE = "pool.wake"


# Who publishes and who consumes each subject. The pool's local-driver worker
# (``dispo.pool.worker``) is part of the pool and connects as the pool.
FLOWS = (
    Flow(EVALUATION_ALL, ("pool",), ("intelligence",), EVALUATIONS),
    Flow(f"{POOL_WAKE}.*", ("pool",), ("pool",)),
)


def pool_wake(cron_id: str) -> str:
    return f"{POOL_WAKE}.{cron_id}"


def started_id(evaluation_id: str) -> str:
    return f"{evaluation_id}:started"


def run_recorded_id(run_id: str) -> str:
    return run_id


def completed_id(evaluation_id: str) -> str:
    return f"{evaluation_id}:completed"


async def ensure_evaluation_stream(bus: Bus, *, update: bool = True) -> None:
    """``update=False`` for the intelligence service, which consumes it only."""
    await EVALUATIONS.ensure(bus, update=update)
