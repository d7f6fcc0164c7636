"""Async and sync clients of the gateway."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.executor.v1 import executor_pb2, executor_pb2_grpc
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.auth import open_channel, open_sync_channel
from dispo.libs.batcher import Batcher
from dispo.libs.proto_enums import task_status_name
from dispo.libs.task_requests import (
    cancel_by_filter_request,
    count_request,
    counts_of,
    events_request,
    list_request,
)
from dispo.libs.timestamps import set_timestamp
from dispo.libs.tls import ClientTLS
from dispo.sdk._catalogue import AsyncCatalogueCalls, CatalogueCalls
from dispo.sdk._gather import Gathered
from dispo.sdk._queues import EXECUTOR_ADDRESS, WorkerQueue, queues_of
from dispo.sdk._schedules import AsyncScheduleCalls, ScheduleCalls
from dispo.sdk._types import (
    BulkAction,
    CellSpec,
    DispoError,
    Signalled,
    Submitted,
    TaskEvent,
    TaskEventPage,
    TaskPage,
    TaskRequest,
    TaskSummary,
    TaskView,
    signal_request,
    signalled,
)
from google.protobuf.message import Message

Reply = TypeVar("Reply")


def _token(token: str | None) -> str:
    """The caller's token: ``token``, else ``DISPO_TOKEN`` (empty: calls carry none, and
    the gateway answers UNAUTHENTICATED)."""
    return token if token is not None else os.environ.get("DISPO_TOKEN", "").strip()


def _submit_request(
    business: str,
    cells: Sequence[CellSpec],
    idempotency_key: str,
    callback_url: str,
    not_before: datetime | None = None,
    deadline: datetime | None = None,
    labels: Mapping[str, str] | None = None,
    priority: int = 0,
) -> gateway_pb2.SubmitRequest:
    """The SubmitRequest; ``not_before`` and ``deadline`` as instants (a naive one is UTC)."""
    request = gateway_pb2.SubmitRequest(
        business=business,
        cells=[c.to_proto() for c in cells],
        idempotency_key=idempotency_key,
        callback_url=callback_url,
        labels=labels or {},
        priority=priority,
    )
    if not_before is not None:
        set_timestamp(request.not_before, not_before)
    if deadline is not None:
        set_timestamp(request.deadline, deadline)
    return request


def _submitted(reply: gateway_pb2.SubmitResponse) -> Submitted:
    return Submitted(reply.task_id, task_status_name(reply.status), reply.duplicate)


def _submit_many_request(requests: Sequence[TaskRequest]) -> gateway_pb2.SubmitManyRequest:
    return gateway_pb2.SubmitManyRequest(
        requests=[
            _submit_request(
                r.business,
                r.cells,
                r.idempotency_key,
                r.callback_url,
                r.not_before,
                r.deadline,
                r.labels,
                r.priority,
            )
            for r in requests
        ]
    )


def _all_submitted(reply: gateway_pb2.SubmitManyResponse) -> list[Submitted]:
    return [_submitted(r) for r in reply.responses]


# Gathered submits (AsyncClient.submit): the most tasks one SubmitEach carries, and the most
# such calls in flight at once (one: the submits arriving meanwhile make the next call's,
# fewer calls for the same tasks, measured cheaper and faster than two or four; ADR-0056).
GATHER_MAX = 250
GATHER_CALLS = 1
# What a SubmitEach refused as a whole answers when nothing of it was written: its items are
# then sent again one Submit each.
_NOTHING_WRITTEN = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def _each_request(items: Sequence[_Gathered]) -> gateway_pb2.SubmitEachRequest:
    return gateway_pb2.SubmitEachRequest(requests=[item.request for item in items])


def _each_answers(reply: gateway_pb2.SubmitEachResponse) -> list[Submitted | DispoError]:
    """Each item's answer, as its own Submit would have answered it."""
    return [
        _submitted(o.accepted)
        if o.WhichOneof("outcome") == "accepted"
        else DispoError.from_status(o.refused)
        for o in reply.outcomes
    ]


