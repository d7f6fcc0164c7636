"""Analysis models: the built-in deterministic ``stats`` model and OpenAI-compatible
chat-completions models configured by settings. An evaluation names one (its override) or
gets the service default; ``ModelRegistry.resolve`` is the only place that decides.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
from dispo.libs.backoff import retry_after_seconds
from pydantic import BaseModel

STATS_MODEL = "stats"


class ModelError(Exception):
    """The model could not produce a narrative (HTTP error, bad response).

    ``transient``: another attempt may succeed (a 408, 429 or 5xx answer, a connection
    refused or reset, a timeout); the job retries it (``dispo.intelligence.retries``).
    ``retry_after``: the wait the model asked for, in seconds.
    """

    def __init__(
        self, message: str, *, transient: bool = False, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


# Answers that say "not now" rather than "never": the request may be sent again as it is
# (a narrative has no effect to duplicate). Every other non-200 answer is definite.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# Failures before an answer: not connected, reset or closed before the response, timed out.
TRANSIENT_TRANSPORT_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def response_error(message: str, status: int, retry_after: str | None, now: datetime) -> ModelError:
    """The error of a non-200 answer: transient (with the wait the model asked for) or definite."""
    if status in TRANSIENT_STATUSES:
        return ModelError(
            message, transient=True, retry_after=retry_after_seconds(retry_after, now)
        )
    return ModelError(message)


def transport_error(message: str, error: httpx.HTTPError) -> ModelError:
    return ModelError(message, transient=isinstance(error, TRANSIENT_TRANSPORT_ERRORS))


class AnalysisModel(Protocol):
    name: str
    kind: str

    async def narrate_analysis(self, evaluation: dict[str, Any], stats: dict[str, Any]) -> str: ...

    async def narrate_comparison(self, comparison: dict[str, Any]) -> str: ...

    async def aclose(self) -> None: ...


def _pct(value: float) -> str:
    return f"{value * 100:.1f}%"


class StatsModel:
    """Deterministic narratives written from the numbers alone; needs no network."""

    name = STATS_MODEL
    kind = "builtin"

    async def narrate_analysis(self, evaluation: dict[str, Any], stats: dict[str, Any]) -> str:
        lines = [
            f"Evaluation {evaluation['evaluation_id']} ({evaluation['series']} {evaluation['period']}, {evaluation['line']}): "
            f"{stats['run_count']} runs over {stats['case_count']} cases; pass rate {_pct(stats['pass_rate'])}, "
            f"fail {_pct(stats['fail_rate'])}, error {_pct(stats['error_rate'])}.",
            f"Score mean {stats['score']['mean']:.3f} (p50 {stats['score']['p50']:.3f}, "
            f"min {stats['score']['min']:.3f}); latency p50 {stats['latency']['p50_ms']} ms, "
            f"p95 {stats['latency']['p95_ms']} ms, p99 {stats['latency']['p99_ms']} ms.",
        ]
        if stats["failure_clusters"]:
            top = stats["failure_clusters"][0]
            lines.append(
                f"Most common failure ({top['count']} runs, {_pct(top['share'])} of failures): "
                f"{top['signature']}."
            )
        if stats["worst_cases"]:
            worst = ", ".join(
                f"{c['case_id']} ({_pct(c['pass_rate'])} pass)" for c in stats["worst_cases"]
            )
            lines.append(f"Worst cases: {worst}.")
        return "\n".join(lines)

    async def narrate_comparison(self, comparison: dict[str, Any]) -> str:
        deltas = comparison["deltas"]
        improved = [d["metric"] for d in deltas if d["direction"] == "improved"]
        regressed = [d["metric"] for d in deltas if d["direction"] == "regressed"]
        lines = [
            f"Period {comparison['period']} against baseline {comparison['baseline_period']} "
            f"(evaluation {comparison['baseline_evaluation_id']}, same configuration "
            f"{comparison['fingerprint']}): {len(improved)} metrics improved, "
            f"{len(regressed)} regressed, {len(deltas) - len(improved) - len(regressed)} unchanged."
        ]
        for delta in deltas:
            if delta["direction"] != "unchanged":
                lines.append(
                    f"- {delta['metric']}: {delta['baseline']:g} -> {delta['current']:g} "
                    f"({delta['absolute_delta']:+g}, {delta['direction']})"
                )
        return "\n".join(lines)

    async def aclose(self) -> None:
        return None


class ChatModelConfig(BaseModel):
    """One OpenAI-compatible model: ``POST {base_url}/chat/completions``."""

    name: str
    base_url: str
    model: str
    api_key: str = ""
    timeout_seconds: float = 60.0
    temperature: float = 0.0


ANALYSIS_PROMPT = (
    "You analyse evaluations. Given an evaluation and the statistics of its runs, "
    "write a short, factual analysis: overall quality, the main failure modes, the worst "
    "cases, and latency. Use only the numbers given."
)
COMPARISON_PROMPT = (
    "You compare two periods of an evaluation series run with the same configuration. "
    "Given the metric differences, write a short, factual summary of what improved, "
    "what regressed, and what to look at. Use only the numbers given."
)


class ChatCompletionsModel:
    kind = "chat-completions"

    def __init__(self, config: ChatModelConfig, client: httpx.AsyncClient | None = None) -> None:
        self.name = config.name
        self.config = config
        self._client = client or httpx.AsyncClient(timeout=config.timeout_seconds)

    async def _complete(self, system: str, payload: dict[str, Any]) -> str:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        body = {
            "model": self.config.model,
            "temperature": self.config.temperature,
            "messages": [
                {"role": "system", "content": system},
                {
                    "role": "user",
                    "content": json.dumps(payload, sort_keys=True, ensure_ascii=False),
                },
            ],
        }
        url = self.config.base_url.rstrip("/") + "/chat/completions"
        try:
            response = await self._client.post(url, json=body, headers=headers)
        except httpx.HTTPError as error:
            raise transport_error(
                f"model {self.name}: request to {url} failed: {error!r}", error
            ) from error
        if response.status_code != 200:
            raise response_error(
                f"model {self.name}: HTTP {response.status_code} from {url}: {response.text}",
                response.status_code,
                response.headers.get("Retry-After"),
                datetime.now(UTC),
            )
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as error:
            raise ModelError(
                f"model {self.name}: unexpected response shape: {response.text}"
            ) from error
        if not isinstance(content, str) or not content.strip():
            raise ModelError(f"model {self.name}: empty completion")
        return content.strip()

    async def narrate_analysis(self, evaluation: dict[str, Any], stats: dict[str, Any]) -> str:
        return await self._complete(ANALYSIS_PROMPT, {"evaluation": evaluation, "stats": stats})

    async def narrate_comparison(self, comparison: dict[str, Any]) -> str:
        return await self._complete(COMPARISON_PROMPT, comparison)

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass(frozen=True)
class Resolution:
    """Outcome of resolving an evaluation's analysis model: a model, or why there is none."""

    model: AnalysisModel | None
    requested: str | None
    problem: str | None = None


class ModelRegistry:
    def __init__(self, models: list[AnalysisModel], default: str | None = STATS_MODEL) -> None:
        self._models = {m.name: m for m in models}
        self.default = default or None

    @classmethod
    def from_configs(
        cls, configs: list[ChatModelConfig], default: str | None = STATS_MODEL
    ) -> ModelRegistry:
        models: list[AnalysisModel] = [StatsModel()]
        models += [ChatCompletionsModel(c) for c in configs if c.name != STATS_MODEL]
        return cls(models, default)

    def names(self) -> list[str]:
        return sorted(self._models)

    def get(self, name: str) -> AnalysisModel | None:
        return self._models.get(name)

    def resolve(self, override: str | None) -> Resolution:
        requested = override or self.default
        if not requested:
            return Resolution(None, None, "no analysis model is configured for this evaluation")
        model = self._models.get(requested)
        if model is None:
            return Resolution(
                None,
                requested,
                f"analysis model {requested!r} is not registered "
                f"(registered: {', '.join(self.names())})",
            )
        return Resolution(model, requested)

    async def aclose(self) -> None:
        for model in self._models.values():
            await model.aclose()
