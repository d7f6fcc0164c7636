"""The gateway's own settings (``DISPO_GATEWAY_*``)."""

from __future__ import annotations

from dispo.gateway import limits, timing
from dispo.gateway.expand import Limits
from dispo.gateway.shares import SHARE_LEASE, SubmitShares
from dispo.libs.clock import Clock
from dispo.libs.settings import local_address, service_settings_config
from pydantic import Field
from pydantic_settings import BaseSettings


class GatewaySettings(BaseSettings):
    model_config = service_settings_config("gateway")

    max_cells: int = Field(default=Limits.max_cells, description="Most cells in one submission")
    max_nodes: int = Field(
        default=Limits.max_nodes, description="Most DAG nodes a submission may expand into"
    )
    max_payload_bytes: int = Field(
        default=Limits.max_payload_bytes, description="Largest payload of one cell, in bytes"
    )
    status_durable: str = Field(
        default="gateway-status",
        description="Durable consumer of `task.status.>` (replicas share it)",
    )
    watch_poll_interval_seconds: float = Field(
        default=0.5,
        description="WatchTask re-reads the task at least this often (changes applied by"
        " another replica)",
    )
    max_page_size: int = Field(default=500, description="Largest ListTasks and ListTaskEvents page")
    events_read_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Longest a ListTaskEvents call waits for the status stream to deliver a"
        " task's snapshots (UNAVAILABLE beyond: try again)",
    )
    auth_bootstrap_file: str = Field(
        default="",
        description="Tokens to store on start unless their ids exist (ids, kinds and hashes;"
        " `dispo up` writes it in the data folder, ADR-0040)",
    )
    submit_batch: int = Field(
        default=500, ge=1, description="Most Submits recorded by one transaction (group commit)"
    )
    status_batch: int = Field(
        default=1000,
        ge=1,
        description="Status events in hand at once; the view takes each flush of them with"
        " one statement",
    )
    status_ack_wait_seconds: float = Field(
        default=5.0,
        gt=0,
        description="JetStream ack wait of the status consumer: the status events a crashed"
        " gateway held come back after this (a live one extends it while it works)",
    )
    submit_flushes: int = Field(
        default=1,
        ge=1,
        description="Most Submit transactions in progress at once (one: the Submits arriving"
        " during a flush all go in the next, the fewest transactions for the CPU)",
    )
    submit_rate_per_second: float = Field(
        default=limits.SUBMIT_RATE_PER_SECOND,
        ge=0,
        description="Submits a second one business may make (a token bucket; 0: no limit),"
        " across every gateway (each accepts at its share of it, ADR-0108) unless"
        " `DISPO_GATEWAY_CLUSTER_LIMITS` is false; beyond it RESOURCE_EXHAUSTED with a"
        " RetryInfo",
    )
    cluster_limits: bool = Field(
        default=True,
        description="Hold the Submit rate of a business across every gateway, each gateway"
        " accepting at the share of it it leases in the gateway's database (ADR-0108); false:"
        " each gateway counts it alone",
    )
    share_lease_seconds: float = Field(
        default=SHARE_LEASE,
        gt=0,
        description="How long a gateway's share of a business's Submit rate is leased, renewed"
        " every third of it while the business submits: a dead gateway's share is free after"
        " this (ADR-0108)",
    )
    submit_burst: int = Field(
        default=limits.SUBMIT_BURST,
        ge=1,
        description="Submits a business may make at once above its rate (the bucket's size;"
        " across the gateways, each holds a part in proportion to its share of the rate)",
    )
    max_watches_per_business: int = Field(
        default=limits.MAX_WATCHES_PER_BUSINESS,
        ge=1,
        description="WatchTask streams one business may hold open on one gateway process",
    )
    executor_address: str = Field(
        default=local_address("executor"),
        description="The executor's gRPC address, where GetTask and WatchTask read the outputs"
        " of a task's nodes and its result (ExecutorService.GetOutputs; `dispo up` gives its"
        " executor's)",
    )
    outputs_timeout_seconds: float = Field(
        default=2.0,
        gt=0,
        description="Deadline of one read of a task's outputs from the executor; beyond it the"
        " view is answered without them (`outputs_unavailable`)",
    )
    reconciler_address: str = Field(
        default=local_address("reconciler"),
        description="The reconciler's gRPC address, where EraseTask seals a FAILED task before"
        " erasing it (ReconcilerService.SealTask, ADR-0114; `dispo up` gives its reconciler's)",
    )
    seal_timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Deadline of the seal EraseTask asks of the reconciler for a FAILED task;"
        " past it (or with the reconciler unreachable) EraseTask answers UNAVAILABLE and erases"
        " nothing",
    )
    schedule_interval_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often every gateway looks for due schedule firings (ADR-0104): a"
        " firing submits at most this late after its fire time (and jitter)",
    )
    schedule_batch: int = Field(
        default=100, ge=1, description="Most schedules one firing transaction takes"
    )
    bulk_interval_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often every gateway takes the next batches of the running bulk"
        " actions (CancelByFilter, ADR-0112)",
    )
    bulk_batch: int = Field(
        default=500, ge=1, description="Most tasks one bulk action's transaction cancels"
    )
    bulk_max_rate: float = Field(
        default=1000.0,
        gt=0,
        description="Highest rate_per_second a bulk action may ask (tasks a second)",
    )

    max_delay_seconds: int = Field(
        default=timing.DEFAULT_MAX_DELAY_SECONDS,
        ge=1,
        description="How far ahead a Submit's not_before (a delayed start) or deadline may be,"
        " in seconds (INVALID_ARGUMENT naming the field beyond)",
    )

    def caller_limits(
        self, clock: Clock, shares: SubmitShares | None = None
    ) -> limits.CallerLimits:
        return limits.CallerLimits(
            clock,
            submit_rate=self.submit_rate_per_second,
            submit_burst=self.submit_burst,
            max_watches=self.max_watches_per_business,
            shares=shares if self.cluster_limits else None,
        )

    def limits(self) -> Limits:
        return Limits(
            max_cells=self.max_cells,
            max_nodes=self.max_nodes,
            max_payload_bytes=self.max_payload_bytes,
        )