def _gathered_deadline_passed() -> DispoError:
    """What a gathered submit raises when its caller's timeout passed before its answer
    came: what its own Submit would have raised."""
    return DispoError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", {})


def _limited_wait(error: DispoError, deadline: float) -> float | None:
    """How long to wait before sending again a call the gateway refused for a limit
    (RESOURCE_EXHAUSTED with a RetryInfo: nothing was written), when the caller's timeout
    leaves room for it; None: the refusal is the answer."""
    if error.code != grpc.StatusCode.RESOURCE_EXHAUSTED or error.retry_after is None:
        return None
    if time.monotonic() + error.retry_after >= deadline:
        return None
    return error.retry_after


def _call_timeout(items: Sequence[_Gathered]) -> float:
    """A gathered call waits as long as its most patient caller."""
    return max(item.deadline for item in items) - time.monotonic()


@dataclass(frozen=True)
class _Gathered:
    """A submit waiting to be sent: its request, and when its caller stops waiting."""

    request: gateway_pb2.SubmitRequest
    deadline: float


class AsyncClient(AsyncScheduleCalls, AsyncCatalogueCalls):
    """``async with AsyncClient("127.0.0.1:50051", token=...) as dispo: ...``

    ``token`` is the caller's API token (default: ``DISPO_TOKEN``), sent on every call;
    ``tls`` the channel's TLS (default: ``DISPO_TLS_CA_FILE`` and the client certificate
    settings, plaintext without them).

    :meth:`submit` calls made while others are on their way are gathered into one
    SubmitEach call (``gather``, on by default; ADR-0056): a submit alone is sent at once
    as a Submit, and those arriving meanwhile go together in the next call (at most
    ``GATHER_MAX`` tasks, ``GATHER_CALLS`` calls in flight). Each caller gets exactly what
    its own Submit would answer or raise; the gRPC call's own cost, most of a Submit's, is
    paid once per call instead of once per task. ``gather=False`` sends every submit by a
    Submit of its own.

    A submit the gateway refuses because its business is over its Submit rate
    (RESOURCE_EXHAUSTED with a RetryInfo) is sent again after the delay the RetryInfo names,
    as long as the call's ``timeout`` allows (``retry_limited``, on by default)."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        channel: grpc.aio.Channel | None = None,
        tls: ClientTLS | None = None,
        gather: bool = True,
        retry_limited: bool = True,
    ) -> None:
        self.retry_limited = retry_limited
        self._channel = channel or open_channel(address, _token(token), tls=tls)
        self._token, self._tls = _token(token), tls  # for the executor's calls
        self._stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)
        self.gathered: Batcher[_Gathered, Submitted] | None = (
            Batcher(
                "submits",
                self._submit_gathered,
                max_items=GATHER_MAX,
                concurrency=GATHER_CALLS,
            )
            if gather
            else None
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(
        self,
        method: Callable[..., Awaitable[Reply]],
        request: Message,
        timeout: float | None = 10.0,
    ) -> Reply:
        try:
            return await method(request, timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise DispoError.from_rpc(error) from None

    async def submit(
        self,
        business: str,
        cells: Sequence[CellSpec],
        *,
        idempotency_key: str = "",
        callback_url: str = "",
        not_before: datetime | None = None,
        deadline: datetime | None = None,
        labels: Mapping[str, str] | None = None,
        priority: int = 0,
        timeout: float = 10.0,
    ) -> Submitted:
        """Submit one task: its :class:`Submitted` once it is durably recorded, or the
        :class:`DispoError` the gateway refused it with (gathered with concurrent submits
        into one call unless the client was made with ``gather=False``). ``not_before``: start
        no earlier (a delayed start); ``deadline``: end FAILED if not finished by then;
        ``priority``: 1 (highest) to 5 within the business's share (0: 3)."""
        request = _submit_request(
            business,
            cells,
            idempotency_key,
            callback_url,
            not_before,
            deadline,
            labels,
            priority,
        )
        ends = time.monotonic() + timeout
        while True:
            try:
                return await self._submit_once(request, ends - time.monotonic())
            except DispoError as error:
                wait = _limited_wait(error, ends) if self.retry_limited else None
                if wait is None:
                    raise
                await asyncio.sleep(wait)

    async def _submit_once(self, request: gateway_pb2.SubmitRequest, timeout: float) -> Submitted:
        if self.gathered is None:
            return _submitted(await self._call(self._stub.Submit, request, timeout))
        item = _Gathered(request, time.monotonic() + timeout)
        try:
            # A timeout scope rather than wait_for: no task of its own for every submit.
            async with asyncio.timeout(timeout):
                return await self.gathered.submit(item)
        except TimeoutError:
            raise _gathered_deadline_passed() from None

    async def _submit_gathered(self, items: list[_Gathered]) -> list[Submitted | DispoError]:
        """One call for ``items``: a Submit for one, a SubmitEach for several. A SubmitEach
        refused as a whole before anything was written (an item failing the request hygiene
        every call passes, a message over gRPC's size limit, a gateway without SubmitEach)
        is sent again as one Submit per item, so each caller hears of its own request only;
        any other failure of the call is every item's (as it would be each Submit's)."""
        timeout = _call_timeout(items)
        if len(items) == 1:
            return [await self._submit_alone(items[0], timeout)]
        try:
            reply = await self._stub.SubmitEach(_each_request(items), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            if error.code() not in _NOTHING_WRITTEN:
                raise DispoError.from_rpc(error) from None
            return list(
                await asyncio.gather(*(self._submit_alone(item, timeout) for item in items))
            )
        return _each_answers(reply)

    async def _submit_alone(self, item: _Gathered, timeout: float) -> Submitted | DispoError:
        try:
            return _submitted(await self._call(self._stub.Submit, item.request, timeout))
        except DispoError as error:
            return error

    async def submit_many(
        self, requests: Sequence[TaskRequest], *, timeout: float = 30.0
    ) -> list[Submitted]:
        """Submit every task of ``requests`` in one call (at most 500), all or none: one
        invalid task refuses the call, naming ``requests[i]``, and records nothing. One
        :class:`Submitted` per task, in order. Refused for the Submit rate: sent again as
        :meth:`submit` is."""
        request = _submit_many_request(requests)
        ends = time.monotonic() + timeout
        while True:
            try:
                reply = await self._call(self._stub.SubmitMany, request, ends - time.monotonic())
                return _all_submitted(reply)
            except DispoError as error:
                wait = _limited_wait(error, ends) if self.retry_limited else None
                if wait is None:
                    raise
                await asyncio.sleep(wait)

    async def get(self, task_id: str, *, timeout: float = 10.0) -> TaskView:
        reply = await self._call(
            self._stub.GetTask, gateway_pb2.GetTaskRequest(task_id=task_id), timeout
        )
        return TaskView.from_proto(reply.task, reply.completion, reply.labels, reply.erasure)

    async def erase(self, task_id: str, *, timeout: float = 10.0) -> TaskView:
        """Erase a finished task's payloads and outputs (ADR-0113); the same answer again
        for an erased task."""
        reply = await self._call(
            self._stub.EraseTask, gateway_pb2.EraseTaskRequest(task_id=task_id), timeout
        )
        return TaskView.from_proto(reply.task, erasure=reply.erasure)

    async def cancel(self, task_id: str, *, timeout: float = 10.0) -> TaskView:
        reply = await self._call(
            self._stub.CancelTask, gateway_pb2.CancelTaskRequest(task_id=task_id), timeout
        )
        return TaskView.from_proto(reply.task)

    async def signal(
        self,
        task_id: str,
        signal: str,
        payload: dict[str, Any] | None = None,
        *,
        signal_id: str = "",
        business: str = "",
        idempotency_key: str = "",
        timeout: float = 10.0,
    ) -> Signalled:
        """Send ``signal`` to the task's wait nodes: ``payload`` becomes the output of the
        node waiting for it (docs/waiting.md). The task by id, or (``task_id`` empty) by
        ``business`` and ``idempotency_key``; a repeated ``signal_id`` is answered
        ``duplicate``."""
        request = signal_request(task_id, signal, payload, signal_id, business, idempotency_key)
        return signalled(await self._call(self._stub.SignalTask, request, timeout))

    async def list_queues(
        self, executor: str = EXECUTOR_ADDRESS, *, timeout: float | None = 10.0
    ) -> list[WorkerQueue]:
        """The worker queues, by name, as the executor at ``executor`` (any replica) sees
        them: live workers, when one was last seen, runs offered and taken, the limit
        (ListQueues; an admin token's call)."""
        async with open_channel(executor, self._token, tls=self._tls) as channel:
            stub = executor_pb2_grpc.ExecutorServiceStub(channel)
            reply = await self._call(stub.ListQueues, executor_pb2.ListQueuesRequest(), timeout)
        return queues_of(reply)

    async def list_page(
        self,
        *,
        business: str = "",
        statuses: Sequence[str] = (),
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int = 100,
        page_token: str = "",
        order: str = "newest",
        idempotency_key: str = "",
        scheduled: bool = False,
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        timeout: float | None = 10.0,
    ) -> TaskPage:
        """One page of matching tasks, ``order`` by creation: "newest" (first) or "oldest";
        with ``idempotency_key``, the task submitted with that key (one per business); with
        ``scheduled``, only tasks whose delayed start is ahead; with ``priorities``, only
        tasks of any of them (1 highest … 5)."""
        reply = await self._call(
            self._stub.ListTasks,
            list_request(
                business,
                statuses,
                created_after,
                created_before,
                page_size,
                page_token,
                order,
                idempotency_key,
                scheduled,
                labels,
                priorities,
            ),
            timeout,
        )
        return TaskPage.from_proto(reply)

    async def list(
        self,
        *,
        business: str = "",
        statuses: Sequence[str] = (),
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int = 100,
        order: str = "newest",
        idempotency_key: str = "",
        scheduled: bool = False,
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        page_timeout: float | None = 10.0,
    ) -> AsyncIterator[TaskSummary]:
        """Every matching task, newest first unless ``order="oldest"``, following the cursor;
        each page's call gives up after ``page_timeout`` seconds (``DEADLINE_EXCEEDED``)."""
        token = ""
        while True:
            page = await self.list_page(
                business=business,
                statuses=statuses,
                created_after=created_after,
                created_before=created_before,
                page_size=page_size,
                page_token=token,
                order=order,
                idempotency_key=idempotency_key,
                scheduled=scheduled,
                labels=labels,
                priorities=priorities,
                timeout=page_timeout,
            )
            for item in page.tasks:
                yield item
            token = page.next_page_token
            if not page.more:
                return

    async def count(
        self,
        *,
        business: str = "",
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        idempotency_key: str = "",
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        timeout: float = 10.0,
    ) -> dict[str, int]:
        """How many matching tasks are in each status, exactly: every status name, 0
        included ({"SUCCEEDED": 3, "FAILED": 0, …})."""
        request = count_request(
            business, created_after, created_before, idempotency_key, labels, priorities
        )
        return counts_of(await self._call(self._stub.CountTasks, request, timeout))

    async def cancel_by_filter(
        self,
        *,
        business: str = "",
        statuses: Sequence[str] = (),
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        idempotency_key: str = "",
        rate_per_second: float = 100.0,
        dry_run: bool = False,
        reason: str = "",
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        timeout: float = 10.0,
    ) -> BulkAction:
        """Cancel every unfinished task these filters match (CountTasks' filters; statuses
        by name, none: every unfinished one), at most ``rate_per_second`` a second, in the
        gateway's background: follow it with :meth:`bulk_action`. A dry run only counts
        (``matched``; no ``action_id``)."""
        request = cancel_by_filter_request(
            business,
            statuses,
            created_after,
            created_before,
            idempotency_key,
            rate_per_second,
            dry_run,
            reason,
            labels,
            priorities,
        )
        reply = await self._call(self._stub.CancelByFilter, request, timeout)
        return BulkAction.from_proto(reply.action, reply.matched)

    async def bulk_action(self, action_id: str, *, timeout: float = 10.0) -> BulkAction:
        """One bulk action's record, as it stands now."""
        request = gateway_pb2.GetBulkActionRequest(action_id=action_id)
        return BulkAction.from_proto(
            (await self._call(self._stub.GetBulkAction, request, timeout)).action
        )

    async def events_page(
        self, task_id: str, *, page_size: int = 100, page_token: str = "", timeout: float = 10.0
    ) -> TaskEventPage:
        """One page of the task's history, oldest first: each status snapshot published
        for it, with the nodes that changed (the status stream keeps 7 days of them)."""
        request = events_request(task_id, page_size, page_token)
        return TaskEventPage.from_proto(
            await self._call(self._stub.ListTaskEvents, request, timeout)
        )

    async def events(self, task_id: str, *, page_size: int = 100) -> tuple[TaskEvent, ...]:
        """The task's whole history as stored now, oldest first, following the pages."""
        out: tuple[TaskEvent, ...] = ()
        token = ""
        while True:
            page = await self.events_page(task_id, page_size=page_size, page_token=token)
            out += page.events
            token = page.next_page_token
            if not page.more:
                return out

    async def watch(self, task_id: str) -> AsyncIterator[TaskView]:
        """Each change of the task until it is terminal."""
        try:
            async for reply in self._stub.WatchTask(gateway_pb2.WatchTaskRequest(task_id=task_id)):
                yield TaskView.from_proto(reply.task)
        except grpc.aio.AioRpcError as error:
            raise DispoError.from_rpc(error) from None

    async def wait(self, task_id: str, *, timeout: float = 60.0) -> TaskView:
        """The task once terminal (SUCCEEDED, FAILED, CANCELLED), with its nodes' outputs and
        its ``result``. Reconnects if the stream breaks; asks once more (GetTask) when the
        terminal view came without its outputs (``outputs_unavailable``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last: TaskView | None = None
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(
                    f"task {task_id} not terminal after {timeout}s (last: {last and last.status})"
                )
            try:
                async with asyncio.timeout(remaining):
                    async for view in self.watch(task_id):
                        last = view
                        if view.terminal:
                            return await self.get(task_id) if view.outputs_unavailable else view
            except DispoError as error:
                if error.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    raise
                await asyncio.sleep(0.2)
            except TimeoutError:
                raise TimeoutError(
                    f"task {task_id} not terminal after {timeout}s (last: {last and last.status})"
                ) from None


class Client(ScheduleCalls, CatalogueCalls):
    """Blocking client: ``with Client("127.0.0.1:50051", token=...) as dispo: ...``

    ``token`` is the caller's API token (default: ``DISPO_TOKEN``), sent on every call;
    ``tls`` the channel's TLS (default: the ``DISPO_TLS_*`` settings, as :class:`AsyncClient`).

    One client may be shared by many threads. Their :meth:`submit` calls are gathered as
    :class:`AsyncClient` gathers its coroutines' (``gather``, on by default): a submit
    alone is sent at once as a Submit; those made while a call is on its way go together
    in one SubmitEach (at most ``GATHER_MAX`` tasks), sent by the thread of the first of
    them (:class:`~dispo.sdk._gather.Gathered`). Each thread gets exactly what its own
    Submit would answer or raise. A submit refused for the Submit rate is sent again after
    the delay its RetryInfo names, as :class:`AsyncClient` does (``retry_limited``)."""

    def __init__(
        self,
        address: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        tls: ClientTLS | None = None,
        gather: bool = True,
        retry_limited: bool = True,
    ) -> None:
        self.retry_limited = retry_limited
        self._channel = open_sync_channel(address, _token(token), tls=tls)
        self._token, self._tls = _token(token), tls  # for the executor's calls
        self._stub = gateway_pb2_grpc.GatewayServiceStub(self._channel)
        self.gathered: Gathered[_Gathered, Submitted] | None = (
            Gathered(self._submit_gathered, max_items=GATHER_MAX) if gather else None
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(
        self, method: Callable[..., Reply], request: Message, timeout: float | None = 10.0
    ) -> Reply:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as error:
            raise DispoError.from_rpc(error) from None

    def submit(
        self,
        business: str,
        cells: Sequence[CellSpec],
        *,
        idempotency_key: str = "",
        callback_url: str = "",
        not_before: datetime | None = None,
        deadline: datetime | None = None,
        labels: Mapping[str, str] | None = None,
        priority: int = 0,
        timeout: float = 10.0,
    ) -> Submitted:
        """Submit one task: its :class:`Submitted` once it is durably recorded, or the
        :class:`DispoError` the gateway refused it with (gathered with other threads'
        submits into one call unless the client was made with ``gather=False``). ``not_before``
        ``deadline`` and ``priority`` as for :meth:`AsyncClient.submit`."""
        request = _submit_request(
            business,
            cells,
            idempotency_key,
            callback_url,
            not_before,
            deadline,
            labels,
            priority,
        )
        ends = time.monotonic() + timeout
        while True:
            try:
                return self._submit_once(request, ends - time.monotonic())
            except DispoError as error:
                wait = _limited_wait(error, ends) if self.retry_limited else None
                if wait is None:
                    raise
                time.sleep(wait)

    def _submit_once(self, request: gateway_pb2.SubmitRequest, timeout: float) -> Submitted:
        if self.gathered is None:
            return _submitted(self._call(self._stub.Submit, request, timeout))
        try:
            return self.gathered.submit(_Gathered(request, time.monotonic() + timeout), timeout)
        except TimeoutError:
            raise _gathered_deadline_passed() from None

    def _submit_gathered(self, items: list[_Gathered]) -> list[Submitted | DispoError]:
        """As :meth:`AsyncClient._submit_gathered`, on this thread: a Submit for one item, a
        SubmitEach for several, sent again one Submit each if refused as a whole before
        anything was written."""
        timeout = _call_timeout(items)
        if len(items) == 1:
            return [self._submit_alone(items[0], timeout)]
        try:
            reply = self._stub.SubmitEach(_each_request(items), timeout=timeout)
        except grpc.RpcError as error:
            if error.code() not in _NOTHING_WRITTEN:
                raise DispoError.from_rpc(error) from None
            return [self._submit_alone(item, timeout) for item in items]
        return _each_answers(reply)

    def _submit_alone(self, item: _Gathered, timeout: float) -> Submitted | DispoError:
        try:
            return _submitted(self._call(self._stub.Submit, item.request, timeout))
        except DispoError as error:
            return error

    def submit_many(
        self, requests: Sequence[TaskRequest], *, timeout: float = 30.0
    ) -> list[Submitted]:
        """Submit every task of ``requests`` in one call (at most 500), all or none: one
        invalid task refuses the call, naming ``requests[i]``, and records nothing. One
        :class:`Submitted` per task, in order. Refused for the Submit rate: sent again as
        :meth:`submit` is."""
        request = _submit_many_request(requests)
        ends = time.monotonic() + timeout
        while True:
            try:
                reply = self._call(self._stub.SubmitMany, request, ends - time.monotonic())
                return _all_submitted(reply)
            except DispoError as error:
                wait = _limited_wait(error, ends) if self.retry_limited else None
                if wait is None:
                    raise
                time.sleep(wait)

    def get(self, task_id: str, *, timeout: float = 10.0) -> TaskView:
        reply = self._call(self._stub.GetTask, gateway_pb2.GetTaskRequest(task_id=task_id), timeout)
        return TaskView.from_proto(reply.task, reply.completion, reply.labels, reply.erasure)

    def erase(self, task_id: str, *, timeout: float = 10.0) -> TaskView:
        """Erase a finished task's payloads and outputs (ADR-0113); the same answer again
        for an erased task."""
        reply = self._call(
            self._stub.EraseTask, gateway_pb2.EraseTaskRequest(task_id=task_id), timeout
        )
        return TaskView.from_proto(reply.task, erasure=reply.erasure)

    def cancel(self, task_id: str, *, timeout: float = 10.0) -> TaskView:
        reply = self._call(
            self._stub.CancelTask, gateway_pb2.CancelTaskRequest(task_id=task_id), timeout
        )
        return TaskView.from_proto(reply.task)

    def signal(
        self,
        task_id: str,
        signal: str,
        payload: dict[str, Any] | None = None,
        *,
        signal_id: str = "",
        business: str = "",
        idempotency_key: str = "",
        timeout: float = 10.0,
    ) -> Signalled:
        """As :meth:`AsyncClient.signal`."""
        request = signal_request(task_id, signal, payload, signal_id, business, idempotency_key)
        return signalled(self._call(self._stub.SignalTask, request, timeout))

    def list_queues(
        self, executor: str = EXECUTOR_ADDRESS, *, timeout: float | None = 10.0
    ) -> list[WorkerQueue]:
        """The worker queues, by name, as the executor at ``executor`` (any replica) sees
        them: live workers, when one was last seen, runs offered and taken, the limit
        (ListQueues; an admin token's call)."""
        with open_sync_channel(executor, self._token, tls=self._tls) as channel:
            stub = executor_pb2_grpc.ExecutorServiceStub(channel)
            reply = self._call(stub.ListQueues, executor_pb2.ListQueuesRequest(), timeout)
        return queues_of(reply)

    def list_page(
        self,
        *,
        business: str = "",
        statuses: Sequence[str] = (),
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int = 100,
        page_token: str = "",
        order: str = "newest",
        idempotency_key: str = "",
        scheduled: bool = False,
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        timeout: float | None = 10.0,
    ) -> TaskPage:
        """One page of matching tasks, ``order`` by creation: "newest" (first) or "oldest";
        with ``idempotency_key``, the task submitted with that key (one per business); with
        ``scheduled``, only tasks whose delayed start is ahead; with ``priorities``, only
        tasks of any of them (1 highest … 5)."""
        reply = self._call(
            self._stub.ListTasks,
            list_request(
                business,
                statuses,
                created_after,
                created_before,
                page_size,
                page_token,
                order,
                idempotency_key,
                scheduled,
                labels,
                priorities,
            ),
            timeout,
        )
        return TaskPage.from_proto(reply)

    def list(
        self,
        *,
        business: str = "",
        statuses: Sequence[str] = (),
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int = 100,
        order: str = "newest",
        idempotency_key: str = "",
        scheduled: bool = False,
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        page_timeout: float | None = 10.0,
    ) -> Iterator[TaskSummary]:
        """Every matching task, newest first unless ``order="oldest"``, following the cursor;
        each page's call gives up after ``page_timeout`` seconds (``DEADLINE_EXCEEDED``)."""
        token = ""
        while True:
            page = self.list_page(
                business=business,
                statuses=statuses,
                created_after=created_after,
                created_before=created_before,
                page_size=page_size,
                page_token=token,
                order=order,
                idempotency_key=idempotency_key,
                scheduled=scheduled,
                labels=labels,
                priorities=priorities,
                timeout=page_timeout,
            )
            yield from page.tasks
            token = page.next_page_token
            if not page.more:
                return

    def count(
        self,
        *,
        business: str = "",
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        idempotency_key: str = "",
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        timeout: float = 10.0,
    ) -> dict[str, int]:
        """How many matching tasks are in each status, exactly: every status name, 0
        included ({"SUCCEEDED": 3, "FAILED": 0, …})."""
        request = count_request(
            business, created_after, created_before, idempotency_key, labels, priorities
        )
        return counts_of(self._call(self._stub.CountTasks, request, timeout))

    def cancel_by_filter(
        self,
        *,
        business: str = "",
        statuses: Sequence[str] = (),
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        idempotency_key: str = "",
        rate_per_second: float = 100.0,
        dry_run: bool = False,
        reason: str = "",
        labels: Mapping[str, str] | None = None,
        priorities: Sequence[int] = (),
        timeout: float = 10.0,
    ) -> BulkAction:
        """Cancel every unfinished task these filters match (CountTasks' filters; statuses
        by name, none: every unfinished one), at most ``rate_per_second`` a second, in the
        gateway's background: follow it with :meth:`bulk_action`. A dry run only counts
        (``matched``; no ``action_id``)."""
        request = cancel_by_filter_request(
            business,
            statuses,
            created_after,
            created_before,
            idempotency_key,
            rate_per_second,
            dry_run,
            reason,
            labels,
            priorities,
        )
        reply = self._call(self._stub.CancelByFilter, request, timeout)
        return BulkAction.from_proto(reply.action, reply.matched)

    def bulk_action(self, action_id: str, *, timeout: float = 10.0) -> BulkAction:
        """One bulk action's record, as it stands now."""
        request = gateway_pb2.GetBulkActionRequest(action_id=action_id)
        return BulkAction.from_proto(self._call(self._stub.GetBulkAction, request, timeout).action)

    def bulk_actions(self, *, page_size: int = 50, timeout: float = 10.0) -> tuple[BulkAction, ...]:
        """The newest bulk actions (one page), newest first."""
        request = gateway_pb2.ListBulkActionsRequest(
            page=common_pb2.PageRequest(page_size=page_size)
        )
        reply = self._call(self._stub.ListBulkActions, request, timeout)
        return tuple(BulkAction.from_proto(a) for a in reply.actions)

    def events_page(
        self, task_id: str, *, page_size: int = 100, page_token: str = "", timeout: float = 10.0
    ) -> TaskEventPage:
        """One page of the task's history, oldest first: each status snapshot published
        for it, with the nodes that changed (the status stream keeps 7 days of them)."""
        request = events_request(task_id, page_size, page_token)
        return TaskEventPage.from_proto(self._call(self._stub.ListTaskEvents, request, timeout))

    def events(self, task_id: str, *, page_size: int = 100) -> tuple[TaskEvent, ...]:
        """The task's whole history as stored now, oldest first, following the pages."""
        out: tuple[TaskEvent, ...] = ()
        token = ""
        while True:
            page = self.events_page(task_id, page_size=page_size, page_token=token)
            out += page.events
            token = page.next_page_token
            if not page.more:
                return out

    def watch(self, task_id: str, *, timeout: float | None = None) -> Iterator[TaskView]:
        try:
            for reply in self._stub.WatchTask(
                gateway_pb2.WatchTaskRequest(task_id=task_id), timeout=timeout
            ):
                yield TaskView.from_proto(reply.task)
        except grpc.RpcError as error:
            raise DispoError.from_rpc(error) from None

    def wait(self, task_id: str, *, timeout: float = 60.0) -> TaskView:
        """As :meth:`AsyncClient.wait`: the terminal view, with its outputs and result."""
        deadline = time.monotonic() + timeout
        last: TaskView | None = None
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                for view in self.watch(task_id, timeout=remaining):
                    last = view
                    if view.terminal:
                        return self.get(task_id) if view.outputs_unavailable else view
            except DispoError as error:
                if error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
                if error.code is not grpc.StatusCode.UNAVAILABLE:
                    raise
                time.sleep(0.2)
        raise TimeoutError(
            f"task {task_id} not terminal after {timeout}s (last: {last and last.status})"
        )
