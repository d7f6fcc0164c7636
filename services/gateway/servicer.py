"""GatewayService: thin; converts at the edge and calls :class:`dispo.gateway.operations.Gateway`."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime

import grpc
from dispo.gateway import store
from dispo.gateway.bulk import convert as bulk_convert
from dispo.gateway.bulk import store as bulk_store
from dispo.gateway.bulk.operations import BulkCancels, statuses_of
from dispo.gateway.convert import (
    output_fields,
    signal_payload_from_proto,
    status_value,
    stored_status,
    submission_from_proto,
)
from dispo.gateway.events import task_event
from dispo.gateway.expand import Submission
from dispo.gateway.labels import checked
from dispo.gateway.limits import MAX_SUBMIT_MANY, CallerLimits, limited_business
from dispo.gateway.operations import Accepted, Gateway
from dispo.gateway.outputs import ViewOutputs
from dispo.gateway.store import TaskFilter
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.api.task.v1 import task_pb2
from dispo.libs.auth import (
    business_filter,
    business_scope,
    caller,
    require_priority,
    require_visible,
)
from dispo.libs.bus import Bus, StreamUnavailable
from dispo.libs.catalogue import Catalogue
from dispo.libs.contracts import tasks
from dispo.libs.contracts.tasks import HIGHEST_PRIORITY, LOWEST_PRIORITY
from dispo.libs.errors import (
    DomainError,
    FieldViolation,
    InvalidArgument,
    NotFound,
    Unavailable,
    within,
)
from dispo.libs.grpcserver import status_of
from dispo.libs.logging import get_logger
from dispo.libs.paging import (
    decode_page_token,
    encode_page_token,
    invalid_page_token,
    page_size,
)
from dispo.libs.payload import canonical_json
from dispo.libs.proto_enums import from_short_name
from dispo.libs.timestamps import set_timestamp
from google.protobuf.message import DecodeError

log = get_logger(__name__)


def _task_id(value: str) -> str:
    if not value:
        raise InvalidArgument("task_id", "required")
    return value


# A task id is one token of a status subject: no dots, no wildcards (Submit makes 32 hex).
_TASK_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _event_task_id(value: str) -> str:
    """The task id of ListTaskEvents, checked to be one subject token it can filter on."""
    _task_id(value)
    if len(value) > 64:
        raise InvalidArgument("task_id", "longer than 64 characters")
    if not _TASK_ID.fullmatch(value):
        raise InvalidArgument("task_id", "only letters, digits, '_' and '-'")
    return value


def _submit_items(
    items: Sequence[gateway_pb2.SubmitRequest],
) -> Sequence[gateway_pb2.SubmitRequest]:
    """The requests of a SubmitMany or SubmitEach: at least one, at most the bound."""
    if not items:
        raise InvalidArgument("requests", "at least one request is required")
    if len(items) > MAX_SUBMIT_MANY:
        raise InvalidArgument("requests", f"at most {MAX_SUBMIT_MANY} requests per call")
    return items


def _submit_response(accepted: Accepted) -> gateway_pb2.SubmitResponse:
    return gateway_pb2.SubmitResponse(
        task_id=accepted.task_id,
        status=status_value(accepted.status),
        duplicate=accepted.duplicate,
    )


def _order_name(newest_first: bool) -> str:
    return "newest" if newest_first else "oldest"


def _cursor(token: str, newest_first: bool) -> tuple[datetime, str] | None:
    """The (created_at, task_id) a ListTasks page continues after; a token of the other
    order is not one of this list's."""
    decoded = decode_page_token(token, str, datetime, str)
    if decoded is None:
        return None
    order, created_at, task_id = decoded
    if order != _order_name(newest_first):
        raise invalid_page_token()
    return created_at, task_id


def _task_filter(
    request: gateway_pb2.ListTasksRequest | gateway_pb2.CountTasksRequest,
    max_key_length: int,
    now: datetime | None = None,
) -> TaskFilter:
    """The tasks a ListTasks or CountTasks request takes, confined to the caller's business
    for a business token (PERMISSION_DENIED naming ``business`` for another); a ListTasks
    asking for ``scheduled`` tasks takes those whose start is after ``now``."""
    scheduled = isinstance(request, gateway_pb2.ListTasksRequest) and request.scheduled
    if len(request.idempotency_key) > max_key_length:
        raise InvalidArgument("idempotency_key", f"longer than {max_key_length} characters")
    priorities = _priorities(request.priorities)
    return TaskFilter(
        business=business_filter(request.business, "business"),
        created_after=request.created_after.ToDatetime(tzinfo=UTC)
        if request.HasField("created_after")
        else None,
        created_before=request.created_before.ToDatetime(tzinfo=UTC)
        if request.HasField("created_before")
        else None,
        idempotency_key=request.idempotency_key,
        scheduled_at=now if scheduled else None,
        labels=tuple(sorted(checked(request.labels).items())),
        priorities=priorities,
    )


