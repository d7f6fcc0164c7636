"""One pass over a task: take its lease, recover what a crashed executor left RUNNING,
run every ready node (concurrently, bounded per downstream), then decide what happens to
the task (finish, short retry, demote, fail) and publish that through the outbox.

This is the only execution path: first runs, short retries and the reconciler's redrives
all arrive as task.create and come through here.

Each message is handled on its own, concurrently with the others in hand, but the database
work of their passes is group-committed (:class:`dispo.libs.batcher.Batcher`): the openings
waiting at a moment share one transaction and a few set-based statements
(:mod:`dispo.executor.passes`), and a message is answered only after that commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
from dispo.executor import repository as repo
from dispo.executor.actions import Call, Result, failed, run_action
from dispo.executor.breaker import Breaker
from dispo.executor.domain import NodeRun, RetryPolicy
from dispo.executor.envelope import payload_of
from dispo.executor.failures import CallOutcome, Move, Verdict, breaker_counts, next_move
from dispo.executor.passes import Opening, Pass, Passes, Step, Stepping, outcome_unknown
from dispo.executor.states import NodeState
from dispo.libs import metrics
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.batcher import Batcher
from dispo.libs.bus import Disposition, Nak
from dispo.libs.catalogue import Downstream
from dispo.libs.clock import Clock
from dispo.libs.logging import bind_ids, get_logger
from dispo.libs.outbox import OutboxRelay, Staged
from dispo.libs.tracing import current, span
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = get_logger(__name__)


@dataclass
class ExecutorConfig:
    instance: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    lease_ttl: float = 5.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    breaker_threshold: int = Breaker.threshold
    breaker_window: float = Breaker.window
    breaker_cooldown: float = Breaker.cooldown
    breaker_failure_ratio: float = Breaker.failure_ratio
    breaker_trial_calls: int = Breaker.trial_calls
    # Group commit of the database work: tasks per transaction, transactions at once.
    flush_max_items: int = 200
    flush_concurrency: int = 2


class Executor:
    def __init__(
        self,
        engine: AsyncEngine,
        relay: OutboxRelay,
        registry: dict[str, Downstream],
        clock: Clock,
        config: ExecutorConfig,
        http: httpx.AsyncClient,
    ) -> None:
        self.engine = engine
        self.relay = relay
        self.registry = registry
        self.clock = clock
        self.config = config
        self.http = http
        self.breakers = {
            name: Breaker(
                config.breaker_threshold,
                config.breaker_window,
                config.breaker_cooldown,
                config.breaker_failure_ratio,
                config.breaker_trial_calls,
            )
            for name in registry
        }
        self.limits = {
            name: asyncio.Semaphore(max(1, d.max_concurrency)) for name, d in registry.items()
        }
        self.passes = Passes(self.breakers, config.lease_ttl)
        self.openings: Batcher[Opening, Step] = Batcher(
            "task openings",
            self._open_flush,
            max_items=config.flush_max_items,
            concurrency=config.flush_concurrency,
            isolate=True,  # a task.create that cannot be opened fails alone
        )

    # ---- task.create -------------------------------------------------------------------
    async def handle_create(self, env: task_pb2.Task) -> Disposition:
        owner = f"{self.config.instance}:{uuid.uuid4().hex[:8]}"
        # Opened with the other task.create messages in hand, in one transaction; the
        # answer comes once that transaction committed.
        step = await self.openings.submit(Opening(env, owner, current()))
        if step.disposition is not None:
            return step.disposition
        heartbeat = asyncio.create_task(self._heartbeat(env.task_id, owner))
        try:
            return await self._loop(env, owner, step)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    async def _open_flush(self, openings: list[Opening]) -> Sequence[Step | BaseException]:
        now = self.clock.now()
        staged = Staged()
        async with self.engine.begin() as conn:
            steps = await self.passes.open_many(conn, openings, now, staged)
        self.relay.publish_committed(staged)
        return steps

    async def _heartbeat(self, task_id: str, owner: str) -> None:
        while True:
            await self.clock.sleep(self.config.lease_ttl / 3)
            with contextlib.suppress(Exception):
                async with self.engine.begin() as conn:
                    if not await repo.lease_extend(
                        conn, task_id, owner, self.clock.now(), self.config.lease_ttl
                    ):
                        log.warning("lease lost", task_id=task_id)
                        return

    async def _loop(self, env: task_pb2.Task, owner: str, step: Step) -> Disposition:
        """Launch what each step found ready; after each finished node take another step,
        until a step finds nothing to run and settles the task."""
        state = step.state
        while True:
            for node in step.launch:
                state.attempted.add(node.node_id)
                state.in_flight[node.node_id] = asyncio.create_task(
                    self._run_node(env, node, owner)
                )
            if step.lease_lost:
                log.warning("lease lost; stopping pass", task_id=env.task_id)
                await asyncio.gather(*state.in_flight.values(), return_exceptions=True)
                return Nak(
                    delay=1.0
                )  # whoever holds the task now finishes it; the message comes back
            if step.disposition is not None:
                return step.disposition
            done, _ = await asyncio.wait(
                state.in_flight.values(), return_when=asyncio.FIRST_COMPLETED
            )
            for node_id in [n for n, t in state.in_flight.items() if t in done]:
                finished = state.in_flight.pop(node_id)
                error = finished.exception()
                if error is not None:  # e.g. the database went away mid-pass:
                    await asyncio.gather(*state.in_flight.values(), return_exceptions=True)
                    raise error  # nak; the lease expires; recovery
                state.ran += 1 if finished.result() else 0
            staged = Staged()
            async with self.engine.begin() as conn:
                step = await self._step(conn, env, owner, state, self.clock.now(), staged)
            self.relay.publish_committed(staged)

    async def _step(
        self,
        conn: AsyncConnection,
        env: task_pb2.Task,
        owner: str,
        state: Pass,
        now: datetime,
        staged: Staged,
    ) -> Step:
        """The pass's next scheduling step (:meth:`Passes.step_many`), in the caller's
        transaction, if it still holds the lease; its outbox rows staged in ``staged``."""
        row = await repo.task_get(conn, env.task_id, for_update=True)
        assert row is not None
        if row.lease_owner != owner:
            return Step(state, lease_lost=True)
        nodes = await repo.nodes_get(conn, env)
        stepping = Stepping(env, owner, state, row, nodes, trace=current())
        [step] = await self.passes.step_many(conn, [stepping], now, staged)
        return step

    async def _run_node(self, env: task_pb2.Task, node: NodeRun, owner: str) -> bool:
        attributes = {
            "dispo.task_id": env.task_id,
            "dispo.node_id": node.node_id,
            "dispo.cell": node.cell,
            "dispo.action": node.action,
            "dispo.downstream": node.spec.downstream,
            "dispo.attempt": node.attempts + 1,
        }
        with span("node run", attributes):
            return await self._run_node_traced(env, node, owner)

    async def _run_node_traced(self, env: task_pb2.Task, node: NodeRun, owner: str) -> bool:
        task_id = env.task_id
        bind_ids(node_id=node.node_id)  # this node's own asyncio task: its lines only
        downstream = self.registry.get(node.spec.downstream)
        limit = self.limits.get(node.spec.downstream)
        async with limit if limit is not None else contextlib.nullcontext():
            now = self.clock.now()
            staged = Staged()
            async with self.engine.begin() as conn:
                if not await repo.node_claim_if_pending(conn, task_id, node.node_id, owner, now):
                    log.info("node claim lost", task_id=task_id, node_id=node.node_id)
                    return False
                await repo.emit_status(conn, task_id, now, current(), staged)
            self.relay.publish_committed(staged)
            call = Call(
                task_id,
                node.node_id,
                node.idempotency_key,
                node.spec,
                payload_of(env, node.cell_ref),
            )
            sent = time.perf_counter()
            try:
                result = await run_action(self.http, call, downstream)
            except Exception as error:  # a bug must not leave the node RUNNING for ever;
                # whether the call went out is not known
                result = failed(CallOutcome.AMBIGUOUS, f"action error: {error!r}")
            took = time.perf_counter() - sent
        await self._record(task_id, node, owner, result, took)
        return True

    @staticmethod
    def _fields(move: Move, result: Result, now: datetime) -> tuple[NodeState, dict[str, Any]]:
        """The node's new state and columns for a ``move`` that does not go through UNKNOWN
        (those are :func:`outcome_unknown`'s)."""
        assert not move.unknown
        if move.verdict is Verdict.SUCCEEDED:
            return NodeState.SUCCEEDED, {"finished_at": now, "last_error": "", "retryable": False}
        if move.verdict is Verdict.FAILED:
            return NodeState.FAILED, {
                "finished_at": now,
                "last_error": result.detail,
                "retryable": move.retryable,
            }
        return NodeState.PENDING, {
            "not_before": move.not_before,
            "last_error": result.detail,
            "retryable": True,
        }

    async def _record(
        self, task_id: str, node: NodeRun, owner: str, result: Result, took: float
    ) -> None:
        """Record a finished call by its class (:mod:`dispo.executor.failures`): SUCCEEDED,
        FAILED, a short retry (PENDING after the backoff, or the Retry-After asked for), or,
        for an ambiguous call of an action that is not idempotent, UNKNOWN — the same move
        as for a node an executor stopped in the middle of (:func:`passes.outcome_unknown`)."""
        now = self.clock.now()
        breaker = self.breakers.get(node.spec.downstream)
        if breaker is not None and node.spec.kind == "http":
            health = breaker_counts(result.outcome)
            if health is True:
                breaker.record_success(now)
            elif health is False:
                breaker.record_failure(now)
        move = next_move(
            result.outcome,
            node.spec.idempotent,
            node.round_attempts + 1,
            self.config.retry,
            now,
            result.retry_after,
        )
        staged = Staged()
        async with self.engine.begin() as conn:
            if move.unknown:
                recorded = await outcome_unknown(
                    conn, task_id, node, now, result.detail, owner=owner, not_before=move.not_before
                )
                new = node.status
            else:
                new, fields = self._fields(move, result, now)
                recorded = await repo.node_set_status_if(
                    conn, task_id, node.node_id, NodeState.RUNNING, new, owner=owner, **fields
                )
            if not recorded:
                log.warning(
                    "node result lost a race (lease expired?)",
                    task_id=task_id,
                    node_id=node.node_id,
                )
                return
            await repo.emit_status(conn, task_id, now, current(), staged)
        self.relay.publish_committed(staged)
        metrics.node_ran(
            node.action, node.spec.downstream, new.value, took, move.verdict is Verdict.RETRY
        )
        log.info(
            "node finished",
            task_id=task_id,
            node_id=node.node_id,
            status=new.value,
            outcome=result.outcome.value,
            error=result.detail,
        )
