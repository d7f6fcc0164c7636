"""Which analysis models an evaluation may name: the intelligence service's, asked over gRPC.

The pool never writes an analysis itself; it hands ``analysis_model`` on to the intelligence
service in ``evaluation.started``. A name that service does not know would be skipped there
(the evaluation completes, no analysis), so CreateEvaluation asks first and refuses it.
"""

from __future__ import annotations

from typing import Protocol

import grpc
from dispo.libs.api.intelligence.v1 import intelligence_pb2 as ipb
from dispo.libs.api.intelligence.v1 import intelligence_pb2_grpc
from dispo.libs.errors import InvalidArgument, Unavailable


class AnalysisModels(Protocol):
    async def names(self) -> list[str]:
        """The registered analysis models' names; ``Unavailable`` when they cannot be read."""
        ...


class IntelligenceModels:
    """The names ``ListAnalysisModels`` answers, asked at each check (evaluations are
    created rarely, and a restarted intelligence service may register other models)."""

    def __init__(self, channel: grpc.aio.Channel, timeout: float = 10.0) -> None:
        self.stub = intelligence_pb2_grpc.IntelligenceServiceStub(channel)
        self.timeout = timeout

    async def names(self) -> list[str]:
        try:
            answer = await self.stub.ListAnalysisModels(
                ipb.ListAnalysisModelsRequest(), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as error:
            raise Unavailable(
                "analysis_model cannot be checked now: the intelligence service answered"
                f" {error.code().name}; try again"
            ) from None
        return [m.name for m in answer.models]


class NoAnalysisModels:
    """A pool without an intelligence service to ask: no model can be named."""

    async def names(self) -> list[str]:
        return []


async def require_registered(name: str, models: AnalysisModels) -> None:
    """``InvalidArgument`` naming ``analysis_model`` when ``name`` is set and not registered
    ("" is the intelligence service's default)."""
    if not name:
        return
    names = await models.names()
    if name not in names:
        registered = ", ".join(names) or "none"
        raise InvalidArgument(
            "analysis_model",
            f"{name!r} is not registered in the intelligence service (registered: {registered})",
        )
