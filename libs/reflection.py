"""Server reflection that carries the protos' comments.

The generated modules of :mod:`dispo.libs.api` hold their descriptors without source info, so
reflection answering from them gives ``grpcurl describe`` bare fields. ``protogen`` also
writes ``libs/api/descriptors.binpb``, the same files with their comments
(``--include_source_info``); the servicer here finds a file as the stock one does (the
process's descriptor pool, which also knows health and reflection) and answers with that
file's documented form wherever the set has one.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable
from functools import cache
from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

DESCRIPTOR_SET = "descriptors.binpb"


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """Every proto of ``protos/`` and what it imports, with their comments."""
    data = resources.files("dispo.libs.api").joinpath(DESCRIPTOR_SET).read_bytes()
    return descriptor_pb2.FileDescriptorSet.FromString(data)


@cache
def documented_files() -> dict[str, bytes]:
    """Serialized documented ``FileDescriptorProto`` by file name (``dispo/…/x.proto``)."""
    return {file.name: file.SerializeToString() for file in descriptor_set().file}


class DocumentedReflection(ReflectionServicer):
    """The stock asyncio reflection servicer, answering with documented files."""

    def __init__(self, service_names: Iterable[str], documented: dict[str, bytes]) -> None:
        super().__init__(tuple(service_names))
        self._documented = documented

    # The stubs declare the stock method a coroutine; under grpc.aio it is an async generator.
    async def ServerReflectionInfo(  # type: ignore[override]
        self,
        request_iterator: AsyncIterable[reflection_pb2.ServerReflectionRequest],
        context: Any,
    ) -> AsyncIterator[reflection_pb2.ServerReflectionResponse]:
        stock: Any = super().ServerReflectionInfo(request_iterator, context)
        async for response in stock:
            if response.HasField("file_descriptor_response"):
                files = response.file_descriptor_response.file_descriptor_proto
                for i, raw in enumerate(files):
                    name = descriptor_pb2.FileDescriptorProto.FromString(raw).name
                    files[i] = self._documented.get(name, raw)
            yield response


def enable_documented_reflection(service_names: Iterable[str], server: grpc.aio.Server) -> None:
    """Serve reflection for ``service_names`` on ``server``, comments included."""
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(  # type: ignore[no-untyped-call]
        DocumentedReflection(service_names, documented_files()), server
    )


__all__ = ["descriptor_set", "documented_files", "enable_documented_reflection"]
