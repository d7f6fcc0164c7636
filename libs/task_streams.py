"""The JetStream streams of the task envelope contract (protos/dispo/task/v1/task.proto).

The gateway, the executor and the reconciler all publish to and consume from them, and
each ensures them at start; they declare them from here so the configuration is one.
"""

from __future__ import annotations

from dispo.libs.bus import Bus

TASKS_STREAM = "TASKS"
TASK_SUBJECTS = ["task.create", "task.fail", "task.demote", "task.cancel", "task.close"]
STATUS_STREAM = "TASK_STATUS"
STATUS_SUBJECTS = ["task.status.>"]
# Status snapshots are for live views; the services' tables keep the history.
STATUS_MAX_AGE = 7 * 24 * 3600.0


async def ensure_task_streams(bus: Bus) -> None:
    await bus.ensure_stream(TASKS_STREAM, TASK_SUBJECTS)
    await bus.ensure_stream(STATUS_STREAM, STATUS_SUBJECTS, max_age=STATUS_MAX_AGE)
