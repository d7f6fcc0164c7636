"""Who may call what, against one stack of the five real service processes for the module.

The matrix: every RPC every service serves (as its reflection lists it) × every kind of
caller. Only the auth outcome is checked, so an empty request is enough (the token is checked
before the request): without a valid token, UNAUTHENTICATED; with a token the RPC's rule does
not admit, PERMISSION_DENIED; with one it admits, anything but those two (an empty request is
often INVALID_ARGUMENT or NOT_FOUND). An RPC served without a rule in dispo.libs.auth.rules is
refused to everyone and fails here.

Then what a business token sees of the work: its own tasks only.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import dispo.libs.api.executor.v1.executor_pb2  # descriptors of every contract
import dispo.libs.api.gateway.v1.catalogue_pb2
import dispo.libs.api.gateway.v1.schedule_pb2
import dispo.libs.api.intelligence.v1.intelligence_pb2
import dispo.libs.api.pool.v1.pool_pb2
import dispo.libs.api.quarantine.v1.quarantine_pb2
import dispo.libs.api.reconciler.v1.drift_pb2
import dispo.libs.api.retention.v1.retention_pb2  # noqa: F401
import grpc
import pytest
from dispo.libs.api.auth.v1 import auth_pb2, auth_pb2_grpc
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from dispo.libs.api.reconciler.v1 import reconciler_pb2, reconciler_pb2_grpc
from dispo.libs.auth import RULES, open_channel
from dispo.libs.auth.tokens import new_secret
from dispo.tools.stack.stack import SERVICES
from google.protobuf import descriptor_pool, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from pipeline_fixtures import EXECUTOR_TEST_ENV, TEST_CATALOGUE
from support import eventually
from support.auth import business_token

AUTH_CODES = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
OPEN = {"grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}
# Nothing listens there: a call to it is refused at once, so a task of `step` cells fails.
DEAD_URL = "http://127.0.0.1:9"


@dataclass(frozen=True)
class Rpc:
    service: str  # the process serving it
    path: str  # /package.Service/Method
    request: bytes
    streaming: bool


def served_rpcs(service: str, address: str) -> list[Rpc]:
    """Every RPC ``address`` serves, from its reflection and the contracts' descriptors."""
    with grpc.insecure_channel(address) as channel:  # reflection needs no token
        names = set(ProtoReflectionDescriptorDatabase(channel).get_services()) - OPEN
    pool = descriptor_pool.Default()
    return [
        Rpc(
            service,
            f"/{name}/{method.name}",
            message_factory.GetMessageClass(method.input_type)().SerializeToString(),
            method.server_streaming,
        )
        for name in sorted(names)
        for method in pool.FindServiceByName(name).methods
    ]


async def outcome(channel: grpc.aio.Channel, rpc: Rpc) -> grpc.StatusCode:
    try:
        if rpc.streaming:
            call = channel.unary_stream(rpc.path)(rpc.request, timeout=10)
            async for _ in call:
                call.cancel()  # the first item answers the question
                break
        else:
            await channel.unary_unary(rpc.path)(rpc.request, timeout=10)
    except grpc.aio.AioRpcError as error:
        return grpc.StatusCode.OK if error.code() is grpc.StatusCode.CANCELLED else error.code()
    return grpc.StatusCode.OK


@pytest.fixture(scope="module")
async def stack(module_services, tmp_path_factory):
    catalogue = tmp_path_factory.mktemp("catalogue") / "catalogue.yaml"
    catalogue.write_text(TEST_CATALOGUE.format(url=DEAD_URL))
    env = {"DISPO_CATALOGUE": str(catalogue)}
    extra = {
        "executor": EXECUTOR_TEST_ENV,
        "reconciler": {"DISPO_RECONCILER_SWEEP_INTERVAL_SECONDS": "0"},
    }
    started = await asyncio.gather(
        *(module_services.start(name, {**env, **extra.get(name, {})}) for name in SERVICES)
    )
    return dict(zip(SERVICES, started, strict=True))


