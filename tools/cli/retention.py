"""``dispo retention show``: what the gateway, the executor and the reconciler will delete
next, each for its own tables (RetentionService of each, ADR-0105): the finished tasks by
business, then the records each keeps besides them (bulk actions, quarantined outbox rows,
the quarantine), with what is held for an operator. Nothing is deleted."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from dispo.libs.api.retention.v1 import retention_pb2 as pb
from dispo.libs.api.retention.v1 import retention_pb2_grpc
from dispo.tools.cli._common import JSON_OPTION, as_dict, emit_json, out, target, when
from rich.table import Table

# The services that purge, each its own tables.
PURGING = ("gateway", "executor", "reconciler")
CALL_SECONDS = 30.0  # a count of the finished tasks past their cutoff, on a large table

Service = StrEnum("Service", {name: name for name in ("all", *PURGING)})  # type: ignore[misc]
ALL = Service("all")

retention_app = typer.Typer(
    help="Retention: finished tasks past their business's period (docs/retention.md).",
    no_args_is_help=True,
)


@retention_app.command(name="show")
def retention_show(
    ctx: typer.Context,
    service: Annotated[
        Service, typer.Option("--service", help="one service's retention (default: all three)")
    ] = ALL,
    business: Annotated[str, typer.Option(help="only this business")] = "",
    as_json: JSON_OPTION = False,
) -> None:
    """A dry run: by service and business, the retention, the cutoff now and the finished
    tasks past it that the next passes delete; then, by service, the other records it keeps
    (bulk actions, quarantined outbox rows, the quarantine): those due, and those held until
    an operator replays or discards them."""
    names = PURGING if service is ALL else (service.value,)
    replies: dict[str, pb.GetRetentionResponse] = {}
    for name in names:
        with target(ctx).channel(name) as channel:
            stub = retention_pb2_grpc.RetentionServiceStub(channel)
            replies[name] = stub.GetRetention(
                pb.GetRetentionRequest(business=business), timeout=CALL_SECONDS
            )
    if as_json:
        emit_json({name: as_dict(reply) for name, reply in replies.items()})
        return
    drawn = Table(box=None, pad_edge=False)
    for header in ("service", "business", "days", "cutoff", "due"):
        drawn.add_column(header, overflow="fold")
    for name, reply in replies.items():
        for row in reply.businesses:
            drawn.add_row(
                name if reply.enabled else f"{name} (off)",
                row.business or "(none recorded)",
                str(row.retention_days),
                when(row.cutoff),
                str(row.due),
            )
    out.print(drawn)
    total = sum(r.due for reply in replies.values() for r in reply.businesses)
    out.print(f"{total} rows of finished tasks past their retention", style="dim")
    kept = Table(box=None, pad_edge=False)
    for header in ("service", "records", "due", "held", "rule"):
        kept.add_column(header, overflow="fold")
    for name, reply in replies.items():
        for record in reply.records:
            kept.add_row(name, record.table, str(record.due), str(record.held), record.rule)
    if kept.row_count:
        out.print(kept)
        held = sum(r.held for reply in replies.values() for r in reply.records)
        out.print(f"{held} set-aside messages held until an operator acts", style="dim")
