"""One pass over a task: take its lease, recover what a crashed executor left RUNNING,
run every ready node (concurrently, bounded per downstream), then decide what happens to
the task (finish, short retry, demote, fail) and publish that through the outbox.

This is the only execution path: first runs, short retries and the reconciler's redrives
all arrive as task.create and come through here.

Each message is handled on its own, concurrently with the others in hand; its database
work goes through the port :class:`~dispo.executor.commits.Commits` (group-committed with
the other passes' by default), and a message is answered only after that commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import aiohttp
import httpx
from dispo.executor import plan
from dispo.executor.actions import (
    Call,
    Result,
    failed,
    not_sent_without_lease,
    not_sent_without_share,
    run_action,
)
from dispo.executor.breaker import Breaker
from dispo.executor.commits import (
    Advance,
    Claim,
    Commits,
    Flushes,
    GroupCommits,
    InlineCommits,
    Progress,
    Recording,
)
from dispo.executor.domain import ActionSpec, NodeRun, RetryPolicy
from dispo.executor.envelope import payload_of
from dispo.executor.failures import CallOutcome, Move, Verdict, breaker_counts, next_move
from dispo.executor.fair import equal, priority_of
from dispo.executor.intake import Intake
from dispo.executor.passes import Opening, Pass, Passes, Step
from dispo.executor.per_business import BusinessLimits
from dispo.executor.plan import NodeChange
from dispo.executor.shares import SHARE_LEASE, DownstreamShares
from dispo.executor.slots import Pace, Slots
from dispo.executor.states import NodeState
from dispo.executor.store.worker_runs import Offer
from dispo.executor.worker_runs import QueuePolicy, WorkerRuns
from dispo.libs import metrics, references
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.bus import Disposition, Nak
from dispo.libs.catalogue import DEFAULT_WORKER_TIMEOUT_MS, BusinessLimit, Downstream
from dispo.libs.clock import Clock
from dispo.libs.contracts.tasks import blocker
from dispo.libs.db.driver import Database
from dispo.libs.logging import bind_ids, get_logger
from dispo.libs.outbox import OutboxRelay
from dispo.libs.payload import canonical_json, parse_json_value
from dispo.libs.tracing import current, span

log = get_logger(__name__)

# The ends of a node its "node finished" line is logged at INFO for (else DEBUG).
FAILED_NODE = frozenset({NodeState.FAILED, NodeState.UNKNOWN})

# A task.create of a task with a pass in this process comes back after this many seconds.
IN_HAND_DELAY = 0.5


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
    # A running task's progress is published at most this often (ADR-0059).
    progress_interval: float = 1.0
    # Group commit (the default), or each write its own transaction (ADR-0088).
    group_commit: bool = True
    # A call leaves only while its pass's lease runs at least this much longer (None: a
    # fifth of the lease); below twice this the pass extends its lease before sending
    # (ADR-0066).
    send_margin: float | None = None
    # How long a worker holds a run without a heartbeat (ADR-0099).
    run_lease: float = 10.0
    # How long a worker run waits offered on a queue with no live worker before its node
    # is demoted (ADR-0101).
    queue_idle: float = 30.0
    # Passes running at once at most, and task.create messages of one business held
    # waiting for one beyond them (ADR-0109).
    passes: int = 512
    business_hold: int = 512
    # task.create messages in hand at most (the consumer's batch): the passes and the
    # messages waiting for one.
    in_hand: int = 2048
    # The downstreams' limits held across every executor, through shares leased in the
    # database for this long (ADR-0108; the service renews them on a timer); else each
    # limit counted in this process alone.
    cluster_limits: bool = True
    share_lease: float = SHARE_LEASE

    @property
    def margin(self) -> float:
        return self.send_margin if self.send_margin is not None else self.lease_ttl / 5


class Executor:
    def __init__(
        self,
        db: Database,
        relay: OutboxRelay,
        registry: dict[str, Downstream],
        clock: Clock,
        config: ExecutorConfig,
        http: aiohttp.ClientSession,
        health: httpx.AsyncClient,
        queue_limits: dict[str, int] | None = None,
        weight: Callable[[str], int] = equal,
        policy_businesses: tuple[str, ...] = (),
        timeouts: dict[str, float] | None = None,
        queue_rates: dict[str, int] | None = None,
    ) -> None:
        self.db = db
        self.relay = relay
        self.registry = registry
        # The limits each downstream's slots and pace were made for (a newer catalogue
        # version that changes them makes new ones).
        self.registry_limits = {n: _limits(d) for n, d in registry.items()}
        self.clock = clock
        self.config = config
        self.http = http  # action calls
        self.health = health  # downstream health checks
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
        # The downstreams' call slots and paces: this process's shares of their limits,
        # renewed by ``shares`` (ADR-0108), or the whole of each (counted here alone); a
        # slot goes to the next waiter in the fair order (ADR-0109).
        self.shares: DownstreamShares | None = None
        if config.cluster_limits:
            self.shares = DownstreamShares.of(
                db,
                clock,
                config.instance,
                registry,
                timeouts or {n: d.timeout_ms / 1000 for n, d in registry.items()},
                config.share_lease,
                weight,
            )
            self.slots, self.paces = self.shares.slots, self.shares.paces
            assert self.shares.business is not None
            self.business = self.shares.business
        else:
            # Each business's own slots and paces, counted here alone.
            self.business = BusinessLimits(clock, leased=False)
            for name, d in registry.items():
                self.business.put(name, d.per_business)
            self.slots = {
                name: Slots(d.max_concurrency, weight=weight) for name, d in registry.items()
            }
            self.paces = {
                name: Pace(d.max_calls_per_second, clock)
                for name, d in registry.items()
                if d.max_calls_per_second
            }
        # Which task.create messages in hand run their pass next: the fair order (ADR-0109).
        self.intake = Intake(
            config.passes,
            config.business_hold,
            weight,
            capacity=max(0, config.in_hand - config.passes),
        )
        self.weight = weight
        self.policy_businesses = policy_businesses  # named in the business policy file
        self.passes = Passes(self.breakers, config.lease_ttl, self.slots, self.business)
        # Where the passes' database work commits: the transactions, and the port the
        # loop calls (group-committed: the items of every pass in hand share them).
        self.flushes = Flushes(db, relay, clock, self.passes, config.lease_ttl)
        self.commits: Commits = (
            GroupCommits(self.flushes, config.flush_max_items, config.flush_concurrency)
            if config.group_commit
            else InlineCommits(self.flushes)
        )
        # The worker runs this process offers and waits for (ADR-0099).
        self.worker_runs = WorkerRuns(
            db,
            clock,
            config.run_lease,
            QueuePolicy(
                config.queue_idle,
                queue_limits or {},
                {b: weight(b) for b in policy_businesses},
                weight(""),  # no business is named "": the policy's default
                lambda: self.intake.paused,
                dict(queue_rates or {}),
            ),
            self.commits.complete,
        )
        # The tasks with a pass in this process: one pass per task at a time (a second
        # delivery of its message waits until the first pass ends).
        self.in_hand: set[str] = set()

    def use_catalogue(
        self,
        registry: dict[str, Downstream],
        queue_limits: dict[str, int],
        queue_rates: dict[str, int] | None = None,
    ) -> None:
        """Take a newer catalogue version's downstreams and queue limits (ADR-0111). A new
        downstream gets its breaker and call slots; a changed limit new slots for the calls
        that start from now on (those under way give theirs back where they took them); a
        downstream the version no longer has stays known, for the tasks accepted before."""
        for name, downstream in registry.items():
            self.registry[name] = downstream
            if name not in self.breakers:
                self.breakers[name] = Breaker(
                    self.config.breaker_threshold,
                    self.config.breaker_window,
                    self.config.breaker_cooldown,
                    self.config.breaker_failure_ratio,
                    self.config.breaker_trial_calls,
                )
            slots = self.slots.get(name)
            known = self.registry_limits.get(name)
            wanted = _limits(downstream)
            if slots is None or known != wanted:
                self.registry_limits[name] = wanted
                if self.shares is not None:  # leased across the cluster (ADR-0108)
                    longest = self.shares.timeouts.get(name, 0.0)
                    self.shares.put(name, downstream, max(longest, downstream.timeout_ms / 1000))
                else:
                    self.slots[name] = Slots(downstream.max_concurrency, weight=self.weight)
                    self.business.put(name, downstream.per_business)
                    if downstream.max_calls_per_second:
                        self.paces[name] = Pace(downstream.max_calls_per_second, self.clock)
                    else:
                        self.paces.pop(name, None)
        # The passes read the same maps (an empty one given at start was replaced there).
        self.passes.breakers, self.passes.slots = self.breakers, self.slots
        policy = self.worker_runs.policy
        policy.limits.clear()
        policy.limits.update(queue_limits)
        policy.rates.clear()
        policy.rates.update(queue_rates or {})

    # ---- task.create -------------------------------------------------------------------
    async def handle_create(self, env: task_pb2.Task) -> Disposition:
        if env.task_id in self.in_hand:
            # A second delivery while a pass of this task runs here (its message came back
            # to this process, e.g. after a pause): two passes of one task in one process
            # could each be answered the other's claims. It comes back after this one.
            log.warning("task already has a pass here; later", task_id=env.task_id)
            return Nak(delay=IN_HAND_DELAY)
        self.in_hand.add(env.task_id)
        try:
            comeback = await self.intake.enter(env.business, priority_of(env.priority))
            if comeback is not None:  # its business holds its share of the messages in hand
                return Nak(delay=comeback)
            try:
                return await self._handle_create(env)
            finally:
                self.intake.leave(env.business)
        finally:
            self.in_hand.discard(env.task_id)

    async def _handle_create(self, env: task_pb2.Task) -> Disposition:
        owner = f"{self.config.instance}:{uuid.uuid4().hex[:8]}"
        # Opened with the other task.create messages in hand, in one transaction; the
        # answer comes once that transaction committed.
        step = await self.commits.open(Opening(env, owner, current()))
        if step.disposition is not None:
            return step.disposition
        heartbeat = asyncio.create_task(self._heartbeat(env.task_id, owner, step.state))
        try:
            return await self._loop(env, owner, step)
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            timer = step.state.progress_timer
            if timer is not None:  # its progress went with the pass's last event
                timer.cancel()

    def _progress(self, env: task_pb2.Task, owner: str, state: Pass) -> None:
        """Progress the pass has not published: publish it once the progress interval has
        passed (one status event of the task as it is then), unless the pass ends first
        (its last event says it all)."""
        if state.unreported and state.progress_timer is None:
            state.progress_timer = asyncio.create_task(
                self._publish_progress(env, owner, state, current())
            )

    async def _publish_progress(
        self, env: task_pb2.Task, owner: str, state: Pass, trace: str | None
    ) -> None:
        await self.clock.sleep(self.config.progress_interval)
        # Progress from here on is the next event's: the one below may predate it.
        state.unreported, state.progress_timer = False, None
        try:
            await self.commits.progress(Progress(env.task_id, owner, trace))
        except Exception:  # e.g. the database went away: the next event, or the pass's end
            state.unreported = True

    async def _heartbeat(self, task_id: str, owner: str, state: Pass) -> None:
        """Extend the pass's lease every third of its duration. One that cannot be extended
        stops the pass's sends at once (``state.lease_lost``); one whose extension fails
        (the database away) runs out, and the sends stop at the margin before its end."""
        while True:
            await self.clock.sleep(self.config.lease_ttl / 3)
            with contextlib.suppress(Exception):
                if not await self._extend(task_id, owner, state):
                    return

    async def _extend(self, task_id: str, owner: str, state: Pass) -> bool:
        """Extend the pass's lease now; False (and the pass's sends stopped) when another
        owner holds it, or none does."""
        until = await self.commits.extend(task_id, owner)
        if until is None:
            if not state.lease_lost:  # said once, by whichever finds it first
                log.warning("lease lost", task_id=task_id)
            state.lease_lost = True
            return False
        if state.lease_until is None or until > state.lease_until:
            state.lease_until = until
        return True

    async def _may_send(self, task_id: str, owner: str, state: Pass) -> bool:
        """The fence before a call leaves (ADR-0066): the pass's lease must run at least
        twice the send margin longer, else it is extended first; a lease that cannot be
        extended (lost, or the database away) sends nothing. The call's connection checks
        the margin once more right before its request is written (:func:`run_action`)."""
        margin = self.config.margin
        if state.holds_lease(self.clock.now(), 2 * margin):
            return True
        if state.lease_lost:
            return False
        try:
            await self._extend(task_id, owner, state)
        except Exception:
            return False
        return state.holds_lease(self.clock.now(), 2 * margin)

    async def _loop(self, env: task_pb2.Task, owner: str, step: Step) -> Disposition:
        """Launch what each step found ready; after each finished node record its call and
        take another step (one flush, with the other passes' at that moment), until a step
        finds nothing to run and settles the task."""
        state = step.state
        while True:
            for node in step.launch:
                state.attempted.add(node.node_id)
                state.in_flight[node.node_id] = asyncio.create_task(
                    # RUNNING: claimed by the step, with its call slot
                    self._run_node(
                        env, node, owner, state, claimed=node.status is NodeState.RUNNING
                    )
                )
            if step.lease_lost:
                log.warning("lease lost; stopping pass", task_id=env.task_id)
                await self._record_rest(env, owner, state)
                return Nak(delay=1.0)  # whoever holds the task now finishes it; it comes back
            if step.disposition is not None:
                return step.disposition
            self._progress(env, owner, state)  # the pass goes on: what it did so far, later
            done, _ = await asyncio.wait(
                state.in_flight.values(), return_when=asyncio.FIRST_COMPLETED
            )
            calls: list[Recording] = []
            for node_id in [n for n, t in state.in_flight.items() if t in done]:
                finished = state.in_flight.pop(node_id)
                error = finished.exception()
                if error is not None:  # e.g. the database went away mid-pass:
                    await self._record_rest(env, owner, state, calls)
                    raise error  # nak; the lease expires; recovery
                call = finished.result()
                if call is not None:
                    state.ran += 1
                    calls.append(call)
            step = await self.commits.advance(Advance(env, owner, state, calls, current()))
            self._recorded(env.task_id, calls)

    async def _gather(self, state: Pass) -> list[Recording | None]:
        """The calls still in flight, once they ended (a failed one as None)."""
        running = list(state.in_flight.values())
        state.in_flight.clear()
        ended = await asyncio.gather(*running, return_exceptions=True)
        return [c if isinstance(c, Recording) else None for c in ended]

    async def _record_rest(
        self,
        env: task_pb2.Task,
        owner: str,
        state: Pass,
        calls: list[Recording] | None = None,
    ) -> None:
        """The pass stops: record the calls that ended and those still in flight once they
        end (each guarded by its run's owner), without another step."""
        calls = (calls or []) + [c for c in await self._gather(state) if c]
        if not calls:
            return
        with contextlib.suppress(Exception):  # unrecorded, a node stays RUNNING: recovery
            await self.commits.advance(Advance(env, owner, state, calls, current(), final=True))
            self._recorded(env.task_id, calls)

    async def _run_node(
        self, env: task_pb2.Task, node: NodeRun, owner: str, state: Pass, claimed: bool = False
    ) -> Recording | None:
        attributes = {
            "dispo.task_id": env.task_id,
            "dispo.node_id": node.node_id,
            "dispo.cell": node.cell,
            "dispo.action": node.action,
            "dispo.downstream": node.spec.downstream,
            "dispo.attempt": node.attempts if claimed else node.attempts + 1,
        }
        with span("node run", attributes):
            return await self._run_node_traced(env, node, owner, state, claimed)

    async def _run_node_traced(
        self, env: task_pb2.Task, node: NodeRun, owner: str, state: Pass, claimed: bool
    ) -> Recording | None:
        """Make the node's call and say what to record. A node its step did not claim
        (``claimed``: claimed, with its downstream's call slot and its business's) waits for
        its business's slot of the downstream, if the downstream limits each business, then
        for the downstream's, then is claimed (None: the claim was lost). The slots are
        given back when the call ends, the downstream's first."""
        task_id = env.task_id
        bind_ids(node_id=node.node_id)  # this node's own asyncio task: its lines only
        downstream = self.registry.get(node.spec.downstream)
        slots = self.slots.get(node.spec.downstream)
        own = self.business.slots_of(node.spec.downstream, env.business)
        held = own_held = claimed  # a step claims only with its slots
        try:
            if not claimed:
                priority = priority_of(env.priority)
                if own is not None:
                    await own.take(env.business, priority)
                    own_held = True
                if slots is not None:
                    await slots.take(env.business, priority)
                    held = True
                won = await self.commits.claim(Claim(task_id, node.node_id, owner))
                if won is None:
                    log.debug("node claim lost", task_id=task_id, node_id=node.node_id)
                    return None
                node.status, node.attempts, node.round_attempts = (
                    NodeState.RUNNING, won.attempts, won.round_attempts,
                )  # fmt: skip
                state.unreported = True
                self._progress(env, owner, state)
            sent = time.perf_counter()
            inputs = await self._inputs(env, node)
            if isinstance(inputs, Result):  # a reference its inputs cannot answer: not sent
                result = inputs
            elif not await self._within_limits(node, slots, own, env.business):
                result = not_sent_without_share()
            elif not await self._may_send(task_id, owner, state):
                result = not_sent_without_lease()
            else:
                margin = self.config.margin
                spec, body = inputs
                call = Call(task_id, node.node_id, node.idempotency_key, spec, body, node.attempts)
                try:
                    if spec.kind == "worker":
                        result = await self._run_worker(call, node, owner, env)
                    else:
                        result = await run_action(
                            self.http,
                            call,
                            downstream,
                            lambda: state.holds_lease(self.clock.now(), margin),
                        )
                except Exception as error:  # a bug must not leave the node RUNNING for ever;
                    # whether the call went out is not known
                    result = failed(CallOutcome.AMBIGUOUS, f"action error: {error!r}")
            took = time.perf_counter() - sent
        finally:
            if held and slots is not None:
                slots.give_back()
            if own_held and own is not None:
                own.give_back()
        return self._recording(task_id, node, owner, result, took)

    async def _within_limits(
        self, node: NodeRun, slots: Slots | None, own: Slots | None, business: str
    ) -> bool:
        """An HTTP call's turn under its downstream's limits (ADR-0108): its business's pace
        turn in this second (a downstream limited per business), then the downstream's, and
        slots whose shares outlast the call's timeout. False: not sent (no share proven
        within a share lease)."""
        if node.spec.kind != "http":
            return True
        name = node.spec.downstream
        patience = self.config.share_lease
        for pace in (self.business.pace_of(name, business), self.paces.get(name)):
            if pace is not None and not await pace.wait(patience):
                return False
        downstream = self.registry.get(name)
        if downstream is None:
            return True
        timeout = (node.spec.timeout_ms or downstream.timeout_ms) / 1000
        now = self.clock.now()
        return all(s is None or s.covers(now, timeout) for s in (own, slots))

    async def _run_worker(
        self, call: Call, node: NodeRun, owner: str, env: task_pb2.Task
    ) -> Result:
        """A worker node's call: its run offered on its queue in its task's place in the
        fair order (business, priority), then its outcome awaited
        (:mod:`dispo.executor.worker_runs`)."""
        spec = call.spec
        offer = Offer(
            call.task_id,
            call.node_id,
            spec.queue,
            owner,
            call.attempt,
            call.idempotency_key,
            node.action,
            spec.idempotent,
            spec.timeout_ms or DEFAULT_WORKER_TIMEOUT_MS,
            call.body,
            business=env.business,
            priority=priority_of(env.priority),
        )
        return await self.worker_runs.run(offer, spec, self.commits.offer)

    async def _inputs(self, env: task_pb2.Task, node: NodeRun) -> tuple[ActionSpec, bytes] | Result:
        """The node's action and body with the references to its inputs' outputs resolved
        (ADR-0093; read from their rows), or the definite failure of a reference they
        cannot answer."""
        body = payload_of(env, node.cell_ref)
        if not node.spec.inputs:
            return node.spec, body
        recorded = await self.commits.outputs(env.task_id, node.spec.inputs)
        outputs = {node_id: parse_json_value(raw) for node_id, raw in recorded.items()}
        try:
            path = references.resolve_path(node.spec.path, outputs)
            value = references.resolve_value(parse_json_value(body), outputs)
        except references.MissingOutput as missing:
            return failed(CallOutcome.DEFINITE, f"not sent: {missing}")
        return node.spec._replace(path=path), canonical_json(value)

    @staticmethod
    def _fields(move: Move, result: Result, now: datetime) -> tuple[NodeState, dict[str, Any]]:
        """The node's new state and columns for a ``move`` that does not go through UNKNOWN
        (those are :func:`plan.unknown_change`'s)."""
        assert not move.unknown
        if move.verdict is Verdict.SUCCEEDED:
            return NodeState.SUCCEEDED, {
                "finished_at": now, "last_error": "", "retryable": False, "output": result.output,
            }  # fmt: skip
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

    def _recording(
        self, task_id: str, node: NodeRun, owner: str, result: Result, took: float
    ) -> Recording:
        """What to record for a finished call, by its class (:mod:`dispo.executor.failures`):
        SUCCEEDED, FAILED, a short retry (PENDING after the backoff, or the Retry-After asked
        for), or, for an ambiguous call of an action that is not idempotent, UNKNOWN — the
        same move as for a node an executor stopped in the middle of
        (:func:`plan.unknown_change`). The call counts for the downstream's breaker now."""
        now = self.clock.now()
        breaker = self.breakers.get(node.spec.downstream)
        if breaker is not None and node.spec.kind == "http" and not result.fenced:
            health = breaker_counts(result.outcome)
            if health is True:
                breaker.record_success(now)
            elif health is False:
                breaker.record_failure(now)
        move = next_move(
            result.outcome,
            node.spec.idempotent,
            node.round_attempts,  # this call's, counted by its claim
            self.config.retry,
            now,
            result.retry_after,
        )
        if result.demoted:  # never taken by a worker: parked for the reconciler (ADR-0101)
            fields = {"last_error": result.detail, "retryable": True}
            change = NodeChange(
                task_id, node.node_id, NodeState.RUNNING, NodeState.DEMOTED, owner, fields
            )
            metrics.node_demoted(node.action, blocker(node.spec.downstream, node.spec.queue))
        elif move.unknown:  # then PENDING again at once if idempotent
            change = plan.unknown_change(
                task_id, node, now, result.detail, owner=owner, not_before=move.not_before
            )
        else:
            new, fields = self._fields(move, result, now)
            change = NodeChange(task_id, node.node_id, NodeState.RUNNING, new, owner, fields)
        return Recording(node, result, move, change, took)

    @staticmethod
    def _recorded(task_id: str, calls: list[Recording]) -> None:
        for c in calls:
            if not c.recorded:
                log.warning(
                    "node result lost a race (lease expired?)",
                    task_id=task_id,
                    node_id=c.node.node_id,
                )
                continue
            new = c.change.new
            metrics.node_ran(
                c.node.action, c.node.spec.downstream, new.value, c.took,
                c.move.verdict is Verdict.RETRY,
            )  # fmt: skip
            # A line per node only where it failed (its error is said nowhere else); the
            # task's own line says how it ended (one line per task at INFO).
            (log.info if new in FAILED_NODE else log.debug)(
                "node finished",
                task_id=task_id,
                node_id=c.node.node_id,
                status=new.value,
                outcome=c.result.outcome.value,
                error=c.result.detail,
            )


def _limits(downstream: Downstream) -> tuple[int, int, BusinessLimit]:
    """The limits a downstream's slots and paces are made for."""
    return (
        downstream.max_concurrency,
        downstream.max_calls_per_second,
        downstream.per_business,
    )
