"""The protos explain themselves: every public element of protos/ carries a comment, and
server reflection serves those comments, so ``grpcurl describe`` shows what a field means."""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from dispo.libs import api
from dispo.libs.api.gateway.v1 import gateway_pb2
from dispo.libs.auth import Authorizer
from dispo.libs.grpcserver import create_server
from dispo.libs.reflection import descriptor_set
from google.protobuf import descriptor_pb2, descriptor_pool

GRPCURL = str(Path(sys.executable).parent / "grpcurl")
# FileDescriptorProto / DescriptorProto / EnumDescriptorProto / ServiceDescriptorProto field
# numbers: the paths of SourceCodeInfo.Location.
MESSAGE, ENUM, SERVICE = 4, 5, 6
FIELD, NESTED, NESTED_ENUM = 2, 3, 4
VALUE, METHOD = 2, 2


def uncommented(file: descriptor_pb2.FileDescriptorProto) -> Iterator[str]:
    """Every service, RPC, message, field, enum and enum value of ``file`` without a leading
    or trailing comment, by full name."""
    comments = {
        tuple(loc.path)
        for loc in file.source_code_info.location
        if loc.leading_comments.strip() or loc.trailing_comments.strip()
    }

    def enum(path: tuple[int, ...], e: descriptor_pb2.EnumDescriptorProto, scope: str):
        name = f"{scope}.{e.name}"
        if path not in comments:
            yield f"enum {name}"
        for i, value in enumerate(e.value):
            if (*path, VALUE, i) not in comments:
                yield f"enum value {name}.{value.name}"

    def message(path: tuple[int, ...], m: descriptor_pb2.DescriptorProto, scope: str):
        name = f"{scope}.{m.name}"
        if m.options.map_entry:  # a map<k, v>'s entry is protoc's, not ours
            return
        if path not in comments:
            yield f"message {name}"
        for i, field in enumerate(m.field):
            if (*path, FIELD, i) not in comments:
                yield f"field {name}.{field.name}"
        for i, nested in enumerate(m.nested_type):
            yield from message((*path, NESTED, i), nested, name)
        for i, nested_enum in enumerate(m.enum_type):
            yield from enum((*path, NESTED_ENUM, i), nested_enum, name)

    for i, service in enumerate(file.service):
        name = f"{file.package}.{service.name}"
        if (SERVICE, i) not in comments:
            yield f"service {name}"
        for j, method in enumerate(service.method):
            if (SERVICE, i, METHOD, j) not in comments:
                yield f"rpc {name}.{method.name}"
    for i, m in enumerate(file.message_type):
        yield from message((MESSAGE, i), m, file.package)
    for i, e in enumerate(file.enum_type):
        yield from enum((ENUM, i), e, file.package)


def dispo_files() -> list[descriptor_pb2.FileDescriptorProto]:
    files = [f for f in descriptor_set().file if f.name.startswith("dispo/")]
    # protos/ holds Dispo's own under dispo/, and google/rpc/status.proto as published
    ours = (Path(__file__).parents[2] / "protos" / "dispo").rglob("*.proto")
    assert len(files) == len(list(ours))
    return files


def test_every_public_element_of_the_protos_has_a_comment():
    missing = [name for file in dispo_files() for name in uncommented(file)]
    assert not missing, "without a comment in protos/:\n  " + "\n  ".join(missing)


def test_an_element_without_a_comment_is_found():
    [gateway] = [f for f in dispo_files() if f.name == "dispo/gateway/v1/gateway.proto"]
    bare = descriptor_pb2.FileDescriptorProto()
    bare.CopyFrom(gateway)
    # drop the comments of Submit and SubmitRequest.business
    kept = [
        loc
        for loc in bare.source_code_info.location
        if tuple(loc.path) not in {(SERVICE, 0, METHOD, 0), (MESSAGE, 1, FIELD, 0)}
    ]
    del bare.source_code_info.location[:]
    bare.source_code_info.location.extend(kept)
    found = set(uncommented(bare)) - set(uncommented(gateway))
    assert found == {
        "rpc dispo.gateway.v1.GatewayService.Submit",
        "field dispo.gateway.v1.SubmitRequest.business",
    }


def test_the_documented_set_is_the_generated_code_with_comments():
    for module in pkgutil.walk_packages(api.__path__, "dispo.libs.api."):
        importlib.import_module(module.name)
    for file in dispo_files():
        generated = descriptor_pb2.FileDescriptorProto()
        descriptor_pool.Default().FindFileByName(file.name).CopyToProto(generated)
        file.ClearField("source_code_info")
        # no json_name either: with one, grpcurl prints camelCase names (taskId) where every
        # walk-through reads the proto's own (task_id)
        assert file == generated, file.name


async def test_grpcurl_describe_shows_the_comment_of_a_field():
    server = create_server(
        "127.0.0.1:0",
        [],
        [gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name],
        Authorizer.refusing(),
    )
    await server.start()
    try:
        described = await asyncio.to_thread(
            subprocess.run,
            [
                GRPCURL,
                "-plaintext",
                f"127.0.0.1:{server.port}",
                "describe",
                "dispo.gateway.v1.SubmitRequest",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        await server.stop(0)
    assert described.returncode == 0, described.stderr
    out = described.stdout
    # the field's own comment, right above it, as grpcurl prints source info
    assert "// Calling business line" in out, out
    assert out.index("// Calling business line") < out.index("string business = 1;")
