"""The reconciler as a real process beside a pipeline (gateway, executors, the demo
downstream): its clock is a file the test moves, so no test sleeps through a backoff; the
executors keep their fast test timings. Its fixtures (``start_reconciler``, ``reconciler``)
are in this folder's conftest."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as pb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from support import eventually


@dataclass
class Reconciler:
    process: Any
    clock: Any
    channel: grpc.aio.Channel
    stub: reconciler_pb2_grpc.ReconcilerServiceStub

    async def tick(self, seconds: float = 0.5, settle: float = 0.2) -> None:
        """Move the reconciler's clock; its sweep loop runs a round per 0.5 s of it. Only for
        loops that drive the clock until something happens: a move that lands while a round
        runs pushes the loop's next round on by as much, so one tick may run no round."""
        self.clock.advance(seconds=seconds)
        await asyncio.sleep(settle)

    async def sweep(self, seconds: float = 0.5, name: str = "all") -> dict[str, int]:
        """Move the clock, then run sweep ``name`` to its end (RunSweep): what it handled.
        What a single step of the clock, or a check that nothing happens, waits on."""
        self.clock.advance(seconds=seconds)
        request = pb.RunSweepRequest(sweep=pb.Sweep.Value(f"SWEEP_{name.upper()}"))
        return dict((await self.stub.RunSweep(request)).handled)

    async def sweep_past_effects(self, max_effect_seconds: float) -> dict[str, int]:
        """Move the clock past the moment an unfenced probe's "not done" becomes final for
        a node that became UNKNOWN (on the executor's clock, the system's) before now, then
        run every sweep to its end."""
        moment = max(self.clock.now, datetime.now(UTC))
        self.clock.set(moment + timedelta(seconds=max_effect_seconds + 1))
        return await self.sweep(0)

    async def held(self, task_id: str) -> pb.RecoveryTask | None:
        try:
            return (
                await self.stub.GetRecoveryTask(pb.GetRecoveryTaskRequest(task_id=task_id))
            ).task
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def wait_state(self, task_id: str, state: int, timeout: float = 30.0) -> pb.RecoveryTask:
        return await eventually(
            lambda: self.held(task_id),
            lambda task: task is not None and task.state == state,
            timeout=timeout,
            wanted=f"{task_id} in {pb.RecoveryState.Name(state)}",
        )
