"""The console's one way out: the services' gRPC APIs, through their typed stubs.

One channel per service, opened without a token: each call carries the token of the user
it is made for (:func:`dispo.libs.auth.bearer`), so what a page shows is what that token may
see, exactly as for the CLI. A refused or failed call raises :class:`DispoError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

import grpc
from dispo.console.settings import ConsoleSettings
from dispo.libs.api.executor.v1 import executor_pb2 as epb
from dispo.libs.api.executor.v1 import executor_pb2_grpc
from dispo.libs.api.gateway.v1 import catalogue_pb2 as cpb
from dispo.libs.api.gateway.v1 import (
    catalogue_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    schedule_pb2_grpc,
)
from dispo.libs.api.gateway.v1 import schedule_pb2 as spb
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as ipb
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
from dispo.libs.api.pool.v1 import pool_pb2 as ppb
from dispo.libs.api.pool.v1 import pool_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2 as rpb
from dispo.libs.api.reconciler.v1 import reconciler_pb2_grpc
from dispo.libs.api.retention.v1 import retention_pb2, retention_pb2_grpc
from dispo.libs.auth import bearer, open_channel
from dispo.libs.task_requests import (
    cancel_by_filter_request,
    count_request,
    counts_of,
    events_request,
    list_request,
)
from dispo.sdk import DispoError, TaskEventPage, TaskPage, TaskView
from google.protobuf.message import Message

Reply = TypeVar("Reply")
# How long one call may take.
CALL_SECONDS = 10.0
# The statuses the Tasks page counts and filters by.
COUNTED = ("ACCEPTED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "RETRY_EXHAUSTED", "DEMOTED")
# How many items of the reconciler's queues the Failed page shows.
FAILED_PAGE = 200
# How many of the pool's queued evaluations the Cron pool page shows.
QUEUE_PAGE = 200
# How many analysis and comparison jobs a page of the Intelligence page shows, unless it
# asks for another size (at most JOBS_PAGE_MAX), and how far it counts each status.
JOBS_PAGE = 50
JOBS_PAGE_MAX = 500
JOB_COUNT_LIMIT = 500
# How many of the pool's latest assignments the Cron pool page shows.
ASSIGNMENTS_PAGE = 20
RESIZES_PAGE = 20
# How many tasks a bulk resume's progress follows (the reconciler's page).
RESUMED_PAGE = 500
# The schedules the Schedules page lists (one ListSchedules page).
SCHEDULES_PAGE = 500
# The catalogue versions the Catalogue page lists, newest first.
CATALOGUE_VERSIONS_PAGE = 50


@dataclass(frozen=True)
class PoolState:
    """What the Cron pool page shows: the pool's figures, its crons and its queue (in the
    order crons take it)."""

    status: ppb.PoolStatus
    crons: list[ppb.Cron]
    queue: list[ppb.QueueItem]
    assignments: list[ppb.Assignment]
    # The scaler's latest resizes, newest first (ListResizes).
    resizes: list[ppb.Resize] = field(default_factory=list)


# The most status snapshots the Task page lists (one ListTaskEvents page).
EVENTS_SHOWN = 500


@dataclass(frozen=True)
class TaskDetail:
    """What the Task page shows: the gateway's view, and the reconciler's record of it
    (None when the reconciler holds none: it never failed) and its completion facts (None
    until the task ended)."""

    task: TaskView
    recovery: rpb.GetRecoveryTaskResponse | None
    completion: rpb.GetCompletionResponse | None
    # The task's status snapshots as the status stream holds them (ListTaskEvents), oldest
    # first: the first EVENTS_SHOWN of them (events.more says whether others follow).
    events: TaskEventPage | None = None
    # The choices of each WAITING node, by node id: (name, payload as JSON text), as its
    # wait action declares them (ListCells).
    choices: dict[str, list[tuple[str, str]]] = field(default_factory=dict)


class Backend:
    def __init__(self, settings: ConsoleSettings) -> None:
        self._channels = [
            gateway := open_channel(settings.gateway_address, ""),
            reconciler := open_channel(settings.reconciler_address, ""),
            executor := open_channel(settings.executor_address, ""),
            pool := open_channel(settings.pool_address, ""),
            intelligence := open_channel(settings.intelligence_address, ""),
        ]
        self.gateway = gateway_pb2_grpc.GatewayServiceStub(gateway)
        self.schedules = schedule_pb2_grpc.ScheduleServiceStub(gateway)
        self.catalogue = catalogue_pb2_grpc.CatalogueServiceStub(gateway)
        self.reconciler = reconciler_pb2_grpc.ReconcilerServiceStub(reconciler)
        self.executor = executor_pb2_grpc.ExecutorServiceStub(executor)
        self.pool = pool_pb2_grpc.PoolServiceStub(pool)
        self.intelligence = intelligence_pb2_grpc.IntelligenceServiceStub(intelligence)
        # The services that purge finished tasks, each its own tables (ADR-0105).
        self.retentions = {
            name: retention_pb2_grpc.RetentionServiceStub(channel)
            for name, channel in (
                ("gateway", gateway),
                ("executor", executor),
                ("reconciler", reconciler),
            )
        }

    async def close(self) -> None:
        await asyncio.gather(*(channel.close() for channel in self._channels))

    async def _call(
        self, method: Callable[..., Awaitable[Reply]], request: Message, token: str
    ) -> Reply:
        try:
            return await method(request, timeout=CALL_SECONDS, metadata=bearer(token))
        except grpc.aio.AioRpcError as error:
            raise DispoError.from_rpc(error) from None

    async def _found(
        self, method: Callable[..., Awaitable[Reply]], request: Message, token: str
    ) -> Reply | None:
        """The reply, None when the service holds no such item."""
        try:
            return await self._call(method, request, token)
        except DispoError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    async def tasks(
        self,
        token: str,
        *,
        business: str = "",
        statuses: tuple[str, ...] = (),
        created_after: datetime | None = None,
        idempotency_key: str = "",
        page_size: int = 50,
        page_token: str = "",
        scheduled: bool = False,
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
    ) -> TaskPage:
        """A page of the tasks the token may see, newest first (``scheduled``: only those
        whose delayed start is ahead)."""
        request = list_request(
            business,
            statuses,
            created_after,
            None,
            page_size,
            page_token,
            "newest",
            idempotency_key,
            scheduled,
            labels,
            priorities,
        )
        return TaskPage.from_proto(await self._call(self.gateway.ListTasks, request, token))

    async def counts(
        self,
        token: str,
        *,
        business: str = "",
        created_after: datetime | None = None,
        idempotency_key: str = "",
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
    ) -> dict[str, int]:
        """How many of the tasks the token may see are in each status, exactly (one call)."""
        request = count_request(business, created_after, None, idempotency_key, labels, priorities)
        return counts_of(await self._call(self.gateway.CountTasks, request, token))

    async def cancel_matching(
        self,
        token: str,
        *,
        business: str,
        statuses: list[str],
        created_after: datetime | None,
        idempotency_key: str,
        rate: float,
        actor: str,
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
    ) -> gateway_pb2.CancelByFilterResponse:
        """A bulk cancel of the unfinished tasks the Tasks page's search matches (ADR-0112)."""
        request = cancel_by_filter_request(
            business,
            statuses,
            created_after,
            None,
            idempotency_key,
            rate,
            False,
            f"cancelled from the {actor}",
            labels,
            priorities,
        )
        return await self._call(self.gateway.CancelByFilter, request, token)

    async def task(self, token: str, task_id: str, known: TaskDetail | None = None) -> TaskDetail:
        """The Task page's detail. With ``known`` (what this page showed last), the status
        snapshots are read again only if the task's version moved since: a new snapshot
        raises the version the gateway's view holds, so a page left open on a task that
        does not change reads the status stream once, not every refresh (each read makes
        and deletes a consumer on the stream)."""
        reply = await self._call(
            self.gateway.GetTask, gateway_pb2.GetTaskRequest(task_id=task_id), token
        )
        view = TaskView.from_proto(reply.task, reply.completion, reply.labels, reply.erasure)
        kept = (
            known.events
            if known is not None
            and known.task.task_id == task_id
            and known.task.version == view.version
            else None
        )
        waiting = [n for n in view.nodes if n.status == "WAITING"]
        choices = await self.choices(token) if waiting else {}
        offered = {
            n.node_id: choices[(raw.cell, raw.action)]
            for n, raw in zip(view.nodes, reply.task.nodes, strict=True)
            if n.status == "WAITING" and (raw.cell, raw.action) in choices
        }
        recovery, completion, events = await asyncio.gather(
            self._found(
                self.reconciler.GetRecoveryTask,
                rpb.GetRecoveryTaskRequest(task_id=task_id),
                token,
            ),
            self._found(
                self.reconciler.GetCompletion, rpb.GetCompletionRequest(task_id=task_id), token
            ),
            self._events(token, task_id, kept),
        )
        return TaskDetail(view, recovery, completion, events, offered)

    async def choices(self, token: str) -> dict[tuple[str, str], list[tuple[str, str]]]:
        """The choices each wait action of the catalogue offers, by (cell, action): each a
        name and its payload as JSON text (ListCells)."""
        cells = await self._call(self.gateway.ListCells, gateway_pb2.ListCellsRequest(), token)
        return {
            (cell.name, action.name): [(c.name, c.payload_json.decode()) for c in action.choices]
            for cell in cells.cells
            for action in cell.actions
            if action.choices
        }

    async def signal(self, token: str, task_id: str, node_id: str, choice: str) -> str:
        """Send the choice a WAITING node of the task offers (its payload as the catalogue
        declares it, never as a form states it), once: the same choice again is a
        duplicate. What happened, in words."""
        reply = await self._call(
            self.gateway.GetTask, gateway_pb2.GetTaskRequest(task_id=task_id), token
        )
        node = next((n for n in reply.task.nodes if n.node_id == node_id), None)
        offered = dict(
            (await self.choices(token)).get((node.cell, node.action), []) if node else []
        )
        if node is None or choice not in offered:
            raise DispoError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"node {node_id!r} of task {task_id} offers no choice {choice!r}",
                {"choice": "not one the node's wait action declares"},
            )
        sent = await self._call(
            self.gateway.SignalTask,
            gateway_pb2.SignalTaskRequest(
                task_id=task_id,
                signal=node.spec.signal,
                payload_json=offered[choice].encode(),
                signal_id=f"console:{node_id}:{choice}",
            ),
            token,
        )
        said = "already sent" if sent.duplicate else "sent"
        return f"{choice} {said} to {node_id}"

    async def _events(self, token: str, task_id: str, known: TaskEventPage | None) -> TaskEventPage:
        if known is not None:
            return known
        page = await self._call(
            self.gateway.ListTaskEvents, events_request(task_id, EVENTS_SHOWN, ""), token
        )
        return TaskEventPage.from_proto(page)

    async def cancel(self, token: str, task_id: str) -> None:
        await self._call(
            self.gateway.CancelTask, gateway_pb2.CancelTaskRequest(task_id=task_id), token
        )

    async def erase(self, token: str, task_id: str) -> None:
        """Erase a finished task's payloads and outputs (ADR-0113)."""
        await self._call(
            self.gateway.EraseTask, gateway_pb2.EraseTaskRequest(task_id=task_id), token
        )

    async def resume(self, token: str, task_id: str, actor: str) -> None:
        """Redrive the task from its failure (its FAILED and waiting nodes run again)."""
        await self._call(
            self.reconciler.RedriveTask,
            rpb.RedriveTaskRequest(task_id=task_id, actor=actor, reason="resumed from the console"),
            token,
        )

    async def resolve(self, token: str, task_id: str, node_id: str, done: bool, actor: str) -> None:
        """An operator's answer for an UNKNOWN node: its effect happened, or it runs again."""
        await self._call(
            self.reconciler.ResolveNode,
            rpb.ResolveNodeRequest(
                task_id=task_id,
                node_id=node_id,
                resolution=rpb.RESOLUTION_DONE if done else rpb.RESOLUTION_RETRY,
                actor=actor,
                reason="resolved from the console",
            ),
            token,
        )

    async def failed_work(
        self,
        token: str,
        *,
        kinds: tuple[rpb.WorkKind.ValueType, ...] = (),
        downstream: str = "",
        business: str = "",
    ) -> list[rpb.FailedWork]:
        """The reconciler's queues: failed, awaiting redrive, demoted and unknown-outcome work,
        oldest first (one page)."""
        request = rpb.ListFailedWorkRequest(
            filter=rpb.FailedWorkFilter(kinds=kinds, downstream=downstream, business=business)
        )
        request.page.page_size = FAILED_PAGE
        reply = await self._call(self.reconciler.ListFailedWork, request, token)
        return list(reply.work)

    async def abandon(self, token: str, task_id: str, actor: str) -> None:
        await self._call(
            self.reconciler.AbandonTask,
            rpb.AbandonTaskRequest(
                task_id=task_id, actor=actor, reason="abandoned from the console"
            ),
            token,
        )

    async def resume_matching(
        self, token: str, downstream: str, business: str, rate: float, actor: str
    ) -> rpb.RedriveByFilterResponse:
        """Redrive every parked task the filter matches, ``rate`` a second."""
        return await self._call(
            self.reconciler.RedriveByFilter,
            rpb.RedriveByFilterRequest(
                filter=rpb.RecoveryFilter(downstream=downstream, business=business),
                rate_per_second=rate,
                actor=actor,
                reason="resumed from the console",
            ),
            token,
        )

    async def abandon_matching(
        self, token: str, downstream: str, limit: int, rate: float, actor: str
    ) -> rpb.AbandonByFilterResponse:
        """Abandon the ``limit`` oldest parked tasks of ``downstream`` (any: empty), ``rate``
        a second (AbandonByFilter, ADR-0112)."""
        return await self._call(
            self.reconciler.AbandonByFilter,
            rpb.AbandonByFilterRequest(
                filter=rpb.RecoveryFilter(downstream=downstream),
                limit=limit,
                rate_per_second=rate,
                reason=f"abandoned from the {actor}",
            ),
            token,
        )

    async def resumed(self, token: str, downstream: str, business: str) -> list[rpb.RecoveryTask]:
        """The tasks of a downstream and business in the states a resume leads through
        (still parked, redriven, resolved, failed again): a bulk resume's progress."""
        request = rpb.ListRecoveryTasksRequest(
            filter=rpb.RecoveryFilter(
                downstream=downstream,
                business=business,
                states=(
                    rpb.RECOVERY_STATE_PARKED_FAILED,
                    rpb.RECOVERY_STATE_DEMOTED,
                    rpb.RECOVERY_STATE_REDRIVEN,
                    rpb.RECOVERY_STATE_RESOLVED,
                    rpb.RECOVERY_STATE_FAILED,
                ),
            )
        )
        request.page.page_size = RESUMED_PAGE
        return list((await self._call(self.reconciler.ListRecoveryTasks, request, token)).tasks)

    async def queues(self, token: str) -> list[epb.Queue]:
        """The worker queues, as the executor sees them (ListQueues)."""
        reply = await self._call(self.executor.ListQueues, epb.ListQueuesRequest(), token)
        return list(reply.queues)

    async def downstreams(
        self, token: str
    ) -> list[tuple[rpb.DownstreamState, epb.Downstream | None]]:
        """Each downstream as the reconciler sees it (health, pause, depths, release rate),
        with the executor's breaker of it."""
        states, breakers = await asyncio.gather(
            self._call(self.reconciler.ListDownstreams, rpb.ListDownstreamsRequest(), token),
            self._call(self.executor.ListDownstreams, epb.ListDownstreamsRequest(), token),
        )
        by_name = {d.name: d for d in breakers.downstreams}
        return [(state, by_name.get(state.name)) for state in states.downstreams]

    async def retention(self, token: str) -> dict[str, retention_pb2.GetRetentionResponse]:
        """Each purging service's dry run: by business, its retention, its cutoff and the
        finished tasks past it."""
        request = retention_pb2.GetRetentionRequest()
        replies = await asyncio.gather(
            *(self._call(stub.GetRetention, request, token) for stub in self.retentions.values())
        )
        return dict(zip(self.retentions, replies, strict=True))

    async def pause(self, token: str, name: str, actor: str) -> None:
        await self._call(
            self.reconciler.PauseDownstream,
            rpb.PauseDownstreamRequest(name=name, actor=actor, reason="paused from the console"),
            token,
        )

    async def unpause(self, token: str, name: str, actor: str) -> None:
        await self._call(
            self.reconciler.ResumeDownstream,
            rpb.ResumeDownstreamRequest(name=name, actor=actor),
            token,
        )

    async def catalogue_version(self, token: str, version: int = 0) -> cpb.CatalogueVersion:
        """One version of the catalogue (0: the current one)."""
        request = cpb.GetCatalogueRequest(version=version)
        return (await self._call(self.catalogue.GetCatalogue, request, token)).catalogue

    async def catalogue_versions(self, token: str) -> list[cpb.CatalogueVersion]:
        """The newest CATALOGUE_VERSIONS_PAGE versions, newest first, without documents."""
        request = cpb.ListCatalogueVersionsRequest()
        request.page.page_size = CATALOGUE_VERSIONS_PAGE
        reply = await self._call(self.catalogue.ListCatalogueVersions, request, token)
        return list(reply.versions)

    async def businesses(self, token: str) -> list[tuple[epb.BusinessState, int]]:
        """Each business the executors know of (weight, pause), with its paused depth: the
        gateway's count of its ACCEPTED tasks (accepted, not started)."""
        reply = await self._call(self.executor.ListBusinesses, epb.ListBusinessesRequest(), token)
        counts = await asyncio.gather(
            *(self.counts(token, business=b.business) for b in reply.businesses)
        )
        return [(b, c.get("ACCEPTED", 0)) for b, c in zip(reply.businesses, counts, strict=True)]

    async def pause_business(self, token: str, business: str, actor: str) -> None:
        await self._call(
            self.executor.PauseBusiness,
            epb.PauseBusinessRequest(
                business=business, actor=actor, reason="paused from the console"
            ),
            token,
        )

    async def resume_business(self, token: str, business: str) -> None:
        await self._call(
            self.executor.ResumeBusiness, epb.ResumeBusinessRequest(business=business), token
        )

    async def schedule_list(self, token: str) -> list[spb.Schedule]:
        """The schedules the token may see, by id (the first SCHEDULES_PAGE)."""
        request = spb.ListSchedulesRequest()
        request.page.page_size = SCHEDULES_PAGE
        return list((await self._call(self.schedules.ListSchedules, request, token)).schedules)

    async def schedule(self, token: str, schedule_id: str) -> spb.Schedule:
        request = spb.GetScheduleRequest(schedule_id=schedule_id)
        return (await self._call(self.schedules.GetSchedule, request, token)).schedule

    async def pause_schedule(self, token: str, schedule_id: str) -> None:
        request = spb.PauseScheduleRequest(schedule_id=schedule_id)
        await self._call(self.schedules.PauseSchedule, request, token)

    async def resume_schedule(self, token: str, schedule_id: str) -> None:
        request = spb.ResumeScheduleRequest(schedule_id=schedule_id)
        await self._call(self.schedules.ResumeSchedule, request, token)

    async def pool_state(self, token: str) -> PoolState:
        status, crons, queue, assignments, resizes = await asyncio.gather(
            self._call(self.pool.GetPoolStatus, ppb.GetPoolStatusRequest(), token),
            self._call(self.pool.ListCrons, ppb.ListCronsRequest(), token),
            self._call(self.pool.ListQueue, ppb.ListQueueRequest(limit=QUEUE_PAGE), token),
            self._call(
                self.pool.ListAssignments, ppb.ListAssignmentsRequest(limit=ASSIGNMENTS_PAGE), token
            ),
            self._call(self.pool.ListResizes, ppb.ListResizesRequest(limit=RESIZES_PAGE), token),
        )
        return PoolState(
            status,
            list(crons.crons),
            list(queue.items),
            list(assignments.assignments),
            list(resizes.resizes),
        )

    async def evaluation_action(
        self, token: str, action: str, evaluation_id: str
    ) -> ppb.Evaluation:
        """``pause`` (out of the queue, its cron lets it go), ``resume`` (a paused one back
        in the queue) or ``cancel`` (ended for good) an evaluation."""
        method = {
            "pause": self.pool.PauseEvaluation,
            "resume": self.pool.ResumeEvaluation,
            "cancel": self.pool.CancelEvaluation,
        }[action]
        return await self._call(method, ppb.EvaluationRef(evaluation_id=evaluation_id), token)

    async def set_bounds(self, token: str, min_size: int, max_size: int) -> ppb.PoolStatus:
        """The pool's new size bounds; its scaler applies them at once."""
        return await self._call(
            self.pool.SetPoolBounds,
            ppb.SetPoolBoundsRequest(min_size=min_size, max_size=max_size),
            token,
        )

    async def boost(self, token: str, evaluation_id: str, boost: int) -> ppb.Evaluation:
        """Set the evaluation's priority boost (a higher one is served first)."""
        return await self._call(
            self.pool.BoostEvaluation,
            ppb.BoostEvaluationRequest(evaluation_id=evaluation_id, priority_boost=boost),
            token,
        )

    async def jobs(
        self,
        token: str,
        *,
        evaluation_id: str = "",
        kind: ipb.JobKind.ValueType = ipb.JOB_KIND_UNSPECIFIED,
        status: ipb.JobStatus.ValueType = ipb.JOB_STATUS_UNSPECIFIED,
        page_size: int = JOBS_PAGE,
        page_token: str = "",
    ) -> ipb.ListJobsResponse:
        """A page of the analysis and comparison jobs, as the intelligence service lists
        them (its ``page.next_page_token`` names the next page)."""
        request = ipb.ListJobsRequest(evaluation_id=evaluation_id, kind=kind, status=status)
        request.page.page_size, request.page.page_token = page_size, page_token
        return await self._call(self.intelligence.ListJobs, request, token)

    async def job_counts(
        self,
        token: str,
        statuses: dict[str, ipb.JobStatus.ValueType],
        *,
        evaluation_id: str = "",
        kind: ipb.JobKind.ValueType = ipb.JOB_KIND_UNSPECIFIED,
    ) -> dict[str, int]:
        """How many jobs are in each of ``statuses``, up to :data:`JOB_COUNT_LIMIT` + 1 each."""
        pages = await asyncio.gather(
            *(
                self.jobs(
                    token,
                    evaluation_id=evaluation_id,
                    kind=kind,
                    status=status,
                    page_size=JOB_COUNT_LIMIT,
                )
                for status in statuses.values()
            )
        )
        return {
            name: len(page.jobs) + (1 if page.page.next_page_token else 0)
            for name, page in zip(statuses, pages, strict=True)
        }

    async def analysis(self, token: str, evaluation_id: str) -> ipb.Analysis:
        """An evaluation's analysis job, with its statistics and narrative once completed."""
        request = ipb.GetJobRequest(evaluation_id=evaluation_id)
        return await self._call(self.intelligence.GetAnalysis, request, token)

    async def comparison(self, token: str, evaluation_id: str) -> ipb.Comparison:
        """An evaluation's comparison job, with its deltas and narrative once completed."""
        request = ipb.GetJobRequest(evaluation_id=evaluation_id)
        return await self._call(self.intelligence.GetComparison, request, token)