@pytest.fixture(scope="module")
async def admin(stack, tokens):
    async with open_channel(stack["gateway"].address, tokens.admin) as channel:
        yield auth_pb2_grpc.TokenServiceStub(channel)


async def new_token(admin, **fields) -> tuple[str, str]:
    reply = await admin.CreateToken(auth_pb2.CreateTokenRequest(**fields))
    return reply.token.token_id, reply.secret


async def business(admin, name: str) -> str:
    return (await new_token(admin, kind=auth_pb2.TOKEN_KIND_BUSINESS, business=name))[1]


async def test_every_rpc_answers_every_caller_by_its_rule(stack, admin, tokens, module_database):
    own = await business(admin, "matrix-a")
    revoked_id, revoked = await new_token(
        admin, kind=auth_pb2.TOKEN_KIND_BUSINESS, business="matrix-a"
    )
    await admin.RevokeToken(auth_pb2.RevokeTokenRequest(token_id=revoked_id))
    _, expired = await business_token(
        module_database, "matrix-a", expires_at=datetime.now(UTC) - timedelta(seconds=1)
    )
    callers = {
        "anonymous": "",
        "unknown": new_secret(),
        "revoked": revoked,
        "expired": expired,
        "own business": own,
        "other business": await business(admin, "matrix-b"),
        "admin": tokens.admin,
        "reconciler": tokens.services["reconciler"],
        "pool-worker": tokens.services["pool-worker"],
        "worker": (await new_token(admin, kind=auth_pb2.TOKEN_KIND_WORKER, queues=["matrix"]))[1],
    }
    rpcs = [rpc for name, p in stack.items() for rpc in served_rpcs(name, p.address)]
    assert {"/dispo.auth.v1.TokenService/RevokeToken", "/dispo.pool.v1.PoolService/RecordRun"} <= {
        rpc.path for rpc in rpcs
    }
    channels = {
        (name, caller): open_channel(p.address, token)
        for name, p in stack.items()
        for caller, token in callers.items()
    }
    wrong = []
    try:
        for rpc in rpcs:
            rule = RULES.get(rpc.path)
            if rule is None:
                wrong.append(f"{rpc.path}: no rule in dispo.libs.auth.rules")
            for caller in callers:
                code = await outcome(channels[(rpc.service, caller)], rpc)
                if caller in ("anonymous", "unknown", "revoked", "expired"):
                    want = {grpc.StatusCode.UNAUTHENTICATED}
                elif rule is not None and (
                    caller == "admin"
                    or (caller.endswith("business") and rule.business)
                    or (caller == "worker" and rule.worker)
                    or caller in rule.services
                ):
                    want = set(grpc.StatusCode) - AUTH_CODES
                else:
                    want = {grpc.StatusCode.PERMISSION_DENIED}
                if code not in want:
                    wanted = " or ".join(c.name for c in want) if len(want) == 1 else "no auth code"
                    wrong.append(f"{rpc.path} as {caller}: {code.name}, wanted {wanted}")
    finally:
        await asyncio.gather(*(channel.close() for channel in channels.values()))
    assert not wrong, "\n".join(wrong)


def code_of(error: pytest.ExceptionInfo) -> grpc.StatusCode:
    return error.value.code()


