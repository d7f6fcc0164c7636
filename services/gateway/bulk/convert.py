"""CancelByFilter's request checked, and bulk actions as the API shows them."""

from __future__ import annotations

from dispo.gateway import store
from dispo.gateway.bulk.store import BulkActionRow
from dispo.gateway.convert import stored_status
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.errors import InvalidArgument
from dispo.libs.timestamps import set_timestamp

_STATES = {
    "running": gateway_pb2.BULK_ACTION_STATE_RUNNING,
    "done": gateway_pb2.BULK_ACTION_STATE_DONE,
}


def check_cancel(request: gateway_pb2.CancelByFilterRequest, max_rate: float) -> None:
    """INVALID_ARGUMENT naming the field for a status no cancel takes or a rate out of
    bounds (a dry run's rate is not read)."""
    for i, status in enumerate(request.statuses):
        if status == common_pb2.TASK_STATUS_UNSPECIFIED or status not in (
            common_pb2.TaskStatus.values()
        ):
            raise InvalidArgument(f"statuses[{i}]", "not a task status")
        if stored_status(status) in store.TERMINAL:
            name = common_pb2.TaskStatus.Name(status)
            raise InvalidArgument(f"statuses[{i}]", f"{name} is finished: nothing to cancel")
    rate = request.rate_per_second
    if not request.dry_run and not 0 < rate <= max_rate:
        raise InvalidArgument("rate_per_second", f"must be > 0 and at most {max_rate:g}")


def action_to_proto(row: BulkActionRow) -> gateway_pb2.BulkAction:
    out = gateway_pb2.BulkAction(
        action_id=row.action_id,
        kind=row.kind,
        actor=row.actor,
        reason=row.reason,
        request=gateway_pb2.CancelByFilterRequest.FromString(row.request),
        state=_STATES.get(row.state, gateway_pb2.BULK_ACTION_STATE_UNSPECIFIED),
        matched=row.matched,
        processed=row.processed,
        acted=row.acted,
        skipped=row.skipped,
    )
    set_timestamp(out.cutoff, row.cutoff)
    set_timestamp(out.created_at, row.created_at)
    if row.finished_at is not None:
        set_timestamp(out.finished_at, row.finished_at)
    return out