def _priorities(values: Sequence[int]) -> tuple[int, ...]:
    """The priorities a filter takes, each once, highest first; INVALID_ARGUMENT naming
    ``priorities[i]`` for each one outside 1..5."""
    bad = [
        FieldViolation(f"priorities[{i}]", f"{value} is not a priority: 1 (highest) to 5")
        for i, value in enumerate(values)
        if not HIGHEST_PRIORITY <= value <= LOWEST_PRIORITY
    ]
    if bad:
        raise InvalidArgument(violations=bad)
    return tuple(sorted(set(values)))


def bulk_filter(max_key_length: int) -> Callable[[gateway_pb2.CancelByFilterRequest], TaskFilter]:
    """The tasks a bulk action's filter takes, as ListTasks and CountTasks take them (its
    business is the one the caller may act for, filled in when it was asked). Labels
    (ADR-0110) and priorities are more fields of CountTasksRequest: the filter takes them
    with the rest, through :func:`_task_filter`; a bad one is named ``filter.<field>``."""

    def of(request: gateway_pb2.CancelByFilterRequest) -> TaskFilter:
        try:
            return _task_filter(request.filter, max_key_length)
        except InvalidArgument as error:
            raise within("filter", error) from None

    return of


def _erased_by() -> str:
    """Who is erasing: the caller's kind and name, with its token's id."""
    principal = caller()
    if principal is None:
        return "internal"
    name = principal.business or principal.service
    return f"{principal.kind.value}{':' + name if name else ''} ({principal.token_id})"


