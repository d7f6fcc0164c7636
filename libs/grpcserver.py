"""gRPC server bootstrap shared by every service.

``create_server`` returns a started-but-not-serving-yet ``grpc.aio`` server with:
the standard health service, server reflection serving the protos with their comments
(:mod:`dispo.libs.reflection`: ``grpcurl`` needs no proto files and ``describe`` explains),
an interceptor that admits every call by its token (:class:`dispo.libs.auth.Authorizer`:
UNAUTHENTICATED, PERMISSION_DENIED; health and reflection stay open), then checks every
request (:func:`dispo.libs.validation.check_request`; undecodable bytes included) before
the servicer sees it, opens the call's server span (:func:`dispo.libs.tracing.server_span`,
continuing the caller's ``traceparent``), logs each call and maps
:mod:`dispo.libs.errors` to status codes, and an unreachable database
(:func:`dispo.libs.db.database_unreachable`) to ``UNAVAILABLE``. Given a :class:`dispo.libs.tls.ServerTLS` it listens for TLS only (mTLS
when that asks for client certificates): a plaintext caller is refused at the handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from dispo.libs.auth.scope import set_caller
from dispo.libs.auth.server import Authorizer
from dispo.libs.db.down import database_unreachable, interrupted
from dispo.libs.errors import DomainError, FieldViolation, InvalidArgument, Unavailable
from dispo.libs.logging import bind_ids, get_logger
from dispo.libs.reflection import enable_documented_reflection
from dispo.libs.tls import ServerTLS
from dispo.libs.tracing import server_span
from dispo.libs.validation import check_request
from google.protobuf import any_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status

log = get_logger(__name__)

# Above the largest request the field limits admit (50 cells of 64 KiB, a pool evaluation's
# 200 cases of 16 KiB), so that a field too large is refused by its own check, naming it;
# the gateway keeps a task's envelope under it too (docs/security.md, Limits).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


# What a status echoes, in UTF-8 bytes: an error's message, and its field violations up to
# a budget, each field and description cut to its own limit. An error names what it is
# about (an id, a field, a map key) as the caller sent it; echoed whole, a 7,000-character id
# would overflow the status's metadata (grpc-message, grpc-status-details-bin: 8 KiB by
# default at the caller) and the caller would see RESOURCE_EXHAUSTED instead of the answer.
ECHO_LIMIT_BYTES = 512
VIOLATIONS_ECHO_BYTES = 1536
VIOLATION_FIELD_BYTES = 128
VIOLATION_DESCRIPTION_BYTES = 256
MAX_VIOLATIONS_ECHOED = 32
ELLIPSIS = "…"


def echoed(text: str, limit: int = ECHO_LIMIT_BYTES) -> str:
    """``text`` as a status echoes it: unchanged within ``limit`` UTF-8 bytes, else its
    longest prefix that fits with :data:`ELLIPSIS` after it (never a character cut in two)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    room = limit - len(ELLIPSIS.encode())
    return data[:room].decode("utf-8", "ignore") + ELLIPSIS


def rich_status(error: DomainError) -> grpc.Status:
    """The status a caller sees for ``error``: code, message, field violations and when to
    retry (``google.rpc.RetryInfo``)."""
    return rpc_status.to_status(status_of(error))


def status_of(error: DomainError) -> status_pb2.Status:
    """``error`` as a ``google.rpc.Status``: what :func:`rich_status` sends as a call's
    status, and what an answer carries for one item refused on its own (SubmitEach). What it
    echoes is capped here, for every error of every service: the message at
    :data:`ECHO_LIMIT_BYTES`, the field violations at :data:`MAX_VIOLATIONS_ECHOED` and
    :data:`VIOLATIONS_ECHO_BYTES` (the first ones, each cut to its limits)."""
    detail = status_pb2.Status(code=error.code.value[0], message=echoed(error.message))
    if error.violations:
        bad_request = error_details_pb2.BadRequest(field_violations=_echoed(error.violations))
        packed = any_pb2.Any()
        packed.Pack(bad_request)
        detail.details.append(packed)
    if error.retry_after is not None:
        retry = error_details_pb2.RetryInfo()
        retry.retry_delay.FromNanoseconds(max(1, round(error.retry_after * 1e9)))
        detail.details.add().Pack(retry)
    return detail


