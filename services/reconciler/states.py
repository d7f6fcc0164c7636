"""State machines of the reconciler, declared once. Every guarded write checks its move
against these tables first (each package's ``store``: recovery, completion, arbitration). The
database mirrors the enums with the CHECK constraints listed in ``CHECKED_COLUMNS``;
``tests/reconciler/test_recovery_states.py`` compares the migrated schema with the enums,
so a state added here without a migration fails it. Stored values are the member names
in lower case; protos and the API's free-string fields carry the names (ADR 0017).

A recovery entry is the reconciler's record of one task it holds. Who moves it *out* of
each state:

- PARKED_FAILED: the redrive sweep (→ REDRIVEN when due; the policy was checked at intake),
  an operator (→ REDRIVEN, ABANDONED).
- AWAITING_SETTLEMENT: the settlement sweep, after probing the UNKNOWN nodes
  (→ PARKED_FAILED when settled, → AWAITING_DECISION when an operator must decide).
- AWAITING_DECISION: an operator's ResolveNode (→ REDRIVEN) or AbandonTask; the expire
  sweep past its age limit (→ FAILED).
- DEMOTED: the release sweep when its downstreams are healthy and not paused (→ REDRIVEN);
  the expire sweep past its age limit (→ FAILED).
- REDRIVEN: intake, when the task comes back on task.fail / task.demote (→ FAILED when it
  ended FAILED); the completion consumer, when it finishes SUCCEEDED or CANCELLED
  (→ RESOLVED).
- FAILED: ended (a permanent failure, a spent policy, an age limit); an operator resumes it
  (RedriveTask → REDRIVEN) or records a decision on its UNKNOWN nodes (ResolveNode → FAILED).
- RESOLVED, ABANDONED: terminal.
"""

from __future__ import annotations

import enum

from dispo.libs.states import EnumCheck, Transitions


class RecoveryState(enum.StrEnum):
    PARKED_FAILED = "parked_failed"
    AWAITING_SETTLEMENT = "awaiting_settlement"
    AWAITING_DECISION = "awaiting_decision"
    DEMOTED = "demoted"
    REDRIVEN = "redriven"
    RESOLVED = "resolved"
    FAILED = "failed"
    ABANDONED = "abandoned"


R = RecoveryState
# Parked: the task is waiting with the reconciler (intake may replace its picture).
PARKED = frozenset({R.PARKED_FAILED, R.AWAITING_SETTLEMENT, R.AWAITING_DECISION, R.DEMOTED})
RECOVERY_TRANSITIONS = Transitions[RecoveryState](
    "recovery",
    {
        R.PARKED_FAILED: PARKED | {R.REDRIVEN, R.FAILED, R.ABANDONED, R.RESOLVED},
        R.AWAITING_SETTLEMENT: PARKED | {R.REDRIVEN, R.FAILED, R.ABANDONED, R.RESOLVED},
        R.AWAITING_DECISION: PARKED | {R.REDRIVEN, R.FAILED, R.ABANDONED, R.RESOLVED},
        R.DEMOTED: PARKED | {R.REDRIVEN, R.FAILED, R.ABANDONED, R.RESOLVED},
        R.REDRIVEN: PARKED | {R.FAILED, R.RESOLVED},
        R.RESOLVED: frozenset(),
        R.FAILED: frozenset({R.REDRIVEN, R.FAILED}),
        R.ABANDONED: frozenset(),
    },
)
RECOVERY_FINAL = RECOVERY_TRANSITIONS.final
# Ended here: no envelope arriving on task.fail / task.demote changes the row (a FAILED one
# comes back only through an operator's resume).
RECOVERY_ENDED = RECOVERY_FINAL | {R.FAILED}


class WorkKind(enum.StrEnum):
    """What an entry of the one list of failed and parked work is (ListFailedWork), by the
    recovery state of its task."""

    FAILED = "failed"  # ended FAILED: resumable by an operator
    AWAITING_REDRIVE = "awaiting_redrive"  # failed, an automatic redrive scheduled
    DEMOTED = "demoted"  # parked behind a degraded downstream
    UNKNOWN_OUTCOME = "unknown_outcome"  # UNKNOWN nodes to settle


