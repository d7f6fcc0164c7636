"""The caller of the RPC being served, and what a business token may see of the work.

The gRPC layer (:mod:`dispo.libs.grpcserver`) sets the caller for each call; servicers ask:

    require_visible(record.business, f"no task {task_id!r}")   # another's: NOT_FOUND
    business = business_filter(request.business, "business")   # theirs, or PERMISSION_DENIED

A worker token serves its queues only:

    require_queues(request.queues, "queues")                 # another's: PERMISSION_DENIED

A task of another business is NOT_FOUND with the message of a task that does not exist, so
an id tells a business nothing. A request that names another business is PERMISSION_DENIED
naming the field; leaving the business empty means the caller's own. Admin and service
tokens see every business. Code called outside a gRPC call (a test calling a servicer
directly, a sweep) has no caller and is not scoped.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar

from dispo.libs.auth.tokens import Kind, Principal
from dispo.libs.errors import FieldViolation, NotFound, PermissionDenied

_caller: ContextVar[Principal | None] = ContextVar("dispo_caller", default=None)


def set_caller(principal: Principal) -> None:
    """The caller of the call being served. gRPC serves each call in a task of its own,
    which has its own copy of the context: the caller goes with the call."""
    _caller.set(principal)


def caller() -> Principal | None:
    return _caller.get()


def business_scope() -> str | None:
    """The business the caller is bound to; None when it may see every business."""
    principal = _caller.get()
    if principal is None or principal.kind is not Kind.BUSINESS:
        return None
    return principal.business


def visible(business: str) -> bool:
    scope = business_scope()
    return scope is None or scope == business


def require_visible(business: str, not_found: str) -> None:
    """NOT_FOUND with ``not_found`` (the message of a missing one) unless the caller may see
    work of ``business``."""
    if not visible(business):
        raise NotFound(not_found)


def business_filter(requested: str, field: str) -> str:
    """The business a request acts for: for a business token its own (``requested`` empty or
    the same), PERMISSION_DENIED naming ``field`` for another; ``requested`` for the rest."""
    scope = business_scope()
    if scope is None:
        return requested
    if requested and requested != scope:
        message = f"a token of business {scope!r} cannot act for business {requested!r}"
        raise PermissionDenied(f"{field}: {message}", [FieldViolation(field, message)])
    return scope


def require_priority(priority: int, field: str) -> None:
    """PERMISSION_DENIED naming ``field`` when the caller's token may not ask for
    ``priority`` (1 highest … 5): a business token created with a lower maximum."""
    principal = _caller.get()
    if principal is None or principal.kind is not Kind.BUSINESS:
        return
    if priority < principal.max_priority:
        message = (
            f"a token of business {principal.business!r} may ask for priority"
            f" {principal.max_priority} to 5, not {priority}"
        )
        raise PermissionDenied(f"{field}: {message}", [FieldViolation(field, message)])


def queue_scope() -> tuple[str, ...] | None:
    """The queues the caller serves when it is a worker token; None when it may serve every
    queue (an admin token, or no caller)."""
    principal = _caller.get()
    if principal is None or principal.kind is not Kind.WORKER:
        return None
    return principal.queues


def require_queues(queues: Iterable[str], field: str) -> None:
    """PERMISSION_DENIED naming ``field`` unless the caller may serve every one of
    ``queues`` (a worker token: only those it names)."""
    scope = queue_scope()
    if scope is None:
        return
    foreign = sorted(set(queues) - set(scope))
    if foreign:
        message = (
            f"a worker token of queues {', '.join(scope)} cannot serve queue"
            f"{'s' if len(foreign) > 1 else ''} {', '.join(foreign)}"
        )
        raise PermissionDenied(f"{field}: {message}", [FieldViolation(field, message)])