def _echoed(
    violations: list[FieldViolation],
) -> list[error_details_pb2.BadRequest.FieldViolation]:
    """The first ``violations`` that fit the budget, each cut to its limits (the first is
    always sent)."""
    sent: list[error_details_pb2.BadRequest.FieldViolation] = []
    spent = 0
    for v in violations[:MAX_VIOLATIONS_ECHOED]:
        field = echoed(v.field, VIOLATION_FIELD_BYTES)
        description = echoed(v.description, VIOLATION_DESCRIPTION_BYTES)
        spent += len(field.encode("utf-8", "replace")) + len(description.encode("utf-8", "replace"))
        if sent and spent > VIOLATIONS_ECHO_BYTES:
            break
        sent.append(
            error_details_pb2.BadRequest.FieldViolation(field=field, description=description)
        )
    return sent


def unreachable_database() -> Unavailable:
    """What a caller sees when PostgreSQL could not be reached during its call. The call may
    have failed before, during or after its commit, so the error says nothing about what was
    written: the caller retries, and a retry under the same idempotency key is safe."""
    return Unavailable(
        "the database could not be reached; whether this request took effect is not known:"
        " retry it (with the same idempotency key where it has one)"
    )


def interrupted_call() -> Unavailable:
    """What a caller sees when its call was interrupted inside the service (a connection
    closed under it): as for :func:`unreachable_database`, nothing is known of what was
    written, and a retry is safe."""
    return Unavailable(
        "the call was interrupted inside the service (a connection closed under it); whether"
        " this request took effect is not known: retry it (with the same idempotency key"
        " where it has one)"
    )


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Admits every call (``authorizer``), checks every request, logs every call and turns
    domain errors into statuses, a database that is down into UNAVAILABLE
    (:func:`unreachable_database`); anything else is INTERNAL."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer
        # Each method's handler as registered, and its wrapping: built once per method,
        # not once per call.
        self._wrapped: dict[
            str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]
        ] = {}

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(("/grpc.health", "/grpc.reflection")):
            return handler
        known = self._wrapped.get(details.method)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = _wrap(handler, details.method, self.authorizer)
        self._wrapped[details.method] = (handler, wrapped)
        return wrapped


@contextlib.asynccontextmanager
async def _mapped_errors(
    context: grpc.aio.ServicerContext[Any, Any], method: str
) -> AsyncIterator[None]:
    """Around one call: log it, abort with the domain error's status, or INTERNAL."""
    started = time.perf_counter()
    try:
        yield
    except DomainError as error:
        await _abort(context, method, error, started)
    except grpc.aio.BaseError:  # already an abort (or a status) from the servicer
        raise
    except asyncio.CancelledError:
        if not interrupted():
            raise  # the call itself was cancelled (the caller went, its deadline passed)
        log.warning("rpc interrupted", method=method)
        await _abort(context, method, interrupted_call(), started)
    except Exception as error:
        if database_unreachable(error):
            log.warning("database unreachable", method=method, error=type(error).__name__)
            await _abort(context, method, unreachable_database(), started)
        log.exception("rpc failed", method=method)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see the service log")
    else:
        log.debug(
            "rpc", method=method, code="OK", ms=round((time.perf_counter() - started) * 1000, 2)
        )


async def _abort(
    context: grpc.aio.ServicerContext[Any, Any], method: str, error: DomainError, started: float
) -> None:
    log.info(
        "rpc",
        method=method,
        code=error.code.name,
        error=echoed(error.message),
        ms=round((time.perf_counter() - started) * 1000, 2),
    )
    await context.abort_with_status(rich_status(error))


# Request fields bound to every log line of the call.
LOGGED_FIELDS = ("task_id", "node_id", "business")


@dataclass(frozen=True)
class _Undecodable:
    """What the request deserializer hands on for bytes that are not the request message:
    the call is then refused with INVALID_ARGUMENT rather than failing inside gRPC."""

    error: Exception


