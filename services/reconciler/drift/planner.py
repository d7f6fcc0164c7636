"""Decides the repairs from the pool's DB view and its driver's actual crons. Pure."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from dispo.libs.repairs import RepairKind


class RepairOutcome(enum.StrEnum):
    APPLIED = "applied"
    SKIPPED = "skipped"  # the drift was gone when the pool re-checked it
    FAILED = "failed"


FINISHED = ("completed", "cancelled")


@dataclass(frozen=True)
class DbCron:
    id: str
    status: str  # idle | busy | stuck
    evaluation_id: str


@dataclass(frozen=True)
class View:
    driver: str
    db_crons: dict[str, DbCron]
    driver_states: dict[str, dict[str, Any]]  # cron id -> {"status": ..., "eval_id": ...}
    evaluations: dict[str, tuple[str, str]]  # evaluation id -> (status, assigned cron id or "")


@dataclass(frozen=True)
class PlannedRepair:
    kind: RepairKind
    cron_id: str
    evaluation_id: str
    reason: str


def expected_state(cron: DbCron) -> dict[str, Any]:
    return {"status": cron.status, "eval_id": cron.evaluation_id}


def plan_repairs(view: View) -> list[PlannedRepair]:
    plan: list[PlannedRepair] = []
    touched: set[str] = set()
    for cron_id in sorted(view.driver_states.keys() - view.db_crons.keys()):
        plan.append(
            PlannedRepair(
                RepairKind.REMOVE_ORPHAN,
                cron_id,
                "",
                f"{view.driver} has cron {cron_id}; the pool's database does not",
            )
        )
    for cron_id in sorted(view.db_crons.keys() - view.driver_states.keys()):
        if view.db_crons[cron_id].status != "stuck":  # stuck crons are being removed anyway
            plan.append(
                PlannedRepair(
                    RepairKind.RECREATE_MISSING,
                    cron_id,
                    "",
                    f"the pool's database expects cron {cron_id}; {view.driver} lacks it",
                )
            )
            touched.add(cron_id)
    for cron in sorted(view.db_crons.values(), key=lambda c: c.id):
        if cron.status == "busy" and cron.evaluation_id:
            status, _ = view.evaluations.get(cron.evaluation_id, ("", ""))
            if status in FINISHED:
                plan.append(
                    PlannedRepair(
                        RepairKind.RELEASE_FINISHED,
                        cron.id,
                        cron.evaluation_id,
                        f"cron {cron.id} is busy with evaluation {cron.evaluation_id}, which is {status}",
                    )
                )
                touched.add(cron.id)
    for evaluation_id, (_status, cron_id) in sorted(view.evaluations.items()):
        if not cron_id:
            continue
        holder = view.db_crons.get(cron_id)
        if holder is None or holder.status != "busy" or holder.evaluation_id != evaluation_id:
            held = (
                "missing"
                if holder is None
                else f"{holder.status}"
                + (f" with {holder.evaluation_id}" if holder.evaluation_id else "")
            )
            reason = f"evaluation {evaluation_id} is assigned to cron {cron_id}, which is {held} in the database"
        else:
            state = view.driver_states.get(cron_id)
            if state is None or (
                state.get("status") == "busy" and state.get("eval_id") == evaluation_id
            ):
                continue
            reason = (
                f"evaluation {evaluation_id} is assigned to cron {cron_id}, whose {view.driver} state is "
                f"{state.get('status', '?')}"
                + (f" with {state['eval_id']}" if state.get("eval_id") else "")
            )
        plan.append(PlannedRepair(RepairKind.REQUEUE_EVALUATION, cron_id, evaluation_id, reason))
        touched.add(cron_id)
    for cron_id in sorted(view.db_crons.keys() & view.driver_states.keys() - touched):
        cron = view.db_crons[cron_id]
        state = view.driver_states[cron_id]
        if cron.status != "stuck" and state != expected_state(cron):
            plan.append(
                PlannedRepair(
                    RepairKind.REWRITE_STATE,
                    cron_id,
                    cron.evaluation_id,
                    f"{view.driver} state of {cron_id} is {state}; the database says "
                    f"{expected_state(cron)}",
                )
            )
    return plan
