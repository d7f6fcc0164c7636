"""The gateway's task reads as requests built from plain values — ListTasks, CountTasks,
ListTaskEvents — and CountTasks' answer by status name. The SDK's clients and the web
console build them here, so both ask the same question for the same filters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.proto_enums import from_short_name, task_status_name
from dispo.libs.timestamps import set_timestamp

ORDERS = {
    "newest": gateway_pb2.TASK_ORDER_NEWEST_FIRST,
    "oldest": gateway_pb2.TASK_ORDER_OLDEST_FIRST,
}


def list_request(
    business: str,
    statuses: Sequence[str],
    created_after: datetime | None,
    created_before: datetime | None,
    page_size: int,
    page_token: str,
    order: str,
    idempotency_key: str = "",
    scheduled: bool = False,
    labels: Mapping[str, str] | None = None,
    priorities: Sequence[int] = (),
) -> gateway_pb2.ListTasksRequest:
    """The ListTasks request for these filters; ``statuses`` by name ("SUCCEEDED"),
    ``order`` one of :data:`ORDERS` (else ValueError); ``scheduled``: only tasks whose
    delayed start is ahead; ``labels``: only tasks carrying every one of them;
    ``priorities``: only tasks of any of them (1 highest … 5)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    request = gateway_pb2.ListTasksRequest(
        business=business,
        statuses=[from_short_name(common_pb2.TaskStatus, s) for s in statuses],
        page=common_pb2.PageRequest(page_size=page_size, page_token=page_token),
        order=ORDERS[order],
        idempotency_key=idempotency_key,
        scheduled=scheduled,
        labels=labels or {},
        priorities=priorities,
    )
    _set_window(request, created_after, created_before)
    return request


def count_request(
    business: str,
    created_after: datetime | None,
    created_before: datetime | None,
    idempotency_key: str,
    labels: Mapping[str, str] | None = None,
    priorities: Sequence[int] = (),
) -> gateway_pb2.CountTasksRequest:
    """The CountTasks request for these filters."""
    request = gateway_pb2.CountTasksRequest(
        business=business,
        idempotency_key=idempotency_key,
        labels=labels or {},
        priorities=priorities,
    )
    _set_window(request, created_after, created_before)
    return request


def cancel_by_filter_request(
    business: str,
    statuses: Sequence[str],
    created_after: datetime | None,
    created_before: datetime | None,
    idempotency_key: str,
    rate_per_second: float,
    dry_run: bool,
    reason: str,
    labels: Mapping[str, str] | None = None,
    priorities: Sequence[int] = (),
) -> gateway_pb2.CancelByFilterRequest:
    """The CancelByFilter request: CountTasks' filters, the unfinished ``statuses`` by name
    (none: every unfinished one), the rate, a dry run, the reason."""
    return gateway_pb2.CancelByFilterRequest(
        filter=count_request(
            business, created_after, created_before, idempotency_key, labels, priorities
        ),
        statuses=[from_short_name(common_pb2.TaskStatus, s) for s in statuses],
        rate_per_second=rate_per_second,
        dry_run=dry_run,
        reason=reason,
    )


def _set_window(
    request: gateway_pb2.ListTasksRequest | gateway_pb2.CountTasksRequest,
    created_after: datetime | None,
    created_before: datetime | None,
) -> None:
    """The creation-time window of a ListTasks or CountTasks request (a naive time is UTC)."""
    if created_after:
        set_timestamp(request.created_after, created_after)
    if created_before:
        set_timestamp(request.created_before, created_before)


def events_request(
    task_id: str, page_size: int, page_token: str
) -> gateway_pb2.ListTaskEventsRequest:
    """The ListTaskEvents request for one page of a task's history."""
    return gateway_pb2.ListTaskEventsRequest(
        task_id=task_id, page=common_pb2.PageRequest(page_size=page_size, page_token=page_token)
    )


def label_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["k=v", …]`` as a label map (the CLI's ``--label`` and the console's filter);
    ValueError for a pair without '=' or a key given two values. The gateway checks the
    keys and values."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"a label is key=value, not {pair!r}")
        if out.setdefault(key, value) != value:
            raise ValueError(f"label {key!r} given two values")
    return out


def counts_of(reply: gateway_pb2.CountTasksResponse) -> dict[str, int]:
    """CountTasks' counts by status name ("SUCCEEDED": 3), every status, in the enum's order."""
    return {task_status_name(c.status): c.count for c in reply.counts}
