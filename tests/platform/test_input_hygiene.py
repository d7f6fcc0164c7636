"""Hostile input against every RPC of every service, walked from the generated descriptors.

The five services run as real processes on one database. For each method of each service
in ``dispo.libs.api``, Hypothesis builds requests from the method's input descriptor with
hostile values in every field: NUL characters, unpaired surrogates (raw bytes no encoder
would write), control characters and trailing newlines, NaN and infinities, huge and
negative integers, enum numbers nobody declared, out-of-range timestamps, JSON with NaN or
NUL inside, and plain random bytes as the whole request. Whatever a service answers, it is
never INTERNAL or UNKNOWN; a request carrying a NUL, a surrogate or a non-finite number is
refused with INVALID_ARGUMENT; and a refused call leaves the row count of every table of
the service's schema as it was.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from dispo.libs.api.auth.v1 import auth_pb2
from dispo.libs.api.executor.v1 import executor_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.api.intelligence.v1 import intelligence_pb2
from dispo.libs.api.pool.v1 import pool_pb2
from dispo.libs.api.quarantine.v1 import quarantine_pb2
from dispo.libs.api.reconciler.v1 import drift_pb2, reconciler_pb2
from dispo.libs.api.retention.v1 import retention_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.auth import admin_sync_channel

# The services that serve each generated service (each one the schema it writes).
CONSUMING = ("gateway", "executor", "intelligence", "reconciler")  # their own quarantine each
SERVED_BY: dict[str, tuple[str, ...]] = {
    "dispo.gateway.v1.GatewayService": ("gateway",),
    "dispo.executor.v1.ExecutorService": ("executor",),
    "dispo.intelligence.v1.IntelligenceService": ("intelligence",),
    "dispo.pool.v1.PoolService": ("pool",),
    "dispo.reconciler.v1.ReconcilerService": ("reconciler",),
    "dispo.reconciler.v1.DriftService": ("reconciler",),
    "dispo.quarantine.v1.QuarantineService": CONSUMING,
    "dispo.retention.v1.RetentionService": ("gateway", "executor", "reconciler"),
    "dispo.auth.v1.TokenService": ("gateway",),
}
MODULES = (
    auth_pb2,
    gateway_pb2,
    executor_pb2,
    intelligence_pb2,
    pool_pb2,
    reconciler_pb2,
    drift_pb2,
    quarantine_pb2,
    retention_pb2,
)
EXAMPLES_PER_METHOD = 6
# UNAVAILABLE too: PostgreSQL and NATS are up all along, so no input may be answered with it.
BAD_CODES = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.UNAVAILABLE)
READS = ("Get", "List", "Watch")
# U+E000 (private use, 3 bytes in UTF-8) stands in for U+D800 (a lone surrogate, the same
# 3 bytes in the encoding no UTF-8 encoder writes): swapped in after serialising.
SURROGATE_STANDIN = "\ue000"
STANDIN_BYTES, SURROGATE_BYTES = SURROGATE_STANDIN.encode(), b"\xed\xa0\x80"
TIMESTAMP = "google.protobuf.Timestamp"
STRUCT = "google.protobuf.Struct"


def methods() -> list[tuple[str, MethodDescriptor]]:
    found = [
        (server, method)
        for module in MODULES
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
        for server in SERVED_BY[service.full_name]
    ]
    assert {server for server, _ in found} == {s for servers in SERVED_BY.values() for s in servers}
    return found


# --- hostile values, by field type -------------------------------------------------------

HOSTILE_TEXT = st.sampled_from(
    [
        "\x00",
        "a\x00b",
        "t-1\n",
        "ecommerce\n",
        "\r\n",
        "\t",
        " ",
        SURROGATE_STANDIN,
        f"id{SURROGATE_STANDIN}",
        "x" * 5000,
        "$",
        "(a+)+$",
        "NaN",
        '{"a": NaN}',
        "²",
        "ecommerce",
        "t-1",
    ]
)
STRINGS = st.one_of(HOSTILE_TEXT, st.text(max_size=20))
JSON_BYTES = st.one_of(
    st.sampled_from(
        [
            b'{"a": NaN}',
            b'{"a": Infinity}',
            b'{"a": "\\u0000"}',
            b'{"a\\u0000": 1}',
            b'{"a": "\\ud800"}',
            b'{"a": ' + b"9" * 5000 + b"}",
            b"[" * 3000 + b"]" * 3000,
            b"\xff\xfe",
            b"{}",
        ]
    ),
    st.binary(max_size=40),
)
INT32 = st.one_of(
    st.sampled_from([0, 1, -1, 2**31 - 1, -(2**31), 1000, 10_001]),
    st.integers(-(2**31), 2**31 - 1),
)
INT64 = st.one_of(
    st.sampled_from([0, 1, -1, 2**62, 2**63 - 1, -(2**63), 86_400 * 365 * 10_000]),
    st.integers(-(2**63), 2**63 - 1),
)
DOUBLES = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, -1.0, 1e308, 0.5, 2.0]),
    st.floats(allow_nan=True, allow_infinity=True),
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), DOUBLES, STRINGS),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(STRINGS, inner, max_size=3)
    ),
    max_leaves=6,
)


def enum_values(field: FieldDescriptor) -> st.SearchStrategy[int]:
    assert field.enum_type is not None
    declared = sorted(field.enum_type.values_by_number)
    return st.one_of(st.sampled_from(declared), st.sampled_from([-1, max(declared) + 1, 99]))


def scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return STRINGS
    if kind == FieldDescriptor.TYPE_BYTES:
        return JSON_BYTES
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_ENUM:
        return enum_values(field)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return DOUBLES
    if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64):
        return INT64
    if kind == FieldDescriptor.TYPE_INT32:
        return INT32
    raise AssertionError(f"no strategy for {field.full_name} (type {kind})")


@st.composite
def messages(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Message:
    message = GetMessageClass(descriptor)()
    if descriptor.full_name == TIMESTAMP:
        message.seconds = draw(st.one_of(INT64, st.integers(-62_135_596_800, 253_402_300_799)))
        message.nanos = draw(st.one_of(st.integers(0, 999_999_999), INT32))
        return message
    if descriptor.full_name == STRUCT:
        message.update(draw(st.dictionaries(STRINGS, JSON_VALUES, max_size=3)))
        return message
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue  # left unset
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            key, value = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            assert value.type != FieldDescriptor.TYPE_MESSAGE, f"no strategy for {field.full_name}"
            entries = st.dictionaries(scalar(key), scalar(value), max_size=3)
            getattr(message, field.name).update(draw(entries))
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            sub = messages(field.message_type, depth + 1)
            if field.is_repeated:
                getattr(message, field.name).extend(draw(st.lists(sub, max_size=2)))
            else:
                getattr(message, field.name).CopyFrom(draw(sub))
        elif field.is_repeated:
            getattr(message, field.name).extend(draw(st.lists(scalar(field), max_size=3)))
        else:
            setattr(message, field.name, draw(scalar(field)))
    return message


@dataclass
class Request:
    body: bytes
    message: Message | None  # None: random bytes, not built from the descriptor

    def must_be_refused(self) -> bool:
        """Carries what no service may accept: NUL, a surrogate, a non-finite number."""
        return SURROGATE_BYTES in self.body or (
            self.message is not None and _poisoned(self.message)
        )


def _poisoned(message: Message) -> bool:
    for field, value in message.ListFields():
        items = value if field.is_repeated else [value]
        for item in items:
            if isinstance(item, Message) and _poisoned(item):
                return True
            if isinstance(item, str) and "\x00" in item:
                return True
            if isinstance(item, float) and not math.isfinite(item):
                return True
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            if any("\x00" in key for key in value if isinstance(key, str)):
                return True
    return False


def requests(descriptor: Descriptor) -> st.SearchStrategy[Request]:
    built = messages(descriptor).map(
        lambda m: Request(m.SerializeToString().replace(STANDIN_BYTES, SURROGATE_BYTES), m)
    )
    return st.one_of(built, st.binary(max_size=64).map(lambda b: Request(b, None)))


# --- the running services and their tables -----------------------------------------------


class Stack:
    """Calls the services (sync gRPC, from a worker thread) and counts their rows."""

    def __init__(self, addresses: dict[str, str], database_url: str) -> None:
        self.channels = {name: admin_sync_channel(a) for name, a in addresses.items()}
        self.database_url = database_url
        self.loop = asyncio.new_event_loop()
        self.conn: asyncpg.Connection = self.loop.run_until_complete(asyncpg.connect(database_url))
        self.count_queries = {
            schema: self.loop.run_until_complete(self._count_query(schema))
            for schema in {s for servers in SERVED_BY.values() for s in servers}
        }

    async def _count_query(self, schema: str) -> str:
        rows = await self.conn.fetch(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = $1 AND table_type = 'BASE TABLE' ORDER BY table_name",
            schema,
        )
        # limit_shares too: a refused Submit leases no share of its business's rate
        # (ADR-0108), whatever refused it.
        tables = [r["table_name"] for r in rows]
        assert tables, f"no tables in schema {schema}"
        parts = ", ".join(f'(SELECT count(*) FROM "{schema}"."{t}") AS "{t}"' for t in tables)
        return f"SELECT {parts}"

    def counts(self, schema: str) -> dict[str, int]:
        row = self.loop.run_until_complete(self.conn.fetchrow(self.count_queries[schema]))
        return dict(row)

    def all_counts(self) -> dict[str, dict[str, int]]:
        return {schema: self.counts(schema) for schema in self.count_queries}

    def settle(self) -> None:
        """After an accepted command: wait until no table of any service changes any more
        (it may set background work going, which must not land mid-comparison)."""
        before, stable = self.all_counts(), 0
        for _ in range(50):
            time.sleep(0.2)
            now = self.all_counts()
            stable = stable + 1 if now == before else 0
            if stable == 2:
                return
            before = now

    def call(self, service: str, method: MethodDescriptor, body: bytes) -> grpc.StatusCode:
        path = f"/{method.containing_service.full_name}/{method.name}"
        channel = self.channels[service]
        try:
            if method.server_streaming:
                for _ in channel.unary_stream(path)(body, timeout=3):
                    pass
            else:
                channel.unary_unary(path)(body, timeout=30)
        except grpc.RpcError as error:
            code = error.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and method.server_streaming:
                return grpc.StatusCode.OK  # a watch that found something to watch
            return code
        return grpc.StatusCode.OK

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()
        for channel in self.channels.values():
            channel.close()


def property_of(
    stack: Stack, service: str, method: MethodDescriptor, seen: dict[str, set[str]]
) -> Any:
    @settings(
        max_examples=EXAMPLES_PER_METHOD,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(request=requests(method.input_type))
    def hostile(request: Request) -> None:
        before = stack.counts(service)
        code = stack.call(service, method, request.body)
        seen.setdefault(f"{service}:{method.full_name}", set()).add(code.name)
        where = f"{method.full_name} with {request.message or request.body!r}"
        assert code not in BAD_CODES, f"{code.name} from {where}"
        if request.must_be_refused():
            assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{code.name} from {where}"
        if code != grpc.StatusCode.OK:
            assert stack.counts(service) == before, f"{code.name} wrote rows: {where}"
        elif not method.name.startswith(READS):
            stack.settle()

    return hostile


def walk(stack: Stack) -> dict[str, set[str]]:
    """Every method under hostile requests; the codes seen per method."""
    seen: dict[str, set[str]] = {}
    for service, method in methods():
        property_of(stack, service, method, seen)()
    return seen


@pytest.mark.timeout(240)
async def test_no_hostile_request_gets_internal_or_unknown_or_writes(
    start_service, database_url, tmp_path
):
    started = {
        "pool": await start_service(
            "pool", {"DISPO_POOL_LOCAL_REGISTRY": str(tmp_path / "registry.sqlite")}, wait=False
        ),
        "gateway": await start_service("gateway", wait=False),
        "executor": await start_service(
            "executor", {"DISPO_EXECUTOR_HEALTH_INTERVAL_SECONDS": "0"}, wait=False
        ),
        "intelligence": await start_service("intelligence", wait=False),
    }
    started["reconciler"] = await start_service(
        "reconciler",
        {
            "DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0",  # sweeps only through RunSweep
            "DISPO_RECONCILER_DRIFT_INTERVAL_SECONDS": "3600",
            "DISPO_RECONCILER_DRIFT_POOL_ADDRESS": started["pool"].address,
            "DISPO_RECONCILER_GATEWAY_ADDRESS": started["gateway"].address,
        },
        wait=False,
    )
    for process in started.values():
        await process.wait_ready()
    addresses = {name: p.address for name, p in started.items()}

    stack = await asyncio.to_thread(Stack, addresses, database_url)
    try:
        await asyncio.to_thread(stack.settle)  # the pool's first scale sweep, and the like
        seen = await asyncio.to_thread(walk, stack)
    finally:
        await asyncio.to_thread(stack.close)

    # every method of every server was called, and hostile values were refused somewhere in
    # each service
    assert set(seen) == {f"{s}:{m.full_name}" for s, m in methods()}
    for service in {s for servers in SERVED_BY.values() for s in servers}:
        codes = set().union(*(c for key, c in seen.items() if key.startswith(f"{service}:")))
        assert "INVALID_ARGUMENT" in codes, (service, codes)