WORK_KIND_STATES: dict[WorkKind, tuple[RecoveryState, ...]] = {
    WorkKind.FAILED: (R.FAILED,),
    WorkKind.AWAITING_REDRIVE: (R.PARKED_FAILED,),
    WorkKind.DEMOTED: (R.DEMOTED,),
    WorkKind.UNKNOWN_OUTCOME: (R.AWAITING_SETTLEMENT, R.AWAITING_DECISION),
}
WORK_KIND_OF = {state: kind for kind, states in WORK_KIND_STATES.items() for state in states}


class NotifyState(enum.StrEnum):
    """Delivery of the completion notification ("caller notified")."""

    NONE = "none"  # no callback was asked for
    PENDING = "pending"
    DELIVERED = "delivered"
    GAVE_UP = "gave_up"


NOTIFY_TRANSITIONS = Transitions[NotifyState](
    "notify",
    {
        NotifyState.NONE: frozenset(),
        # PENDING -> PENDING: a failed attempt, the next one scheduled.
        NotifyState.PENDING: frozenset(
            {NotifyState.PENDING, NotifyState.DELIVERED, NotifyState.GAVE_UP}
        ),
        NotifyState.DELIVERED: frozenset(),
        NotifyState.GAVE_UP: frozenset(),
    },
)


class ReconcileState(enum.StrEnum):
    """The reconcile sweep over a finished task ("external state reconciled")."""

    PENDING = "pending"
    MATCHED = "matched"
    MISMATCH = "mismatch"
    NOT_SAMPLED = "not_sampled"
    NOTHING_TO_PROBE = "nothing_to_probe"


RECONCILE_TRANSITIONS = Transitions[ReconcileState](
    "reconcile",
    {
        # PENDING -> PENDING: the probe could not answer; the next attempt scheduled.
        ReconcileState.PENDING: frozenset(
            {
                ReconcileState.PENDING,
                ReconcileState.MATCHED,
                ReconcileState.MISMATCH,
                ReconcileState.NOT_SAMPLED,
                ReconcileState.NOTHING_TO_PROBE,
            }
        ),
        ReconcileState.MATCHED: frozenset(),
        ReconcileState.MISMATCH: frozenset(),
        ReconcileState.NOT_SAMPLED: frozenset(),
        ReconcileState.NOTHING_TO_PROBE: frozenset(),
    },
)


class ClaimState(enum.StrEnum):
    """A task's claim on a conflict target, as seen by arbitration."""

    OPEN = "open"  # no verdict yet; may still meet a conflicting claim within the window
    WON = "won"
    LOST = "lost"
    UNCONTESTED = "uncontested"  # the window passed with no conflict


CLAIM_TRANSITIONS = Transitions[ClaimState](
    "claim",
    {
        ClaimState.OPEN: frozenset({ClaimState.WON, ClaimState.LOST, ClaimState.UNCONTESTED}),
        # A later, stronger claim within the window may still overrule an earlier winner.
        ClaimState.WON: frozenset({ClaimState.LOST}),
        ClaimState.LOST: frozenset(),
        ClaimState.UNCONTESTED: frozenset(),
    },
)


class CompensationState(enum.StrEnum):
    """A compensating cell submitted to the gateway for an arbitration loser."""

    PENDING = "pending"
    SUBMITTED = "submitted"
    FAILED = "failed"  # refused by the gateway (e.g. a payload the cell does not accept)


COMPENSATION_TRANSITIONS = Transitions[CompensationState](
    "compensation",
    {
        # PENDING -> PENDING: the gateway could not be reached; the next attempt scheduled.
        CompensationState.PENDING: frozenset(
            {CompensationState.PENDING, CompensationState.SUBMITTED, CompensationState.FAILED}
        ),
        CompensationState.SUBMITTED: frozenset(),
        CompensationState.FAILED: frozenset(),
    },
)


class SettlementMethod(enum.StrEnum):
    PROBE = "probe"
    IDEMPOTENT_RERUN = "idempotent_rerun"
    OPERATOR = "operator"


# Every enum mirrored by a CHECK constraint.
CHECKED_COLUMNS = (
    EnumCheck("recovery_tasks", "state", "ck_recovery_state", RecoveryState),
    EnumCheck("completions", "notify_state", "ck_completion_notify", NotifyState),
    EnumCheck("completions", "reconcile_state", "ck_completion_reconcile", ReconcileState),
    EnumCheck("claims", "state", "ck_claim_state", ClaimState),
    EnumCheck("settlements", "method", "ck_settlement_method", SettlementMethod),
    EnumCheck("compensations", "state", "ck_compensation_state", CompensationState),
)