async def test_a_business_token_sees_and_touches_only_its_own_tasks(stack, admin, tokens):
    gateway, reconciler = stack["gateway"].address, stack["reconciler"].address
    own_token, other_token = await business(admin, "scope-a"), await business(admin, "scope-b")
    async with (
        open_channel(gateway, own_token) as own_channel,
        open_channel(gateway, other_token) as other_channel,
        open_channel(reconciler, own_token) as own_rc,
        open_channel(reconciler, other_token) as other_rc,
    ):
        own = gateway_pb2_grpc.GatewayServiceStub(own_channel)
        other = gateway_pb2_grpc.GatewayServiceStub(other_channel)
        own_recovery = reconciler_pb2_grpc.ReconcilerServiceStub(own_rc)
        other_recovery = reconciler_pb2_grpc.ReconcilerServiceStub(other_rc)

        def cells(cell: str) -> list[gateway_pb2.CellRequest]:
            return [gateway_pb2.CellRequest(cell=cell, payload_json=b'{"name": "x"}')]

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await other.Submit(gateway_pb2.SubmitRequest(business="scope-a", cells=cells("step")))
        assert code_of(refused) is grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details().startswith("business: ")
        failing = await own.Submit(
            gateway_pb2.SubmitRequest(business="scope-a", cells=cells("step"))
        )
        task_id = failing.task_id

        # Another business's task is not there, exactly like a task that does not exist.
        missing = "0" * 32
        requests = {
            other.GetTask: gateway_pb2.GetTaskRequest,
            other.CancelTask: gateway_pb2.CancelTaskRequest,
            other.EraseTask: gateway_pb2.EraseTaskRequest,
        }
        for call, request in requests.items():
            for asked in (task_id, missing):
                with pytest.raises(grpc.aio.AioRpcError) as hidden:
                    await call(request(task_id=asked))
                assert code_of(hidden) is grpc.StatusCode.NOT_FOUND
                assert hidden.value.details() == f"no task {asked!r}"
        with pytest.raises(grpc.aio.AioRpcError) as hidden:
            async for _ in other.WatchTask(gateway_pb2.WatchTaskRequest(task_id=task_id)):
                pass
        assert code_of(hidden) is grpc.StatusCode.NOT_FOUND
        listed = await other.ListTasks(gateway_pb2.ListTasksRequest())
        assert task_id not in {t.task_id for t in listed.tasks}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await other.ListTasks(gateway_pb2.ListTasksRequest(business="scope-a"))
        assert code_of(refused) is grpc.StatusCode.PERMISSION_DENIED
        assert (
            await own.GetTask(gateway_pb2.GetTaskRequest(task_id=task_id))
        ).task.business == "scope-a"
        mine = await own.ListTasks(gateway_pb2.ListTasksRequest())
        assert task_id in {t.task_id for t in mine.tasks}
        assert {t.business for t in mine.tasks} == {"scope-a"}

        # Its failed work on the reconciler: its own to read and resume, hidden from others.
        request = reconciler_pb2.GetRecoveryTaskRequest(task_id=task_id)
        held = await eventually(
            lambda: _held(own_recovery, request),
            lambda found: found is not None,
            timeout=60,
            wanted="the failed task held by the reconciler",
        )
        assert held.task.business == "scope-a"
        for call, asked in (
            (other_recovery.GetRecoveryTask, request),
            (other_recovery.RedriveTask, reconciler_pb2.RedriveTaskRequest(task_id=task_id)),
            (other_recovery.GetCompletion, reconciler_pb2.GetCompletionRequest(task_id=task_id)),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as hidden:
                await call(asked)
            assert code_of(hidden) is grpc.StatusCode.NOT_FOUND, call
        theirs = await other_recovery.ListFailedWork(reconciler_pb2.ListFailedWorkRequest())
        assert task_id not in {w.task.task_id for w in theirs.work}
        ours = await own_recovery.ListFailedWork(reconciler_pb2.ListFailedWorkRequest())
        assert task_id in {w.task.task_id for w in ours.work}
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await other_recovery.ListRecoveryTasks(
                reconciler_pb2.ListRecoveryTasksRequest(
                    filter=reconciler_pb2.RecoveryFilter(business="scope-a")
                )
            )
        assert code_of(refused) is grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await own_recovery.RedriveByFilter(reconciler_pb2.RedriveByFilterRequest())
        assert code_of(refused) is grpc.StatusCode.PERMISSION_DENIED


async def test_a_business_tokens_bulk_cancel_takes_only_its_own_tasks(stack, admin):
    """CancelByFilter with a business token (ADR-0112): naming another business is
    PERMISSION_DENIED; with none it takes its own tasks alone, and the record, its token's
    id, is its own to read."""
    gateway = stack["gateway"].address
    own_id, own_token = await new_token(admin, kind=auth_pb2.TOKEN_KIND_BUSINESS, business="bulk-a")
    other_token = await business(admin, "bulk-b")
    later = datetime.now(UTC) + timedelta(days=1)
    async with (
        open_channel(gateway, own_token) as own_channel,
        open_channel(gateway, other_token) as other_channel,
    ):
        own = gateway_pb2_grpc.GatewayServiceStub(own_channel)
        other = gateway_pb2_grpc.GatewayServiceStub(other_channel)

        async def delayed(stub, business: str) -> str:
            request = gateway_pb2.SubmitRequest(
                business=business, cells=[gateway_pb2.CellRequest(cell="noop")]
            )
            request.not_before.FromDatetime(later)
            return (await stub.Submit(request)).task_id

        mine = [await delayed(own, "bulk-a") for _ in range(3)]
        theirs = await delayed(other, "bulk-b")

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await own.CancelByFilter(
                gateway_pb2.CancelByFilterRequest(
                    filter=gateway_pb2.CountTasksRequest(business="bulk-b"), dry_run=True
                )
            )
        assert code_of(refused) is grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details().startswith("filter.business: ")
        dry = await own.CancelByFilter(gateway_pb2.CancelByFilterRequest(dry_run=True))
        assert (dry.matched, dry.HasField("action")) == (3, False)

        asked = await own.CancelByFilter(
            gateway_pb2.CancelByFilterRequest(rate_per_second=100, reason="clean up")
        )
        assert (asked.matched, asked.action.actor) == (3, own_id)
        assert asked.action.request.filter.business == "bulk-a"
        done = await eventually(
            lambda: own.GetBulkAction(
                gateway_pb2.GetBulkActionRequest(action_id=asked.action.action_id)
            ),
            lambda got: got.action.state == gateway_pb2.BULK_ACTION_STATE_DONE,
            timeout=30,
            wanted="the bulk cancel done",
        )
        assert (done.action.acted, done.action.reason) == (3, "clean up")
        for task_id in mine:
            got = await own.GetTask(gateway_pb2.GetTaskRequest(task_id=task_id))
            assert got.task.status == common_pb2.TASK_STATUS_CANCELLED
        still = await other.GetTask(gateway_pb2.GetTaskRequest(task_id=theirs))
        assert still.task.status == common_pb2.TASK_STATUS_ACCEPTED

        with pytest.raises(grpc.aio.AioRpcError) as hidden:
            await other.GetBulkAction(
                gateway_pb2.GetBulkActionRequest(action_id=asked.action.action_id)
            )
        assert code_of(hidden) is grpc.StatusCode.NOT_FOUND
        listed = await other.ListBulkActions(gateway_pb2.ListBulkActionsRequest())
        assert asked.action.action_id not in {a.action_id for a in listed.actions}
        listed = await own.ListBulkActions(gateway_pb2.ListBulkActionsRequest())
        assert asked.action.action_id in {a.action_id for a in listed.actions}


async def _held(stub, request):
    try:
        return await stub.GetRecoveryTask(request)
    except grpc.aio.AioRpcError as error:
        if error.code() is grpc.StatusCode.NOT_FOUND:
            return None
        raise


async def test_a_revoked_token_is_refused_from_the_revoke_on(stack, admin):
    token_id, secret = await new_token(admin, kind=auth_pb2.TOKEN_KIND_BUSINESS, business="gone")
    async with open_channel(stack["gateway"].address, secret) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        await stub.ListCells(gateway_pb2.ListCellsRequest())  # valid, and now in the cache
        revoked = await admin.RevokeToken(auth_pb2.RevokeTokenRequest(token_id=token_id))
        assert revoked.token.HasField("revoked_at")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListCells(gateway_pb2.ListCellsRequest())
    assert code_of(refused) is grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == "the token has been revoked"
    listed = await admin.ListTokens(auth_pb2.ListTokensRequest(business="gone"))
    assert token_id not in {t.token_id for t in listed.tokens}
    listed = await admin.ListTokens(
        auth_pb2.ListTokensRequest(business="gone", include_revoked=True)
    )
    [shown] = [t for t in listed.tokens if t.token_id == token_id]
    assert shown.business == "gone" and not hasattr(shown, "secret")
