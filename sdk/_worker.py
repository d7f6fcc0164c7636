"""A worker: your own async functions as the actions of ``kind: worker`` (ADR-0099).

    worker = Worker("127.0.0.1:50052", token=...)

    @worker.action("tickets")                     # the catalogue action's `queue`
    async def open_ticket(ctx, payload):
        ticket = await tracker.open(payload["name"], key=ctx.idempotency_key)
        return {"ticket_id": ticket.id}           # the node's output

    asyncio.run(worker.run())                     # until SIGTERM / worker.stop()

The worker long-polls the executor for runs of its queues (at most ``concurrency`` at
once), heartbeats the runs it holds on its own, and completes each with the handler's
returned value (its output), its exception (a failure: retryable when it is a
:class:`RetryableError`) or, for a run it never started, "not sent". A run whose lease is
lost (a heartbeat says it is not held any more) has its handler cancelled and is never
completed; ``ctx.lease_lost`` is set first.

A worker may also answer the **probes** of its queues (ADR-0100): whether the effect of a
run whose outcome was lost (its worker vanished mid-run) happened, so the node is settled
without an operator::

    @worker.probe("tickets")
    async def ticket_opened(ctx):                 # ctx.idempotency_key, ctx.attempt
        ticket = await tracker.find(key=ctx.idempotency_key)
        if ticket:
            return ProbeAnswer(done=True, output={"ticket_id": ticket.id})  # SUCCEEDED
        await tracker.refuse(key=ctx.idempotency_key)       # never opened from now on
        return ProbeAnswer(done=False, fenced=True)         # runs again at once

Completions travel together: the runs that end while a ``CompleteRuns`` call is on its
way go in the next one (each recorded or refused on its own), so a busy worker makes one
call for many runs and an idle one sends each at once. An executor without
``CompleteRuns`` gets one ``CompleteRun`` per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import grpc
from dispo.libs.api.executor.v1 import worker_pb2, worker_pb2_grpc
from dispo.libs.auth import open_channel
from dispo.libs.batcher import Batcher
from dispo.libs.payload import canonical_json, json_payload, payload_value
from dispo.libs.timestamps import from_timestamp
from dispo.libs.tls import ClientTLS


class _Log:
    """The worker's lines on the standard library's logger ``dispo.sdk.worker`` (an SDK
    leaves logging to its application): ``event key=value ...``."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("dispo.sdk.worker")

    def _emit(self, level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
        if self.logger.isEnabledFor(level):
            detail = " ".join(f"{key}={value}" for key, value in fields.items())
            self.logger.log(level, "%s %s", event, detail, exc_info=exc_info)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, **fields)

    def exception(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, exc_info=True, **fields)


log = _Log()

Handler = Callable[["RunContext", Any], Awaitable[Any]]
ProbeHandler = Callable[["RunContext"], Awaitable["ProbeAnswer | None"]]

# How long one PollRuns waits for a run (ms), and the pause after a failed call (s).
POLL_WAIT_MS = 10_000
RETRY_PAUSE = 1.0
# One CompleteRuns carries at most this many runs, and at most about this many bytes of
# outcomes (far below the executor's message limit; a larger outcome goes alone).
COMPLETE_MAX_RUNS = 100
COMPLETE_MAX_BYTES = 1 << 20

Completed = worker_pb2.RunCompletion


def completion_calls(
    requests: list[worker_pb2.CompleteRunRequest], max_bytes: int = COMPLETE_MAX_BYTES
) -> list[list[worker_pb2.CompleteRunRequest]]:
    """The completions, in order, cut into calls of at most ``max_bytes`` each (one larger
    than that alone in its call)."""
    calls: list[list[worker_pb2.CompleteRunRequest]] = []
    size = 0
    for request in requests:
        n = request.ByteSize()
        if not calls or size + n > max_bytes:
            calls.append([])
            size = 0
        calls[-1].append(request)
        size += n
    return calls


class RetryableError(Exception):
    """Raised by a handler whose run had no effect and may be tried again (a short retry, as
    for an http 503). Any other exception fails the node for good."""


