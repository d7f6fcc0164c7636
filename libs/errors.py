"""Domain errors every service raises; the gRPC layer maps each to one status code.

Domain code never imports grpc: it raises these, and
:class:`dispo.libs.grpcserver.ErrorMappingInterceptor` turns them into precise statuses,
with field violations attached as a ``google.rpc.BadRequest`` detail.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class DomainError(Exception):
    """Base of all errors a caller should see with a specific gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    # Seconds after which the same call may succeed (sent as a google.rpc.RetryInfo).
    retry_after: float | None = None

    def __init__(self, message: str, violations: list[FieldViolation] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.violations = violations or []


class InvalidArgument(DomainError):
    """A request field is wrong. ``InvalidArgument("cells[1].name", "unknown cell 'x'")``."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(
        self,
        field: str | None = None,
        description: str = "",
        *,
        violations: list[FieldViolation] | None = None,
    ) -> None:
        found = list(violations or [])
        if field is not None:
            found.insert(0, FieldViolation(field, description))
        message = "; ".join(f"{v.field}: {v.description}" for v in found) or description
        super().__init__(message, found)


class NotFound(DomainError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(DomainError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(DomainError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(DomainError):
    """A race the caller lost (a lease it no longer holds): nothing was written."""

    code = grpc.StatusCode.ABORTED


class ResourceExhausted(DomainError):
    """Size or rate limits. Give the field when one field is too large, ``retry_after``
    (seconds) when a rate limit says when to come back."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(
        self, message: str, field: str | None = None, *, retry_after: float | None = None
    ) -> None:
        super().__init__(message, [FieldViolation(field, message)] if field else None)
        self.retry_after = retry_after


class Unauthenticated(DomainError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(DomainError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unavailable(DomainError):
    """A dependency (database, bus) is down; the caller may retry."""

    code = grpc.StatusCode.UNAVAILABLE


def within(prefix: str, error: DomainError) -> DomainError:
    """``error``, raised about one part of a larger request, naming its fields under
    ``prefix`` (``requests[3]``: ``cells[0].cell`` becomes ``requests[3].cells[0].cell``);
    an error that named no field names ``prefix`` itself."""
    error.violations = [
        FieldViolation(f"{prefix}.{v.field}", v.description) for v in error.violations
    ] or [FieldViolation(prefix, error.message)]
    error.message = f"{prefix}: {error.message}"
    error.args = (error.message,)
    return error


def repeated_differently(subject: str, field: str) -> FailedPrecondition:
    """A create repeated with the id of an existing item but a different request: the
    identical request returns the item (the repeat is a no-op), this one is refused naming
    the first field that differs."""
    return FailedPrecondition(
        f"{subject} already exists with a different {field}; repeat the original request, "
        "or use a new id",
        [FieldViolation(field, "differs from the existing one's")],
    )
