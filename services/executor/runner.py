"""One pass over a task: take its lease, recover what a crashed executor left RUNNING,
run every ready node (concurrently, bounded per downstream), then decide what happens to
the task (finish, short retry, demote, fail) and publish that through the outbox.

This is the only execution path: first runs, short retries and the reconciler's redrives
all arrive as task.create and come through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import httpx
from dispo.executor import repository as repo
from dispo.executor.actions import Call, CallOutcome, Result, run_action
from dispo.executor.breaker import Breaker
from dispo.executor.domain import (
    Next,
    NodeRun,
    RetryPolicy,
    blocked_by_failure,
    decide,
    ready,
    to_cancel,
)
from dispo.executor.envelope import payload_of
from dispo.executor.states import TASK_FINAL, NodeState, TaskState
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import ACK, Disposition, Nak
from dispo.libs.catalogue import Downstream
from dispo.libs.clock import Clock
from dispo.libs.contracts import tasks
from dispo.libs.error_text import truncate_error
from dispo.libs.logging import get_logger
from dispo.libs.outbox import OutboxRelay
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

log = get_logger(__name__)

PARKED = (TaskState.ACCEPTED, TaskState.RUNNING, TaskState.RETRY_EXHAUSTED, TaskState.DEMOTED)


@dataclass
class Pass:
    """What one pass over a task has done so far."""

    in_flight: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    attempted: set[str] = field(default_factory=set)
    ran: int = 0


@dataclass
class Step:
    state: Pass
    launch: list[NodeRun] = field(default_factory=list)
    disposition: Disposition | None = None
    lease_lost: bool = False


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

    # ---- task.create -------------------------------------------------------------------
    async def handle_create(self, env: task_pb2.Task) -> Disposition:
        owner = f"{self.config.instance}:{uuid.uuid4().hex[:8]}"
        task_id = env.task_id
        now = self.clock.now()
        async with self.engine.begin() as conn:
            opened = await self._open(conn, env, owner, now)
            if not isinstance(opened, tuple):
                return opened
            row, nodes, recovered = opened
            step = await self._step(
                conn, env, owner, Pass(), now, changed=recovered, loaded=(row, nodes)
            )
        self.relay.kick()
        if step.disposition is not None:
            return step.disposition
        heartbeat = asyncio.create_task(self._heartbeat(task_id, owner))
        try:
            return await self._loop(env, owner, step)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    async def _open(
        self,
        conn: AsyncConnection,
        env: task_pb2.Task,
        owner: str,
        now: datetime,
    ) -> Disposition | tuple[repo.TaskRow, dict[str, NodeRun], bool]:
        """Record the envelope, take the lease, recover interrupted nodes. Returns a
        disposition when there is nothing to run, else the task row (locked, leased to
        ``owner``), its nodes and whether recovery changed nodes."""
        task_id = env.task_id
        row = await repo.task_get(conn, task_id, for_update=True)
        if row is None:
            if await repo.task_insert(
                conn, env, task_id, now
            ):  # the new row is ours and locked: as written
                row = repo.TaskRow(
                    task_id,
                    TaskState.ACCEPTED,
                    env.generation,
                    0,
                    env.cancel_requested,
                    None,
                    None,
                    env,
                    "",
                )
        elif row.envelope is None:
            await repo.task_attach_envelope(conn, env)
            row = None
        elif env.generation < row.generation:
            log.info(
                "stale task.create dropped",
                task_id=task_id,
                generation=env.generation,
                recorded=row.generation,
            )
            return ACK
        elif env.generation > row.generation and row.status not in TASK_FINAL:
            reset = await repo.nodes_redrive(conn, env)
            log.info(
                "redrive applied",
                task_id=task_id,
                generation=env.generation,
                nodes_reset=reset,
                settled=list(env.redrive.settled_nodes),
            )
            row = None
        if row is None:  # written here (or inserted by a concurrent cancel): read it back
            row = await repo.task_get(conn, task_id, for_update=True)
        assert row is not None and row.envelope is not None
        if row.status in TASK_FINAL:
            if row.status is TaskState.CANCELLED:  # the cancel arrived before the task
                nodes = await repo.nodes_get(conn, row.envelope)
                pending = [n for n in nodes.values() if n.status is NodeState.PENDING]
                for node in pending:
                    await repo.node_set_status_if(
                        conn,
                        task_id,
                        node.node_id,
                        NodeState.PENDING,
                        NodeState.CANCELLED,
                        finished_at=now,
                    )
                if pending:
                    await repo.emit_status(conn, task_id, now)
            return ACK
        if row.leased_by_other(owner, now):
            remaining = (
                (row.lease_until - now).total_seconds()
                if row.lease_until
                else self.config.lease_ttl
            )
            log.info(
                "task leased by another executor; later", task_id=task_id, owner=row.lease_owner
            )
            return Nak(delay=min(max(remaining, 0.1), self.config.lease_ttl))
        await repo.lease_take(conn, task_id, owner, now, self.config.lease_ttl)
        row.lease_owner = owner  # the row stays locked until commit: this is its state now
        nodes = await repo.nodes_get(conn, row.envelope)
        recovered = await self._recover(conn, task_id, nodes, now)
        await repo.task_set_status(conn, task_id, TaskState.RUNNING, "", now, expected=PARKED)
        return row, nodes, recovered

    async def _recover(
        self, conn: AsyncConnection, task_id: str, nodes: dict[str, NodeRun], now: datetime
    ) -> bool:
        """Nodes left RUNNING by an executor whose lease expired: their call may have happened."""
        recovered = False
        for node in nodes.values():
            if node.status is not NodeState.RUNNING:
                continue
            if node.spec.idempotent:
                err = "executor stopped mid-call; re-run under the same idempotency key (action is idempotent)"
                await repo.node_set_status_if(
                    conn,
                    task_id,
                    node.node_id,
                    NodeState.RUNNING,
                    NodeState.UNKNOWN,
                    last_error=err,
                )
                await repo.node_set_status_if(
                    conn, task_id, node.node_id, NodeState.UNKNOWN, NodeState.PENDING
                )
                node.status = NodeState.PENDING
            else:
                err = "executor stopped mid-call; outcome unknown until probed"
                await repo.node_set_status_if(
                    conn,
                    task_id,
                    node.node_id,
                    NodeState.RUNNING,
                    NodeState.UNKNOWN,
                    last_error=err,
                    finished_at=now,
                )
                node.status = NodeState.UNKNOWN
            log.warning(
                "interrupted node recovered",
                task_id=task_id,
                node_id=node.node_id,
                status=node.status.value,
            )
            recovered = True
        return recovered

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
            async with self.engine.begin() as conn:
                step = await self._step(conn, env, owner, state, self.clock.now())
            self.relay.kick()

    async def _step(
        self,
        conn: AsyncConnection,
        env: task_pb2.Task,
        owner: str,
        state: Pass,
        now: datetime,
        *,
        changed: bool = False,
        loaded: tuple[repo.TaskRow, dict[str, NodeRun]] | None = None,
    ) -> Step:
        """One scheduling step in the caller's transaction: apply a cancel, doom nodes behind
        a failure, demote nodes behind an open breaker, pick the ready ones; with nothing
        ready and nothing in flight, settle the task. ``loaded``: the row (locked in this
        transaction) and nodes the caller has just read, so they are not read again.

        ``noop`` nodes make no external call, so they are claimed and recorded right here,
        in this transaction under the task's lock and lease (same guarded claim and
        record as any node); what they unblock is scheduled in the same step."""
        task_id = env.task_id
        if loaded is not None:
            row, nodes = loaded
        else:
            fetched = await repo.task_get(conn, task_id, for_update=True)
            assert fetched is not None
            row = fetched
            if row.lease_owner != owner:
                return Step(state, lease_lost=True)
            nodes = await repo.nodes_get(conn, env)
        while True:
            launch, noops, changed = await self._schedule(
                conn, task_id, row, nodes, state, now, changed
            )
            if not noops:
                break
            for node in noops:
                state.attempted.add(node.node_id)
                if await self._run_noop_here(conn, task_id, node, owner, now):
                    state.ran += 1
                    changed = True
        if not launch and not state.in_flight:
            return Step(
                state,
                disposition=await self._settle(conn, row, nodes, owner, state.ran, now, changed),
            )
        if changed:
            await repo.emit_status(conn, task_id, now)
        return Step(state, launch=launch)

    async def _schedule(
        self,
        conn: AsyncConnection,
        task_id: str,
        row: repo.TaskRow,
        nodes: dict[str, NodeRun],
        state: Pass,
        now: datetime,
        changed: bool,
    ) -> tuple[list[NodeRun], list[NodeRun], bool]:
        """Apply a cancel, doom nodes behind a failure, demote nodes behind an open breaker;
        returns the ready nodes to launch, the ready noop nodes and whether nodes changed."""
        if row.cancel_requested:
            for node_id in to_cancel(nodes):
                if node_id in state.in_flight:
                    continue  # launched: its claim fails on the cancel flag, then it is cancelled here
                changed |= await repo.node_set_status_if(
                    conn,
                    task_id,
                    node_id,
                    nodes[node_id].status,
                    NodeState.CANCELLED,
                    finished_at=now,
                )
                nodes[node_id].status = NodeState.CANCELLED
        for node_id in blocked_by_failure(nodes):
            changed |= await repo.node_set_status_if(
                conn,
                task_id,
                node_id,
                NodeState.PENDING,
                NodeState.DEPENDENCY_FAILED,
                finished_at=now,
                last_error="a dependency failed",
            )
            nodes[node_id].status = NodeState.DEPENDENCY_FAILED
        launch: list[NodeRun] = []
        noops: list[NodeRun] = []
        if not row.cancel_requested:
            for node in ready(nodes, now):
                if node.node_id in state.in_flight or node.node_id in state.attempted:
                    continue  # a retry waits for the next pass (a re-published task.create)
                if node.spec.kind == "noop":
                    noops.append(node)
                    continue
                breaker = self.breakers.get(node.spec.downstream)
                if node.spec.kind == "http" and breaker is not None and not breaker.allow(now):
                    changed |= await repo.node_set_status_if(
                        conn,
                        task_id,
                        node.node_id,
                        NodeState.PENDING,
                        NodeState.DEMOTED,
                        last_error=f"downstream {node.spec.downstream} degraded (circuit open)",
                    )
                    node.status = NodeState.DEMOTED
                    continue
                launch.append(node)
        return launch, noops, changed

    async def _run_node(self, env: task_pb2.Task, node: NodeRun, owner: str) -> bool:
        task_id = env.task_id
        downstream = self.registry.get(node.spec.downstream)
        limit = self.limits.get(node.spec.downstream)
        async with limit if limit is not None else contextlib.nullcontext():
            now = self.clock.now()
            async with self.engine.begin() as conn:
                if not await repo.node_claim_if_pending(conn, task_id, node.node_id, owner, now):
                    log.info("node claim lost", task_id=task_id, node_id=node.node_id)
                    return False
                await repo.emit_status(conn, task_id, now)
            self.relay.kick()
            call = Call(
                task_id,
                node.node_id,
                node.idempotency_key,
                node.spec,
                payload_of(env, node.cell_ref),
            )
            try:
                result = await run_action(self.http, call, downstream)
            except (
                Exception
            ) as error:  # a bug in an action must not leave the node RUNNING for ever
                result = Result(CallOutcome.RETRYABLE, truncate_error(f"action error: {error!r}"))
        await self._record(task_id, node, owner, result)
        return True

    @staticmethod
    async def _run_noop_here(
        conn: AsyncConnection, task_id: str, node: NodeRun, owner: str, now: datetime
    ) -> bool:
        """Claim and record a noop node in the caller's transaction (no status event)."""
        if not await repo.node_claim_if_pending(conn, task_id, node.node_id, owner, now):
            log.info("node claim lost", task_id=task_id, node_id=node.node_id)
            return False
        await repo.node_set_status_if(
            conn,
            task_id,
            node.node_id,
            NodeState.RUNNING,
            NodeState.SUCCEEDED,
            owner=owner,
            finished_at=now,
            last_error="",
            retryable=False,
        )
        node.status = NodeState.SUCCEEDED
        node.finished_at = now
        return True

    async def _record(self, task_id: str, node: NodeRun, owner: str, result: Result) -> None:
        now = self.clock.now()
        breaker = self.breakers.get(node.spec.downstream)
        if breaker is not None and node.spec.kind == "http":
            if result.outcome is CallOutcome.SUCCESS:
                breaker.record_success(now)
            elif result.outcome is CallOutcome.RETRYABLE:
                breaker.record_failure(now)
        round_attempts = node.round_attempts + 1
        if result.outcome is CallOutcome.SUCCESS:
            new, fields = (
                NodeState.SUCCEEDED,
                {"finished_at": now, "last_error": "", "retryable": False},
            )
        elif result.outcome is CallOutcome.PERMANENT:
            new, fields = (
                NodeState.FAILED,
                {"finished_at": now, "last_error": result.detail, "retryable": False},
            )
        elif self.config.retry.exhausted(round_attempts):
            new, fields = (
                NodeState.FAILED,
                {"finished_at": now, "last_error": result.detail, "retryable": True},
            )
        else:
            delay = self.config.retry.delay(round_attempts)
            new, fields = (
                NodeState.PENDING,
                {
                    "not_before": now + timedelta(seconds=delay),
                    "last_error": result.detail,
                    "retryable": True,
                },
            )
        async with self.engine.begin() as conn:
            if not await repo.node_set_status_if(
                conn, task_id, node.node_id, NodeState.RUNNING, new, owner=owner, **fields
            ):
                log.warning(
                    "node result lost a race (lease expired?)",
                    task_id=task_id,
                    node_id=node.node_id,
                )
                return
            await repo.emit_status(conn, task_id, now)
        self.relay.kick()
        log.info(
            "node finished",
            task_id=task_id,
            node_id=node.node_id,
            status=new.value,
            error=result.detail,
        )

    async def _settle(
        self,
        conn: AsyncConnection,
        row: repo.TaskRow,
        nodes: dict[str, NodeRun],
        owner: str,
        ran: int,
        now: datetime,
        changed: bool,
    ) -> Disposition:
        """Nothing more can run in this pass: finish, re-publish for a retry, demote or fail."""
        task_id = row.task_id
        decision = decide(nodes, now, row.cancel_requested)
        await repo.lease_release(conn, task_id, owner)
        if decision.next is Next.RETRY and ran == 0:
            # Nothing could run yet: the message came back before the backoff passed.
            if changed:
                await repo.emit_status(conn, task_id, now)
            wait = (decision.not_before - now).total_seconds() if decision.not_before else 0.1
            return Nak(delay=max(0.05, wait))
        # The pass made the task RUNNING when it took the lease, and holds the lease still.
        await repo.task_set_status(
            conn, task_id, decision.status, decision.reason, now, expected=(TaskState.RUNNING,)
        )
        generation = (
            await repo.task_bump_generation(conn, task_id)
            if decision.next is Next.RETRY
            else row.generation
        )
        snap = await repo.emit_status(conn, task_id, now)
        if decision.next is Next.RETRY:
            await repo.emit(
                conn, tasks.TASK_CREATE, tasks.create_id(task_id, generation), snap, now
            )
        elif decision.next is Next.DEMOTE:
            await repo.emit(
                conn, tasks.TASK_DEMOTE, tasks.demote_id(task_id, generation), snap, now
            )
        elif decision.next is Next.FAIL:
            await repo.emit(conn, tasks.TASK_FAIL, tasks.fail_id(task_id, generation), snap, now)
        log.info(
            "task pass done",
            task_id=task_id,
            next=decision.next.value,
            status=decision.status.value,
            reason=decision.reason,
        )
        return ACK