def _tolerant(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as error:  # any failure to parse is the request's fault
            return _Undecodable(error)

    return parse


def _checked(request: Any) -> None:
    """Refuse an undecodable or unhygienic request (:mod:`dispo.libs.validation`); bind the
    ids it names to the call's log lines."""
    if isinstance(request, _Undecodable):
        raise InvalidArgument(
            description=f"the request is not a valid message of this method: {request.error}"
        )
    if isinstance(request, Message):
        check_request(request)
        names = _logged_names(request)
        if names:
            bind_ids(**{name: getattr(request, name) for name in names})


def _logged_names(request: Message) -> tuple[str, ...]:
    """The :data:`LOGGED_FIELDS` a request's message type has as string fields of its own,
    found once per type (every call of a method asks again)."""
    kind = type(request)
    names = _LOGGED_NAMES.get(kind)
    if names is None:
        fields = request.DESCRIPTOR.fields_by_name
        names = _LOGGED_NAMES[kind] = tuple(
            name
            for name in LOGGED_FIELDS
            if name in fields
            and fields[name].type == FieldDescriptor.TYPE_STRING
            and not fields[name].is_repeated
        )
    return names


_LOGGED_NAMES: dict[type[Message], tuple[str, ...]] = {}


def _wrap(
    handler: grpc.RpcMethodHandler[Any, Any], method: str, authorizer: Authorizer
) -> grpc.RpcMethodHandler[Any, Any]:
    # Under grpc.aio a handler's behaviours are coroutine functions and async generators;
    # the stubs describe the sync server's, so the behaviours are handled as Any here.
    behaviours: Any = handler
    factory: Callable[..., grpc.RpcMethodHandler[Any, Any]]
    # Only a single request can be refused before the call starts; none of Dispo's RPCs
    # streams its requests.
    deserializer = (
        _tolerant(handler.request_deserializer)
        if handler.unary_unary or handler.unary_stream
        else handler.request_deserializer
    )
    if handler.unary_unary or handler.stream_unary:
        inner = behaviours.unary_unary or behaviours.stream_unary
        unary_request = bool(handler.unary_unary)

        async def single(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            metadata = context.invocation_metadata()
            with server_span(method, metadata):
                async with _mapped_errors(context, method):
                    set_caller(await authorizer.admit(method, metadata, context.peer()))
                    if unary_request:
                        _checked(request)
                    return await inner(request, context)

        factory = (
            grpc.unary_unary_rpc_method_handler
            if handler.unary_unary
            else grpc.stream_unary_rpc_method_handler
        )
        return factory(single, deserializer, handler.response_serializer)

    inner_stream = behaviours.unary_stream or behaviours.stream_stream
    unary_request = bool(handler.unary_stream)

    async def streaming(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        metadata = context.invocation_metadata()
        with server_span(method, metadata):
            async with _mapped_errors(context, method):
                set_caller(await authorizer.admit(method, metadata, context.peer()))
                if unary_request:
                    _checked(request)
                async for item in inner_stream(request, context):
                    yield item

    factory = (
        grpc.unary_stream_rpc_method_handler
        if handler.unary_stream
        else grpc.stream_stream_rpc_method_handler
    )
    return factory(streaming, deserializer, handler.response_serializer)


@dataclass
class Server:
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]

    async def start(self) -> None:
        await self.server.start()

    async def set_serving(self, serving: bool = True) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        """Report NOT_SERVING, refuse new calls, let in-flight calls finish for ``grace`` seconds."""
        await self.set_serving(False)
        await self.server.stop(grace)


def create_server(
    address: str,
    register: Iterable[Callable[[grpc.aio.Server], None]],
    service_names: Iterable[str],
    authorizer: Authorizer,
    tls: ServerTLS | None = None,
) -> Server:
    """Build a server listening on ``address`` ("host:0" picks a free port).

    ``register`` are callables such as ``lambda s: add_XServicer_to_server(impl, s)``;
    ``service_names`` are the full names they serve (``dispo.gateway.v1.GatewayService``),
    listed by reflection and reported by health. ``authorizer`` admits each call
    (:mod:`dispo.libs.auth`): every server checks its callers' tokens. ``tls``: listen for
    TLS only (health and reflection too), else plaintext.
    """
    server = grpc.aio.server(
        interceptors=[ErrorMappingInterceptor(authorizer)],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ],
    )
    for add in register:
        add(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = tuple(service_names)
    enable_documented_reflection(
        (
            *names,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    port = (
        server.add_secure_port(address, tls.credentials())
        if tls is not None
        else server.add_insecure_port(address)
    )
    if port == 0:
        raise OSError(f"cannot listen on {address}")
    return Server(server, port, health_servicer, names)


__all__ = ["ECHO_LIMIT_BYTES", "Server", "create_server", "echoed", "rich_status", "status_of"]
