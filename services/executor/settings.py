"""The executor's own settings (``DISPO_EXECUTOR_*``)."""

from __future__ import annotations

from dispo.executor.domain import RetryPolicy
from dispo.executor.runner import ExecutorConfig
from dispo.libs.settings import service_settings_config
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings


class ExecutorSettings(BaseSettings):
    model_config = service_settings_config("executor")

    durable: str = Field(
        default="executor",
        description="Durable consumer name shared by all replicas (they split the work). The"
        " `TASKS` stream keeps each message until the declared `executor*` durables have"
        " acknowledged it: another name adds a consumer, it does not replace those (ADR-0092)",
    )
    lease_ttl_seconds: float = Field(
        default=ExecutorConfig.lease_ttl,
        description="How long a pass holds a task's lease without a heartbeat; a crashed"
        " executor's tasks are taken over after this",
    )
    send_margin_seconds: float = Field(
        default=0.0,
        ge=0,
        description="A call leaves only while its pass's lease runs at least this much longer"
        " (checked right before the request is written; below twice this the lease is"
        " extended first); 0: a fifth of the lease",
    )
    ack_wait_seconds: float = Field(
        default=5.0,
        description="JetStream ack wait: a message a crashed executor held comes back after"
        " this (a live one extends it while it works)",
    )
    batch: int = Field(
        default=ExecutorConfig.in_hand,
        ge=1,
        description="`task.create` messages in hand at most: the passes running and the"
        " messages waiting for one, read ahead so that the next pass goes to the business"
        " whose turn it is (ADR-0109)",
    )
    passes: int = Field(
        default=ExecutorConfig.passes,
        ge=1,
        description="Passes (tasks being run) at once at most; the next one starts in the"
        " fair order: weighted round-robin across businesses, then priority, then arrival"
        " (ADR-0109)",
    )
    business_hold: int = Field(
        default=ExecutorConfig.business_hold,
        ge=1,
        description="`task.create` messages of one business held waiting for a pass at most;"
        " the next ones go back to the stream for later, so the consumer reads on to the"
        " other businesses' (ADR-0109)",
    )
    max_ack_pending: int = Field(
        default=100_000,
        ge=1,
        description="`task.create` messages delivered and not acknowledged at most, across"
        " every replica: the messages in hand and those handed back for later. A flooding"
        " business's backlog beyond it holds the other businesses' messages behind it in"
        " the stream (ADR-0109)",
    )
    flush_max_items: int = Field(
        default=ExecutorConfig.flush_max_items,
        description="Tasks whose database work shares one transaction (group commit) at most",
    )
    flush_concurrency: int = Field(
        default=ExecutorConfig.flush_concurrency,
        description="Group-commit transactions of one kind running at the same time at most",
    )
    max_retries: int = Field(
        default=RetryPolicy.max_retries,
        description="Short retries of a node after its first attempt",
    )
    retry_base_delay_seconds: float = Field(
        default=RetryPolicy.base_delay,
        description="Delay before the first short retry (doubles each retry, jittered)",
    )
    retry_max_delay_seconds: float = Field(
        default=RetryPolicy.max_delay, description="Longest delay between two short retries"
    )
    breaker_threshold: int = Field(
        default=ExecutorConfig.breaker_threshold,
        description="Calls within the window before its failure ratio can open a downstream's"
        " circuit breaker",
    )
    breaker_window_seconds: float = Field(
        default=ExecutorConfig.breaker_window,
        description="Sliding window in which a breaker counts calls and failures",
    )
    breaker_cooldown_seconds: float = Field(
        default=ExecutorConfig.breaker_cooldown,
        description="How long an open breaker waits before letting trial calls through",
    )
    breaker_failure_ratio: float = Field(
        default=ExecutorConfig.breaker_failure_ratio,
        gt=0,
        le=1,
        description="Share of failed calls in the window that opens a breaker",
    )
    breaker_trial_calls: int = Field(
        default=ExecutorConfig.breaker_trial_calls,
        ge=1,
        description="Trial calls a half-open breaker lets through; all must succeed to close it",
    )
    progress_interval_seconds: float = Field(
        default=ExecutorConfig.progress_interval,
        ge=0,
        description="A running task's progress (nodes claimed, calls ended) is published in"
        " one status event of its newest state at most this often; a task whose pass ends"
        " (finished, parked, back for a retry) is published at once, with what it did before",
    )
    max_connections: int = Field(
        default=256,
        ge=1,
        description="Connections to the downstreams kept open at most (all downstreams); a call"
        " beyond them waits for one, its lease checked again once it has it",
    )
    health_interval_seconds: float = Field(
        default=5.0, description="Time between downstream health checks (0: none)"
    )
    wait_sweep_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often the executor looks for waiting nodes whose timeout has passed"
        " (a wait node times out within this much after its time, ADR-0102).",
    )
    run_lease_seconds: float = Field(
        default=ExecutorConfig.run_lease,
        gt=0,
        description="How long a worker holds a run it took without a heartbeat (it heartbeats"
        " every third of this); a worker silent for longer has lost the run, which counts as"
        " ambiguous (ADR-0099)",
    )
    queue_idle_seconds: float = Field(
        default=ExecutorConfig.queue_idle,
        gt=0,
        description="How long a worker run may wait offered on a queue none of whose workers"
        " was seen within a run lease; then it is withdrawn and its node demoted, released by"
        " the reconciler once the queue has a live worker again (ADR-0101)",
    )
    deadline_sweep_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Time between sweeps for tasks past their deadline that no pass holds"
        " (parked, or between passes): each is closed FAILED, 'deadline reached' (ADR-0103)",
    )
    pause_poll_seconds: float = Field(
        default=1.0,
        gt=0,
        description="How often each executor reads which businesses are paused: a pause or a"
        " resume holds in every executor within this (ADR-0109)",
    )
    cluster_limits: bool = Field(
        default=ExecutorConfig.cluster_limits,
        description="Hold every downstream's `max_concurrency` and `max_calls_per_second`"
        " across all executors, each executor using the share of them it leases in the"
        " executor's database (ADR-0108); false: each executor counts them alone",
    )
    share_lease_seconds: float = Field(
        default=ExecutorConfig.share_lease,
        gt=0,
        description="How long an executor's share of a downstream's limits is leased (a"
        " slot's share for this much longer than the downstream's longest call timeout),"
        " renewed every third of it: a dead executor's share is free after this, and one cut"
        " off from the database stops calling when its share runs out (ADR-0108)",
    )
    demo_downstream: str = Field(
        default="", description="host:port to also serve the demo downstream in this process"
    )

    @model_validator(mode="after")
    def _margin_within_the_lease(self) -> ExecutorSettings:
        # A lease just extended must run more than twice the margin, or no call leaves.
        if self.send_margin_seconds * 3 > self.lease_ttl_seconds:
            raise ValueError(
                "DISPO_EXECUTOR_SEND_MARGIN_SECONDS must be at most a third of"
                " DISPO_EXECUTOR_LEASE_TTL_SECONDS"
            )
        return self

    def config(self) -> ExecutorConfig:
        return ExecutorConfig(
            lease_ttl=self.lease_ttl_seconds,
            retry=RetryPolicy(
                max_retries=self.max_retries,
                base_delay=self.retry_base_delay_seconds,
                max_delay=self.retry_max_delay_seconds,
            ),
            breaker_threshold=self.breaker_threshold,
            breaker_window=self.breaker_window_seconds,
            breaker_cooldown=self.breaker_cooldown_seconds,
            breaker_failure_ratio=self.breaker_failure_ratio,
            breaker_trial_calls=self.breaker_trial_calls,
            flush_max_items=self.flush_max_items,
            flush_concurrency=self.flush_concurrency,
            progress_interval=self.progress_interval_seconds,
            send_margin=self.send_margin_seconds or None,
            run_lease=self.run_lease_seconds,
            queue_idle=self.queue_idle_seconds,
            passes=self.passes,
            business_hold=self.business_hold,
            in_hand=self.batch,
            cluster_limits=self.cluster_limits,
            share_lease=self.share_lease_seconds,
        )
