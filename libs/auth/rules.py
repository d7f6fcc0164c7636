"""Who may call what: one rule per RPC of every service, declared here once.

An admin token may call every RPC. A business token may call the RPCs marked ``BUSINESS``,
and their servicers show and touch only its own business's work (:mod:`.scope`). A service
token may call the RPCs that name its service: the calls services make to one another. A
worker token may call the RPCs marked ``WORKER`` (serving worker runs), for the queues it
names only (:func:`.scope.require_queues`), and nothing else (ADR-0100). An RPC with no rule
here is refused to everyone, so an RPC added without one cannot be reached
(tests/platform/test_auth_matrix.py walks every RPC the services serve).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dispo.libs.auth.tokens import Kind, Principal


@dataclass(frozen=True)
class Rule:
    business: bool = False
    services: frozenset[str] = field(default_factory=frozenset)
    worker: bool = False

    def admits(self, principal: Principal) -> bool:
        if principal.kind is Kind.ADMIN:
            return True
        if principal.kind is Kind.BUSINESS:
            return self.business
        if principal.kind is Kind.WORKER:
            return self.worker
        return principal.service in self.services

    def needs(self) -> str:
        who = ["an admin token"]
        if self.business:
            who.append("a business token")
        if self.worker:
            who.append("a worker token of the queue")
        who += [f"the service token of {s!r}" for s in sorted(self.services)]
        return " or ".join(who)


# Operators only.
ADMIN = Rule()
# Business tokens too, scoped to their own business by the servicer.
BUSINESS = Rule(business=True)
# Worker tokens too, scoped to their own queues by the servicer.
WORKER = Rule(worker=True)


def internal(*services: str, business: bool = False) -> Rule:
    """Called by these services (and by admins)."""
    return Rule(business=business, services=frozenset(services))


def _methods(service: str, **rules: Rule) -> dict[str, Rule]:
    return {f"/{service}/{method}": rule for method, rule in rules.items()}


RULES: dict[str, Rule] = {
    **_methods(
        "dispo.gateway.v1.GatewayService",
        # The reconciler submits compensating cells for the business of the task they undo.
        Submit=internal("reconciler", business=True),
        SubmitMany=internal("reconciler", business=True),
        SubmitEach=internal("reconciler", business=True),
        GetTask=BUSINESS,
        ListTasks=BUSINESS,
        CountTasks=BUSINESS,
        CancelTask=BUSINESS,
        CancelByFilter=BUSINESS,
        GetBulkAction=BUSINESS,
        ListBulkActions=BUSINESS,
        EraseTask=BUSINESS,
        SignalTask=BUSINESS,
        WatchTask=BUSINESS,
        ListTaskEvents=BUSINESS,
        ListCells=BUSINESS,
    ),
    # A business token manages its own business's schedules (ADR-0104).
    **_methods(
        "dispo.gateway.v1.ScheduleService",
        CreateSchedule=BUSINESS,
        GetSchedule=BUSINESS,
        ListSchedules=BUSINESS,
        UpdateSchedule=BUSINESS,
        PauseSchedule=BUSINESS,
        ResumeSchedule=BUSINESS,
        DeleteSchedule=BUSINESS,
        TriggerSchedule=BUSINESS,
    ),
    # A business token registers and changes its own business's cells; downstreams and
    # whole documents are an admin's; the executor and the reconciler follow the versions
    # (ADR-0111).
    **_methods(
        "dispo.gateway.v1.CatalogueService",
        GetCatalogue=internal("executor", "reconciler", business=True),
        ListCatalogueVersions=internal("executor", "reconciler", business=True),
        RegisterCell=BUSINESS,
        UpdateCell=BUSINESS,
        RetireCell=BUSINESS,
        PutDownstream=ADMIN,
        RetireDownstream=ADMIN,
        ApplyCatalogue=ADMIN,
        DryRun=BUSINESS,
    ),
    **_methods(
        "dispo.auth.v1.TokenService",
        CreateToken=ADMIN,
        ListTokens=ADMIN,
        RevokeToken=ADMIN,
        RotateSigningSecret=ADMIN,
        FinishSigningSecretRotation=ADMIN,
        ListSigningSecrets=ADMIN,
    ),
    **_methods(
        "dispo.executor.v1.ExecutorService",
        # The reconciler releases demoted work only into a breaker that is not OPEN
        # (ADR-0115).
        ListDownstreams=internal("reconciler"),
        # The gateway shows outputs in GetTask and WatchTask; the reconciler puts the
        # result in completion callbacks.
        GetOutputs=internal("gateway", "reconciler"),
        # The reconciler releases work demoted behind a queue once it is live (ADR-0101).
        ListQueues=internal("reconciler"),
        # The reconciler settles UNKNOWN worker nodes by their workers' probes (ADR-0100).
        ProbeWorkerNode=internal("reconciler"),
        # Operators hold and release a business's work (ADR-0109).
        PauseBusiness=ADMIN,
        ResumeBusiness=ADMIN,
        ListBusinesses=ADMIN,
    ),
    # Worker processes serving worker actions' queues (ADR-0099, ADR-0100).
    **_methods(
        "dispo.executor.v1.WorkerService",
        PollRuns=WORKER,
        HeartbeatRuns=WORKER,
        CompleteRun=WORKER,
        CompleteRuns=WORKER,
        ReleaseRuns=WORKER,
    ),
    **_methods(
        "dispo.reconciler.v1.ReconcilerService",
        ListRecoveryTasks=BUSINESS,
        ListFailedWork=BUSINESS,
        GetRecoveryTask=BUSINESS,
        # A business resumes its own FAILED task; RedriveByFilter is the bulk redrive.
        RedriveTask=BUSINESS,
        RedriveByFilter=ADMIN,
        AbandonByFilter=ADMIN,
        AbandonTask=ADMIN,
        ResolveNode=ADMIN,
        ListDownstreams=ADMIN,
        PauseDownstream=ADMIN,
        ResumeDownstream=ADMIN,
        GetCompletion=BUSINESS,
        ListFindings=ADMIN,
        ListVerdicts=ADMIN,
        RunSweep=ADMIN,
        # The gateway seals a FAILED task before it erases it (ADR-0114).
        SealTask=internal("gateway"),
    ),
    **_methods("dispo.reconciler.v1.DriftService", RunDriftCheck=ADMIN, ListRepairs=ADMIN),
    # Evaluations and analysis jobs belong to no business: operators' work.
    **_methods(
        "dispo.intelligence.v1.IntelligenceService",
        CreateEvaluation=ADMIN,
        RecordRunResults=ADMIN,
        CompleteEvaluation=ADMIN,
        GetEvaluation=ADMIN,
        AssignAnalysisModel=ADMIN,
        # The pool checks a new evaluation's analysis_model against them.
        ListAnalysisModels=internal("pool"),
        TriggerAnalysis=ADMIN,
        TriggerComparison=ADMIN,
        GetAnalysis=ADMIN,
        GetComparison=ADMIN,
        ListJobs=ADMIN,
    ),
    **_methods(
        "dispo.pool.v1.PoolService",
        GetPoolStatus=ADMIN,
        ListCrons=ADMIN,
        ListAssignments=ADMIN,
        ListQueue=ADMIN,
        ListResizes=ADMIN,
        CreateEvaluation=ADMIN,
        GetEvaluation=ADMIN,
        PauseEvaluation=ADMIN,
        ResumeEvaluation=ADMIN,
        CancelEvaluation=ADMIN,
        BoostEvaluation=ADMIN,
        SetPoolBounds=ADMIN,
        ForceRelease=ADMIN,
        # The cron protocol: the pool-worker's crons, and the pool's own wake command (the
        # openclaw driver's automations run it with the pool's token).
        WakeCron=internal("pool", "pool-worker"),
        RecordRun=internal("pool", "pool-worker"),
        # The reconciler's drift checks.
        GetDriftView=internal("reconciler"),
        ApplyRepair=internal("reconciler"),
    ),
    **_methods("dispo.retention.v1.RetentionService", GetRetention=ADMIN),
    **_methods(
        "dispo.quarantine.v1.QuarantineService",
        ListMessages=ADMIN,
        GetMessage=ADMIN,
        ReplayMessage=ADMIN,
        DiscardMessage=ADMIN,
        ListOutboxRows=ADMIN,
        ReplayOutboxRows=ADMIN,
        DiscardOutboxRows=ADMIN,
    ),
}