@dataclass(frozen=True)
class ProbeAnswer:
    """What a probe handler says of the effect it is asked about: ``done`` (with the
    effect's ``output``, the node's), or not done — ``fenced`` when the handler made sure it
    never will be under this key (up to ``ctx.attempt``), so the node runs again at once;
    without it, "not done" is final only once the action's ``max_effect_seconds`` passed. A
    handler that returns None (or raises) gives no answer: asked again later."""

    done: bool
    output: Any = None
    fenced: bool = False


@dataclass
class RunContext:
    """What a handler knows of its run."""

    task_id: str
    node_id: str
    action: str
    queue: str
    # The node's stable key: the same on every attempt (deduplicate effects by it).
    idempotency_key: str
    attempt: int
    # When the run is given up: an outcome after it is not recorded.
    deadline: datetime | None
    # Set when the worker no longer holds the run (the handler is then cancelled).
    lease_lost: asyncio.Event = field(default_factory=asyncio.Event)
    # A probe run (ADR-0100): the question whether the effect of ``attempt`` under
    # ``idempotency_key`` happened.
    probe: bool = False


@dataclass
class _Held:
    token: str
    context: RunContext
    task: asyncio.Task[None] | None = None


class Worker:
    """Serves the queues of the actions registered with :meth:`action`.

    ``address``: an executor's gRPC address (any replica); ``token``: the caller's API token
    (default ``DISPO_TOKEN``); ``tls`` as :class:`dispo.sdk.AsyncClient` takes it;
    ``concurrency``: runs handled at once at most; ``grace``: how long :meth:`stop` (and
    SIGTERM under :meth:`run`) lets runs in flight finish before handing them back."""

    def __init__(
        self,
        address: str = "127.0.0.1:50052",
        token: str | None = None,
        *,
        concurrency: int = 10,
        tls: ClientTLS | None = None,
        grace: float = 30.0,
        worker_id: str | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.address = address
        self.token = token if token is not None else os.environ.get("DISPO_TOKEN", "").strip()
        self.tls = tls
        self.concurrency = concurrency
        self.grace = grace
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.handlers: dict[str, Handler] = {}
        self.probes: dict[str, ProbeHandler] = {}
        self.held: dict[str, _Held] = {}
        self._stopping: asyncio.Event | None = None
        self._stub: worker_pb2_grpc.WorkerServiceAsyncStub | None = None
        self._lease = 10.0
        self._free: asyncio.Event | None = None
        # Set when a poll announces a lease other than the one the heartbeat paces by.
        self._lease_news: asyncio.Event | None = None
        # The completions on their way: one call at a time, those ending meanwhile next.
        self._completions: Batcher[worker_pb2.CompleteRunRequest, Completed] | None = None
        # False once the executor answered CompleteRuns UNIMPLEMENTED: a call per run.
        self._batched = True

    # ---- registration -------------------------------------------------------------------
    def action(self, queue: str) -> Callable[[Handler], Handler]:
        """Register ``async def handler(ctx, payload) -> dict | None`` for the runs of
        ``queue`` (the catalogue action's ``queue``)."""

        def register(handler: Handler) -> Handler:
            if queue in self.handlers:
                raise ValueError(f"queue {queue!r} already has a handler")
            self.handlers[queue] = handler
            return handler

        return register

    def probe(self, queue: str) -> Callable[[ProbeHandler], ProbeHandler]:
        """Register ``async def handler(ctx) -> ProbeAnswer | None`` for the probes of
        ``queue``: whether the effect of a run of it whose outcome was lost happened."""

        def register(handler: ProbeHandler) -> ProbeHandler:
            if queue in self.probes:
                raise ValueError(f"queue {queue!r} already has a probe handler")
            self.probes[queue] = handler
            return handler

        return register

    # ---- running ------------------------------------------------------------------------
    async def run(self, *, handle_signals: bool = True) -> None:
        """Poll and run until :meth:`stop` (or SIGTERM / SIGINT with ``handle_signals``),
        then hand back what is left once the grace has passed."""
        if not self.handlers and not self.probes:
            raise ValueError("no action registered: use @worker.action(queue)")
        self._stopping = asyncio.Event()
        self._free = asyncio.Event()
        self._lease_news = asyncio.Event()
        self._completions = Batcher(
            "run completions", self._send_completions, max_items=COMPLETE_MAX_RUNS
        )
        loop = asyncio.get_running_loop()
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self._stopping.set)
        channel = open_channel(self.address, self.token, tls=self.tls)
        self._stub = worker_pb2_grpc.WorkerServiceStub(channel)
        log.info(
            "worker started",
            worker_id=self.worker_id,
            queues=sorted(self.handlers),
            probes=sorted(self.probes),
        )
        heartbeat = asyncio.create_task(self._heartbeat())
        polling = asyncio.create_task(self._poll())
        try:
            await self._stopping.wait()
        finally:
            polling.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await polling
            await self._drain()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await heartbeat
            await channel.close()
            log.info("worker stopped", worker_id=self.worker_id)

    def stop(self, grace: float | None = None) -> None:
        """Stop taking runs; runs in flight get ``grace`` seconds (default: the worker's)
        to finish before they are handed back."""
        if grace is not None:
            self.grace = grace
        if self._stopping is not None:
            self._stopping.set()

    async def _drain(self) -> None:
        """Let the runs in flight finish within the grace, then hand back the rest."""
        running = [h.task for h in self.held.values() if h.task is not None]
        if running:
            await asyncio.wait(running, timeout=self.grace)
        left = list(self.held.values())
        if not left:
            return
        for h in left:
            if h.task is not None:
                h.task.cancel()
        try:
            assert self._stub is not None
            await self._stub.ReleaseRuns(
                worker_pb2.ReleaseRunsRequest(
                    worker_id=self.worker_id, run_tokens=[h.token for h in left]
                ),
                timeout=10,
            )
            log.info("runs handed back", worker_id=self.worker_id, runs=len(left))
        except grpc.aio.AioRpcError as error:
            log.warning("runs not handed back", worker_id=self.worker_id, error=error.details())
        self.held.clear()

    async def _poll(self) -> None:
        assert self._stub is not None and self._free is not None
        queues, probes = sorted(self.handlers), sorted(self.probes)
        while True:
            credit = self.concurrency - len(self.held)
            if credit <= 0:
                self._free.clear()
                await self._free.wait()
                continue
            try:
                reply = await self._stub.PollRuns(
                    worker_pb2.PollRunsRequest(
                        queues=queues,
                        probe_queues=probes,
                        worker_id=self.worker_id,
                        max_runs=min(credit, 100),
                        wait_ms=POLL_WAIT_MS,
                    ),
                    timeout=POLL_WAIT_MS / 1000 + 10,
                )
            except grpc.aio.AioRpcError as error:
                log.warning("poll failed; again shortly", error=error.details(), code=error.code())
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if reply.lease_ms and reply.lease_ms / 1000 != self._lease:
                self._lease = reply.lease_ms / 1000
                if self._lease_news is not None:
                    self._lease_news.set()  # the heartbeat paces by it from now on
            for run in reply.runs:
                self._start(run)

    def _start(self, run: worker_pb2.Run) -> None:
        context = RunContext(
            task_id=run.task_id,
            node_id=run.node_id,
            action=run.action,
            queue=run.queue,
            idempotency_key=run.idempotency_key,
            attempt=run.attempt,
            deadline=from_timestamp(run.deadline, run.HasField("deadline")),
            probe=run.probe,
        )
        held = _Held(run.run_token, context)
        self.held[run.run_token] = held
        held.task = asyncio.create_task(self._handle(held, run))

    async def _handle(self, held: _Held, run: worker_pb2.Run) -> None:
        ctx = held.context
        handler = self.handlers.get(run.queue)
        request = worker_pb2.CompleteRunRequest(run_token=held.token)
        try:
            if run.probe:
                await self._probe(ctx, request)
            elif handler is None:
                request.not_sent = f"this worker serves no queue {run.queue!r}"
            else:
                try:
                    value = await handler(ctx, payload_value(run.payload))
                except asyncio.CancelledError:
                    raise
                except RetryableError as error:
                    request.error.message = str(error) or type(error).__name__
                    request.error.retryable = True
                except Exception as error:
                    log.exception("action failed", task_id=ctx.task_id, node_id=ctx.node_id)
                    request.error.message = f"{type(error).__name__}: {error}"
                    request.error.retryable = False
                else:
                    body = b"" if value is None else canonical_json(value)
                    request.output.CopyFrom(json_payload(body))
            if ctx.lease_lost.is_set():
                return  # never completed: the run is not held any more
            await self._complete(request, ctx)
        except asyncio.CancelledError:
            return
        finally:
            if self.held.get(held.token) is held:
                del self.held[held.token]
            if self._free is not None:
                self._free.set()

    async def _probe(self, ctx: RunContext, request: worker_pb2.CompleteRunRequest) -> None:
        """A probe run's answer into ``request``: the probe handler's, else no answer."""
        handler = self.probes.get(ctx.queue)
        if handler is None:
            request.not_sent = f"this worker answers no probe of queue {ctx.queue!r}"
            return
        try:
            answer = await handler(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("probe failed", task_id=ctx.task_id, node_id=ctx.node_id)
            request.error.message = f"{type(error).__name__}: {error}"
            return
        if answer is None:
            request.not_sent = "the probe handler could not say"
            return
        request.probe.done = answer.done
        request.probe.fenced = answer.fenced and not answer.done
        if answer.done and answer.output is not None:
            request.probe.output.CopyFrom(json_payload(canonical_json(answer.output)))

    async def _complete(self, request: worker_pb2.CompleteRunRequest, ctx: RunContext) -> None:
        assert self._completions is not None
        for _ in range(5):
            try:
                completed = await self._completions.submit(request)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    log.error(
                        "completion refused",
                        task_id=ctx.task_id,
                        node_id=ctx.node_id,
                        code=error.code().name,
                        detail=error.details(),
                    )
                    return
                await asyncio.sleep(RETRY_PAUSE)
                continue
            if not completed.recorded:
                log.warning(
                    "completion refused: the run's lease was lost",
                    task_id=ctx.task_id,
                    node_id=ctx.node_id,
                    detail=completed.detail,
                )
            return

    async def _send_completions(
        self, requests: list[worker_pb2.CompleteRunRequest]
    ) -> list[Completed | BaseException]:
        """The completions waiting, in as few CompleteRuns calls as their size allows: each
        one's fate, or the call's error in its place."""
        results: list[Completed | BaseException] = []
        for call in completion_calls(requests):
            results.extend(await self._send_call(call))
        return results

    async def _send_call(
        self, requests: list[worker_pb2.CompleteRunRequest]
    ) -> list[Completed | BaseException]:
        assert self._stub is not None
        if self._batched:
            try:
                reply = await self._stub.CompleteRuns(
                    worker_pb2.CompleteRunsRequest(completions=requests), timeout=10
                )
                return list(reply.results)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:  # an executor from before
                    self._batched = False
                elif error.code() != grpc.StatusCode.INVALID_ARGUMENT or len(requests) == 1:
                    return [error] * len(requests)
                # else one of them is malformed: each on its own, so it alone is refused
        return list(await asyncio.gather(*(self._send_one(r) for r in requests)))

    async def _send_one(self, request: worker_pb2.CompleteRunRequest) -> Completed | BaseException:
        assert self._stub is not None
        try:
            await self._stub.CompleteRun(request, timeout=10)
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.ABORTED:
                return error
            return Completed(
                run_token=request.run_token, recorded=False, detail=error.details() or ""
            )
        return Completed(run_token=request.run_token, recorded=True)

    async def _heartbeat(self) -> None:
        """Every third of the lease: extend the leases of the runs held; a run not held
        any more has its handler cancelled and is never completed."""
        assert self._stub is not None and self._lease_news is not None
        while True:
            with contextlib.suppress(TimeoutError):  # a third of the lease, or a new lease
                await asyncio.wait_for(self._lease_news.wait(), self._lease / 3)
            self._lease_news.clear()
            held = list(self.held.values())
            if not held:
                continue
            try:
                reply = await self._stub.HeartbeatRuns(
                    worker_pb2.HeartbeatRunsRequest(
                        worker_id=self.worker_id, run_tokens=[h.token for h in held]
                    ),
                    timeout=self._lease / 3,
                )
            except grpc.aio.AioRpcError as error:
                log.warning("heartbeat failed", error=error.details())
                continue
            for h, lease in zip(held, reply.leases, strict=True):
                if not lease.held:
                    log.warning(
                        "run lease lost; its handler is cancelled",
                        task_id=h.context.task_id,
                        node_id=h.context.node_id,
                    )
                    h.context.lease_lost.set()
                    if h.task is not None:
                        h.task.cancel()