def _erasure(record: store.TaskRecord) -> gateway_pb2.Erasure | None:
    if record.erased_at is None:
        return None
    out = gateway_pb2.Erasure(erased_by=record.erased_by)
    set_timestamp(out.erased_at, record.erased_at)
    return out


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(
        self,
        gateway: Gateway,
        max_page_size: int,
        limits: CallerLimits,
        bus: Bus,
        events_timeout: float = 5.0,
        outputs: ViewOutputs | None = None,
        bulk: BulkCancels | None = None,
    ) -> None:
        self.gateway = gateway
        # CancelByFilter's actions (ADR-0112); none: CancelByFilter is UNAVAILABLE.
        self.bulk = bulk
        # Where the views' outputs come from (none: every view with outputs is answered
        # ``outputs_unavailable``).
        self.outputs = outputs or ViewOutputs(None)
        self.max_page_size = max_page_size
        self.limits = limits
        self.bus = bus
        self.events_timeout = events_timeout

    async def _visible(self, task_id: str) -> str:
        """``task_id`` if the caller may see it: another business's task is NOT_FOUND, as
        one that does not exist (dispo.libs.auth.scope)."""
        if business_scope() is not None:
            record = await self.gateway.get_record(task_id)
            require_visible(record.business, f"no task {task_id!r}")
        return task_id

    async def Submit(
        self, request: gateway_pb2.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.SubmitResponse:
        sub, new = await self._admitted(request, context)
        return _submit_response(await self.gateway.submit(sub, new))

    async def _admitted(
        self, request: gateway_pb2.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> tuple[Submission, store.NewTask]:
        """What a Submit of ``request`` asks for and the task it makes (prepared), once its
        caller may act for its business, the request is valid (its cells too, by the
        catalogue) and that business has a Submit token left (each refusal names its field).
        A refused request writes nothing: not even a share of the rate."""
        business = business_filter(request.business, "business")
        sub = submission_from_proto(request, business)
        require_priority(sub.priority, "priority")
        new = await self.gateway.prepare(sub)
        limited = limited_business(context, business)
        await self.limits.prepare([limited])
        self.limits.admit_submit(limited)
        return sub, new

    async def SubmitMany(
        self, request: gateway_pb2.SubmitManyRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.SubmitManyResponse:
        """Each item as Submit takes it (authorised, validated, prepared, counted) before any
        is recorded: a refusal of one item refuses the call, naming ``requests[i]``."""
        items = _submit_items(request.requests)
        businesses = [
            business_filter(item.business, f"requests[{i}].business")
            for i, item in enumerate(items)
        ]
        counts: dict[str, int] = {}
        for business in businesses:
            limited = limited_business(context, business)
            counts[limited] = counts.get(limited, 0) + 1
        subs, news, invalid = [], [], []
        refused: DomainError | None = None
        for i, (item, business) in enumerate(zip(items, businesses, strict=True)):
            try:
                sub = submission_from_proto(item, business)
                require_priority(sub.priority, "priority")
                news.append(await self.gateway.prepare(sub))
                subs.append(sub)
            except InvalidArgument as error:
                invalid += within(f"requests[{i}]", error).violations
            except DomainError as error:
                refused = refused or within(f"requests[{i}]", error)
        if invalid:
            raise InvalidArgument(violations=invalid)
        if refused is not None:
            raise refused
        # Counted once every item is valid: a refused call writes nothing, not even a share.
        await self.limits.prepare(counts)
        self.limits.admit_submits(counts)
        answers = await self.gateway.submit_all(subs, news)
        out = gateway_pb2.SubmitManyResponse()
        for i, accepted in enumerate(answers):
            if isinstance(accepted, DomainError):
                raise within(f"requests[{i}]", accepted)
            if isinstance(accepted, BaseException):
                raise accepted
            out.responses.append(_submit_response(accepted))
        return out

    async def SubmitEach(
        self, request: gateway_pb2.SubmitEachRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.SubmitEachResponse:
        """Each item exactly as Submit takes it (authorised, validated, prepared, counted,
        recorded), refused or answered in its place: no item's refusal touches another's."""
        items = _submit_items(request.requests)
        out = gateway_pb2.SubmitEachResponse()
        outcomes = [out.outcomes.add() for _ in items]
        subs, news, places = [], [], []
        for i, item in enumerate(items):
            try:
                sub, new = await self._admitted(item, context)
                news.append(new)
            except DomainError as error:
                outcomes[i].refused.CopyFrom(status_of(error))
                continue
            subs.append(sub)
            places.append(i)
        answers = await self.gateway.submit_all(subs, news) if news else []
        for i, accepted in zip(places, answers, strict=True):
            if isinstance(accepted, DomainError):
                outcomes[i].refused.CopyFrom(status_of(accepted))
            elif isinstance(accepted, BaseException):
                raise accepted  # nothing is known of this flush's items: the call fails
            else:
                outcomes[i].accepted.CopyFrom(_submit_response(accepted))
        return out

    async def GetTask(
        self, request: gateway_pb2.GetTaskRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.GetTaskResponse:
        task_id = _task_id(request.task_id)
        record = await self.gateway.get_record(task_id)
        require_visible(record.business, f"no task {task_id!r}")
        completion = gateway_pb2.Completion(callback_url=record.callback_url)
        if record.finished_at is not None:
            set_timestamp(completion.finished_at, record.finished_at)
        view = await self.outputs.complete(self.gateway.view_of(record))
        return gateway_pb2.GetTaskResponse(
            task=view, completion=completion, labels=record.labels, erasure=_erasure(record)
        )

    async def ListTasks(
        self, request: gateway_pb2.ListTasksRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListTasksResponse:
        size = page_size(request.page, maximum=self.max_page_size)
        newest_first = request.order != gateway_pb2.TASK_ORDER_OLDEST_FIRST
        statuses = []
        for i, value in enumerate(request.statuses):
            if (
                value == common_pb2.TASK_STATUS_UNSPECIFIED
                or value not in common_pb2.TaskStatus.values()
            ):
                raise InvalidArgument(f"statuses[{i}]", "not a task status")
            statuses.append(stored_status(value))
        records = await self.gateway.list(
            _task_filter(request, self.gateway.limits.max_key_length, self.gateway.clock.now()),
            statuses=statuses,
            after=_cursor(request.page.page_token, newest_first),
            newest_first=newest_first,
            limit=size + 1,
        )
        out = gateway_pb2.ListTasksResponse()
        for record in records[:size]:
            item = out.tasks.add(
                task_id=record.task_id,
                business=record.business,
                status=status_value(record.status),
                node_count=record.node_count,
                cancel_requested=record.cancel_requested,
                labels=record.labels,
                priority=record.priority,
            )
            set_timestamp(item.created_at, record.created_at)
            set_timestamp(item.updated_at, record.updated_at)
            if record.not_before is not None:
                set_timestamp(item.not_before, record.not_before)
            if record.deadline is not None:
                set_timestamp(item.deadline, record.deadline)
        if len(records) > size:
            last = records[size - 1]
            out.more = True
            out.page.next_page_token = encode_page_token(
                _order_name(newest_first), last.created_at, last.task_id
            )
        return out

    async def CountTasks(
        self, request: gateway_pb2.CountTasksRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CountTasksResponse:
        counts = await self.gateway.counts(
            _task_filter(request, self.gateway.limits.max_key_length)
        )
        out = gateway_pb2.CountTasksResponse()
        for value in common_pb2.TaskStatus.values():
            if value != common_pb2.TASK_STATUS_UNSPECIFIED:
                out.counts.add(status=value, count=counts.get(stored_status(value), 0))
        out.total = sum(c.count for c in out.counts)
        return out

    async def CancelTask(
        self, request: gateway_pb2.CancelTaskRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CancelTaskResponse:
        return gateway_pb2.CancelTaskResponse(
            task=await self.gateway.cancel(await self._visible(_task_id(request.task_id)))
        )

    async def CancelByFilter(
        self, request: gateway_pb2.CancelByFilterRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.CancelByFilterResponse:
        if self.bulk is None:
            raise Unavailable("bulk actions are not served by this gateway")
        bulk_convert.check_cancel(request, self.bulk.max_rate)
        asked = gateway_pb2.CancelByFilterRequest()
        asked.CopyFrom(request)
        # The filter as the caller may ask it: a business token's own business.
        asked.filter.business = business_filter(request.filter.business, "filter.business")
        principal = caller()
        matched, row = await self.bulk.start(
            asked, statuses_of(asked), principal.token_id if principal else ""
        )
        out = gateway_pb2.CancelByFilterResponse(matched=matched)
        if row is not None:
            out.action.CopyFrom(bulk_convert.action_to_proto(row))
        return out

    async def GetBulkAction(
        self, request: gateway_pb2.GetBulkActionRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.GetBulkActionResponse:
        action_id = request.action_id
        if not action_id:
            raise InvalidArgument("action_id", "required")
        missing = f"no bulk action {action_id!r}"
        async with self.gateway.db.connection() as conn:
            row = await bulk_store.bulk_action_get(conn, action_id)
        if row is None:
            raise NotFound(missing)
        require_visible(row.business, missing)
        return gateway_pb2.GetBulkActionResponse(action=bulk_convert.action_to_proto(row))

    async def ListBulkActions(
        self, request: gateway_pb2.ListBulkActionsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListBulkActionsResponse:
        limit = page_size(request.page, maximum=self.max_page_size)
        decoded = decode_page_token(request.page.page_token, int)
        offset = 0 if decoded is None else decoded[0]
        if offset < 0:
            raise invalid_page_token()
        async with self.gateway.db.connection() as conn:
            rows = await bulk_store.bulk_actions_list(conn, business_scope(), limit, offset)
        out = gateway_pb2.ListBulkActionsResponse(
            actions=[bulk_convert.action_to_proto(r) for r in rows]
        )
        if len(rows) == limit:
            out.page.next_page_token = encode_page_token(offset + limit)
        return out

    async def EraseTask(
        self, request: gateway_pb2.EraseTaskRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.EraseTaskResponse:
        task_id = await self._visible(_task_id(request.task_id))
        record = await self.gateway.erase(task_id, _erased_by())
        return gateway_pb2.EraseTaskResponse(
            task=self.gateway.view_of(record), erasure=_erasure(record)
        )

    async def SignalTask(
        self, request: gateway_pb2.SignalTaskRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.SignalTaskResponse:
        if not request.signal:
            raise InvalidArgument("signal", "required")
        max_key = self.gateway.limits.max_key_length
        if len(request.signal_id) > max_key:
            raise InvalidArgument("signal_id", f"longer than {max_key} characters")
        payload = signal_payload_from_proto(request)
        task_id = await self._visible(await self._signalled_task(request))
        signal_id, duplicate = await self.gateway.signal(
            task_id, request.signal, payload, request.signal_id
        )
        return gateway_pb2.SignalTaskResponse(
            task_id=task_id, signal_id=signal_id, duplicate=duplicate
        )

    async def _signalled_task(self, request: gateway_pb2.SignalTaskRequest) -> str:
        """The task a SignalTask names: its id, or its business and idempotency key (a
        business token's own business only: PERMISSION_DENIED naming ``business``)."""
        if request.task_id:
            return request.task_id
        if not request.idempotency_key:
            raise InvalidArgument("task_id", "required (or business and idempotency_key)")
        business = business_filter(request.business, "business")
        if not business:
            raise InvalidArgument("business", "required with idempotency_key")
        holder = await self.gateway.holder(business, request.idempotency_key)
        if holder is None:
            raise NotFound(
                f"no task of business {business!r} with idempotency key {request.idempotency_key!r}"
            )
        return holder

    async def WatchTask(
        self, request: gateway_pb2.WatchTaskRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[gateway_pb2.WatchTaskResponse]:
        versions = self.gateway.watch(await self._visible(_task_id(request.task_id)))
        views = self.outputs.follow(versions)  # each with its outputs, read when they change
        try:
            first = await anext(views, None)  # NOT_FOUND before any stream is held
            if first is None:
                return
            with self.limits.watching(limited_business(context, first.business)):
                yield gateway_pb2.WatchTaskResponse(task=first)
                async for view in views:
                    yield gateway_pb2.WatchTaskResponse(task=view)
        finally:
            await views.aclose()
            await versions.aclose()

    async def ListTaskEvents(
        self, request: gateway_pb2.ListTaskEventsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListTaskEventsResponse:
        task_id = _event_task_id(request.task_id)
        size = page_size(request.page, maximum=self.max_page_size)
        decoded = decode_page_token(request.page.page_token, str, int)
        if decoded is not None and (decoded[0] != task_id or decoded[1] < 1):
            raise invalid_page_token()  # another task's token
        after = decoded[1] if decoded is not None else 0
        record = await self.gateway.get_record(task_id)  # NOT_FOUND as GetTask answers
        require_visible(record.business, f"no task {task_id!r}")
        # From the last event of the page before (the baseline of its successor's changes),
        # one more than the page to know whether another follows.
        try:
            stored = await self.bus.read_subject(
                tasks.TASK_STATUS.name,
                tasks.task_status_of(task_id),
                start_sequence=after or 1,
                limit=size + 1 + (1 if after else 0),
                timeout=self.events_timeout,
            )
        except TimeoutError:
            raise Unavailable("the status stream did not answer in time; try again") from None
        except StreamUnavailable as error:
            log.warning("status stream unavailable", error=str(error))
            raise Unavailable("the status stream is not available right now; try again") from None
        previous: task_pb2.Task | None = None
        out = gateway_pb2.ListTaskEventsResponse()
        for message in stored:
            try:
                snapshot = task_pb2.Task.FromString(message.data)
            except DecodeError:  # the view skips it too
                continue
            if message.sequence <= after:
                previous = snapshot
                continue
            if len(out.events) == size:
                out.more = True
                break
            event = task_event(
                previous,
                snapshot,
                sequence=message.sequence,
                publisher=tasks.status_publisher(task_id, message.msg_id),
            )
            set_timestamp(event.time, message.time)
            out.events.append(event)
            previous = snapshot
        if out.events:
            out.page.next_page_token = encode_page_token(task_id, out.events[-1].sequence)
        return out

    async def ListCells(
        self, request: gateway_pb2.ListCellsRequest, context: grpc.aio.ServicerContext
    ) -> gateway_pb2.ListCellsResponse:
        return cells_to_proto(self.gateway.catalogue)


def cells_to_proto(catalogue: Catalogue) -> gateway_pb2.ListCellsResponse:
    out = gateway_pb2.ListCellsResponse()
    for cell in sorted(catalogue.cells.values(), key=lambda c: c.name):
        item = out.cells.add(
            name=cell.name,
            description=cell.description,
            result_actions=cell.result_actions,
            max_duration_seconds=cell.max_duration_seconds,
            labels=list(cell.labels),
        )
        for f in cell.fields:
            item.fields.add(
                name=f.name,
                type=from_short_name(gateway_pb2.FieldType, f.type.upper()),
                required=f.required,
            )
        for a in cell.actions:
            item.actions.add(
                name=a.name,
                kind=from_short_name(gateway_pb2.ActionKind, a.kind.upper()),
                downstream=a.downstream,
                depends_on=list(a.depends_on),
                idempotent=a.idempotent,
                has_probe=bool(a.probe_path),
                max_effect_seconds=a.max_effect_seconds,
                queue=a.queue,
                output=output_fields(a),
                max_output_bytes=a.max_output_bytes,
                signal=a.signal,
                timeout_seconds=a.timeout_seconds,
                on_timeout=a.on_timeout,
                choices=[
                    gateway_pb2.SignalChoice(name=name, payload_json=canonical_json(payload))
                    for name, payload in a.choices
                ],
            )
    return out
