"""The reconciler's settings (``DISPO_RECONCILER_*``) and its recovery configuration file.

Settings say where things are; the YAML file (``DISPO_RECONCILER_CONFIG``, default
``recovery.yaml`` beside this module) holds the policies: redrive per business / cell,
release rates per downstream, callback delivery, reconciliation sampling and arbitration.
The downstream registry (base URLs for probes, health URLs) and the conflicts arbitration
decides come from the catalogue every service reads (``DISPO_CATALOGUE``): its
``downstreams`` and each cell's ``conflict``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from dispo.libs.catalogue import Catalogue, Downstream, load_configured_catalogue
from dispo.libs.settings import local_address, service_settings_config
from dispo.reconciler.arbitration.policy import ArbitrationPolicy, PriorityRule
from dispo.reconciler.recovery.policy import ProbeRule, RedrivePolicy, ReleaseRate
from pydantic import Field
from pydantic_settings import BaseSettings

DEFAULT_CONFIG = Path(__file__).resolve().parent / "recovery.yaml"


class ReconcilerSettings(BaseSettings):
    model_config = service_settings_config("reconciler")

    config: str = Field(
        default="",
        description="Recovery policy file (YAML); empty: the `recovery.yaml` shipped with the"
        " reconciler",
    )
    sweep_interval_seconds: float = Field(
        default=1.0,
        description="Time between two rounds of the sweeps (0: sweeps run only through RunSweep)",
    )
    batch: int = Field(default=100, description="Rows one sweep handles at most")
    http_timeout_seconds: float = Field(
        default=5.0,
        description="Timeout of probes (a worker node's probe waits this long for a worker's"
        " answer) and health checks; the total deadline of one callback"
        " delivery (from the request to the end of its answer, on the service's clock)",
    )
    durable: str = Field(
        default="reconciler",
        description="Durable consumer name prefix (replicas share the consumers). The `TASKS`"
        " stream keeps each message until the declared `reconciler-*` durables have"
        " acknowledged it: another prefix adds consumers, it does not replace those (ADR-0092)",
    )
    ack_wait_seconds: float = Field(
        default=5.0,
        gt=0,
        description="JetStream ack wait of the reconciler's consumers: the messages a crashed"
        " reconciler held come back after this (a live one extends it while it works)",
    )
    gather_seconds: float = Field(
        default=0.1,
        ge=0,
        description="How long the reconciler's consumers, once they keep up, let messages"
        " gather before taking them with one pull (a message to an idle consumer is taken at"
        " once; 0: each message as it is stored)",
    )
    gateway_address: str = Field(
        default=local_address("gateway"),
        description="The gateway's gRPC address, where compensating cells are submitted",
    )
    executor_address: str = Field(
        default=local_address("executor"),
        description="The executor's gRPC address, where a SUCCEEDED task's result is read for"
        " its completion callback (ExecutorService.GetOutputs) and UNKNOWN worker nodes are"
        " probed (ProbeWorkerNode); `dispo up` gives its executor's",
    )
    outputs_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        description="Deadline of one read of a task's result from the executor; a callback"
        " whose result was not read is not sent, and is retried as a failed delivery is",
    )
    demoted_max_age_seconds: float = Field(
        default=86400.0,
        gt=0,
        description="Age limit of a DEMOTED task (since it was parked): past it, the task ends"
        " FAILED with the reason",
    )
    decision_max_age_seconds: float = Field(
        default=604800.0,
        gt=0,
        description="Age limit of a task AWAITING_DECISION (since it was parked): past it, the"
        " task ends FAILED with the reason; its UNKNOWN nodes stay UNKNOWN",
    )
    notify_concurrency: int = Field(
        default=32,
        ge=1,
        description="Callback deliveries under way at once, each on its own: a delivery never"
        " waits for another, and the notify sweep claims only as many as there are free slots",
    )
    notify_per_business: int = Field(
        default=8,
        ge=1,
        description="Of those, at most this many for one business: its slow receivers never"
        " hold every slot, and other businesses' callbacks go out beside them",
    )


@dataclass(frozen=True)
class CallbackPolicy:
    max_attempts: int = 10
    base_delay: float = 5.0
    max_delay: float = 600.0
    jitter: float = 0.5


@dataclass(frozen=True)
class ReconcilePolicy:
    # Share of finished tasks whose nodes are probed (0–100).
    sample_percent: int = 100
    # Seconds after a task finishes before its nodes are probed.
    delay: float = 60.0
    # Probe attempts before the pass records the task as not reconcilable.
    max_attempts: int = 5
    retry_delay: float = 60.0


@dataclass(frozen=True)
class CompensationPolicy:
    max_attempts: int = 10
    base_delay: float = 5.0
    max_delay: float = 600.0


@dataclass(frozen=True)
class RecoveryConfig:
    redrive_default: RedrivePolicy = field(default_factory=RedrivePolicy)
    # (business or "", cell or "", policy); the most specific match wins.
    redrive_rules: tuple[tuple[str, str, RedrivePolicy], ...] = ()
    release_default: ReleaseRate = field(default_factory=ReleaseRate)
    release: dict[str, ReleaseRate] = field(default_factory=dict)
    # Seconds between settlement probes of the same task when a probe could not decide
    # (at most: the probes of a node recently UNKNOWN come sooner, :class:`ProbeRule`).
    settle_retry_delay: float = 30.0
    # Seconds an UNKNOWN node is probed without a final answer before an operator decides.
    settle_probe_limit: float = ProbeRule.limit
    callbacks: CallbackPolicy = field(default_factory=CallbackPolicy)
    reconcile: ReconcilePolicy = field(default_factory=ReconcilePolicy)
    arbitration: ArbitrationPolicy = field(default_factory=ArbitrationPolicy)
    compensation: CompensationPolicy = field(default_factory=CompensationPolicy)
    downstreams: dict[str, Downstream] = field(default_factory=dict)

    def redrive_policy(self, business: str, cell: str) -> RedrivePolicy:
        best: tuple[int, RedrivePolicy] | None = None
        for rule_business, rule_cell, policy in self.redrive_rules:
            if (rule_business and rule_business != business) or (rule_cell and rule_cell != cell):
                continue
            score = (2 if rule_business else 0) + (1 if rule_cell else 0)
            if best is None or score > best[0]:
                best = (score, policy)
        return best[1] if best else self.redrive_default

    def release_rate(self, downstream: str) -> ReleaseRate:
        return self.release.get(downstream, self.release_default)

    @property
    def probes(self) -> ProbeRule:
        return ProbeRule(max_interval=self.settle_retry_delay, limit=self.settle_probe_limit)


def _fields(cls: type, raw: dict[str, Any], where: str) -> dict[str, Any]:
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]  # cls is a dataclass
    unknown = set(raw) - names
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    return raw


def parse_config(data: dict[str, Any], catalogue: Catalogue | None = None) -> RecoveryConfig:
    """The policies in ``data`` (recovery.yaml) with the downstreams and conflicts of
    ``catalogue`` (none when it is not given)."""
    catalogue = catalogue or Catalogue()
    redrive = data.get("redrive") or {}
    default = RedrivePolicy(
        **_fields(RedrivePolicy, redrive.get("default") or {}, "redrive.default")
    )
    rules = []
    for i, raw in enumerate(redrive.get("rules") or []):
        raw = dict(raw)
        business, cell = str(raw.pop("business", "")), str(raw.pop("cell", ""))
        merged = {**default.__dict__, **_fields(RedrivePolicy, raw, f"redrive.rules[{i}]")}
        rules.append((business, cell, RedrivePolicy(**merged)))
    release = data.get("release") or {}
    release_default = ReleaseRate(
        **_fields(ReleaseRate, release.get("default") or {}, "release.default")
    )
    per_downstream = {
        name: ReleaseRate(
            **{**release_default.__dict__, **_fields(ReleaseRate, raw or {}, f"release.{name}")}
        )
        for name, raw in (release.get("downstreams") or {}).items()
    }
    arb = data.get("arbitration") or {}
    if "conflicts" in arb:
        raise ValueError(
            "arbitration.conflicts: conflicts are declared beside their cells in the catalogue"
            " (cells.<cell>.conflict)"
        )
    priority = tuple(
        PriorityRule(business=str(r.get("business", "")), cell=str(r.get("cell", "")))
        for r in arb.get("priority") or []
    )
    return RecoveryConfig(
        redrive_default=default,
        redrive_rules=tuple(rules),
        release_default=release_default,
        release=per_downstream,
        settle_retry_delay=float(data.get("settle_retry_delay", RecoveryConfig.settle_retry_delay)),
        settle_probe_limit=float(data.get("settle_probe_limit", RecoveryConfig.settle_probe_limit)),
        callbacks=CallbackPolicy(
            **_fields(CallbackPolicy, data.get("callbacks") or {}, "callbacks")
        ),
        reconcile=ReconcilePolicy(
            **_fields(ReconcilePolicy, data.get("reconciliation") or {}, "reconciliation")
        ),
        arbitration=ArbitrationPolicy(
            window=float(arb.get("window_seconds", ArbitrationPolicy.window)),
            priority=priority,
            conflicts=catalogue.conflicts,
        ),
        compensation=CompensationPolicy(
            **_fields(CompensationPolicy, arb.get("compensation") or {}, "arbitration.compensation")
        ),
        downstreams=catalogue.downstreams,
    )


def with_catalogue(config: RecoveryConfig, catalogue: Catalogue) -> RecoveryConfig:
    """``config`` under a newer catalogue version (ADR-0111): its conflicts, and its
    downstreams over the ones known before (a downstream it no longer has stays known, for
    the tasks accepted before)."""
    return dataclasses.replace(
        config,
        downstreams={**config.downstreams, **catalogue.downstreams},
        arbitration=dataclasses.replace(config.arbitration, conflicts=catalogue.conflicts),
    )


def load_config(settings: ReconcilerSettings) -> RecoveryConfig:
    config_path = Path(settings.config) if settings.config else DEFAULT_CONFIG
    return parse_config(yaml.safe_load(config_path.read_text()) or {}, load_configured_catalogue())
