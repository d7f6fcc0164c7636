"""``dispo catalogue``: the cell catalogue's versions (CatalogueService, docs/catalogue.md).

The catalogue file stays the bootstrap and the thing reviewed in git: ``export`` prints a
version as a file, ``apply`` shows the difference between the current version and a file,
then records the file as the next version (``--dry-run``: the difference and the check
alone)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from dispo.libs.api.common.v1 import common_pb2
from dispo.libs.api.gateway.v1 import catalogue_pb2, catalogue_pb2_grpc
from dispo.libs.catalogue.diff import document_diff, document_yaml
from dispo.tools.cli._common import JSON_OPTION, emit_json, out, show, target, usage, when
from rich.table import Table

catalogue_app = typer.Typer(
    help="The cell catalogue: its versions, cells and downstreams, changed without a restart.",
    no_args_is_help=True,
)

VERSION = Annotated[int, typer.Option("--version", help="a version number (0: the current one)")]
DEFINITION = Annotated[
    str,
    typer.Option("--file", "-f", help="the definition (YAML or JSON, as in the file), - for stdin"),
]
BASED_ON = Annotated[
    int,
    typer.Option(
        "--based-on", help="the version the change is made from (default: the current one)"
    ),
]


@contextmanager
def _stub(ctx: typer.Context) -> Iterator[catalogue_pb2_grpc.CatalogueServiceStub]:
    with target(ctx).channel("gateway") as channel:
        yield catalogue_pb2_grpc.CatalogueServiceStub(channel)


def _read(source: str) -> str:
    try:
        return sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as error:
        usage(f"cannot read {source}: {error.strerror}")


def _document(version: catalogue_pb2.CatalogueVersion) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(version.document_json or "{}")
    return found


def _get(stub: catalogue_pb2_grpc.CatalogueServiceStub, version: int = 0) -> Any:
    return stub.GetCatalogue(catalogue_pb2.GetCatalogueRequest(version=version), timeout=10)


def _based_on(stub: catalogue_pb2_grpc.CatalogueServiceStub, given: int) -> int:
    return given or int(_get(stub).catalogue.version)


def _render(version: catalogue_pb2.CatalogueVersion) -> Table:
    document = _document(version)
    table = Table(show_header=False, box=None, title=f"catalogue version {version.version}")
    table.add_row("made", f"{when(version.created_at)} by {version.author}")
    table.add_row("change", version.change)
    for name, raw in sorted((document.get("cells") or {}).items()):
        owner = version.owners.get(name) or "shared"
        actions = ", ".join((raw or {}).get("actions") or {})
        table.add_row(f"cell {name}", f"{owner}: {actions}")
    for name, raw in sorted((document.get("downstreams") or {}).items()):
        table.add_row(f"downstream {name}", str((raw or {}).get("base_url", "")))
    if version.retired:
        table.add_row("retired", ", ".join(version.retired))
    return table


@catalogue_app.command("show")
def show_version(ctx: typer.Context, version: VERSION = 0, as_json: JSON_OPTION = False) -> None:
    """A version's cells (with their owners and actions) and downstreams."""
    with _stub(ctx) as stub:
        reply = _get(stub, version)
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.catalogue)))


@catalogue_app.command()
def versions(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(help="at most this many, newest first")] = 20,
    as_json: JSON_OPTION = False,
) -> None:
    """The versions, newest first: who made each, when, and what it changed."""
    with _stub(ctx) as stub:
        reply = stub.ListCatalogueVersions(
            catalogue_pb2.ListCatalogueVersionsRequest(
                page=common_pb2.PageRequest(page_size=limit)
            ),
            timeout=10,
        )

    def render(r: catalogue_pb2.ListCatalogueVersionsResponse) -> Table:
        table = Table("version", "made", "by", "change")
        for v in r.versions:
            table.add_row(str(v.version), when(v.created_at), v.author, v.change)
        return table

    raise typer.Exit(show(reply, as_json, render))


@catalogue_app.command()
def export(ctx: typer.Context, version: VERSION = 0, as_json: JSON_OPTION = False) -> None:
    """Print a version as a catalogue file (YAML), to keep in git or edit and apply."""
    with _stub(ctx) as stub:
        reply = _get(stub, version)
    if as_json:
        emit_json(reply)
    else:
        sys.stdout.write(document_yaml(_document(reply.catalogue)))


@catalogue_app.command()
def diff(
    ctx: typer.Context,
    old: Annotated[int, typer.Argument(help="the older version")],
    new: Annotated[int, typer.Argument(help="the newer version (0: the current one)")] = 0,
    as_json: JSON_OPTION = False,
) -> None:
    """The difference between two versions."""
    with _stub(ctx) as stub:
        before, after = _get(stub, old).catalogue, _get(stub, new).catalogue
    lines = document_diff(
        _document(before),
        _document(after),
        f"version {before.version}",
        f"version {after.version}",
    )
    if as_json:
        emit_json({"old": before.version, "new": after.version, "diff": lines})
    else:
        out.print("\n".join(lines) or "no difference", highlight=False, markup=False)


@catalogue_app.command()
def apply(
    ctx: typer.Context,
    file: Annotated[str, typer.Argument(help="a catalogue file (YAML or JSON), - for stdin")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show the difference and check it, record nothing")
    ] = False,
    as_json: JSON_OPTION = False,
) -> None:
    """Show the difference between the current version and FILE, then record FILE as the
    next version: the cells it adds are shared, the cells it leaves out are retired."""
    text = _read(file)
    try:
        proposed = yaml.safe_load(text)
    except yaml.YAMLError as error:
        usage(f"{file} is neither YAML nor JSON: {error}")
    if not isinstance(proposed, dict):
        usage(f"{file} must hold a catalogue (cells, downstreams, ...)")
    with _stub(ctx) as stub:
        current = _get(stub).catalogue
        lines = document_diff(_document(current), proposed, f"version {current.version}", str(file))
        if not as_json:
            out.print("\n".join(lines) or "no difference", highlight=False, markup=False)
        request = catalogue_pb2.ApplyCatalogueRequest(
            document=text, based_on_version=current.version
        )
        if dry_run or not lines:
            stub.DryRun(catalogue_pb2.DryRunRequest(apply=request), timeout=10)  # the check
            if as_json:
                emit_json({"based_on_version": current.version, "diff": lines, "applied": False})
            raise typer.Exit(0)
        reply = stub.ApplyCatalogue(request, timeout=10)
    if as_json:
        emit_json(reply)
    else:
        out.print(f"recorded catalogue version {reply.catalogue.version}")


@catalogue_app.command()
def register(
    ctx: typer.Context,
    cell: Annotated[str, typer.Argument(help="the new cell's name")],
    file: DEFINITION,
    business: Annotated[
        str, typer.Option(help="its owner (an admin's default: shared by every business)")
    ] = "",
    based_on: BASED_ON = 0,
    as_json: JSON_OPTION = False,
) -> None:
    """Add a cell (a business token's cell is its business's)."""
    definition = _read(file)
    with _stub(ctx) as stub:
        reply = stub.RegisterCell(
            catalogue_pb2.RegisterCellRequest(
                cell=cell,
                definition=definition,
                business=business,
                based_on_version=_based_on(stub, based_on),
            ),
            timeout=10,
        )
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.catalogue)))


@catalogue_app.command()
def update(
    ctx: typer.Context,
    cell: Annotated[str, typer.Argument(help="the cell to change")],
    file: DEFINITION,
    based_on: BASED_ON = 0,
    as_json: JSON_OPTION = False,
) -> None:
    """Replace a cell's definition (tasks accepted before keep theirs)."""
    definition = _read(file)
    with _stub(ctx) as stub:
        reply = stub.UpdateCell(
            catalogue_pb2.UpdateCellRequest(
                cell=cell, definition=definition, based_on_version=_based_on(stub, based_on)
            ),
            timeout=10,
        )
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.catalogue)))


@catalogue_app.command()
def retire(
    ctx: typer.Context,
    cell: Annotated[str, typer.Argument(help="the cell to retire")],
    based_on: BASED_ON = 0,
    as_json: JSON_OPTION = False,
) -> None:
    """Refuse new submissions naming a cell; its tasks in flight finish."""
    with _stub(ctx) as stub:
        reply = stub.RetireCell(
            catalogue_pb2.RetireCellRequest(cell=cell, based_on_version=_based_on(stub, based_on)),
            timeout=10,
        )
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.catalogue)))


@catalogue_app.command("put-downstream")
def put_downstream(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the downstream's name")],
    file: DEFINITION,
    based_on: BASED_ON = 0,
    as_json: JSON_OPTION = False,
) -> None:
    """Add or replace a downstream (an admin token: its base URL is an egress decision)."""
    definition = _read(file)
    with _stub(ctx) as stub:
        reply = stub.PutDownstream(
            catalogue_pb2.PutDownstreamRequest(
                downstream=name, definition=definition, based_on_version=_based_on(stub, based_on)
            ),
            timeout=10,
        )
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.catalogue)))


@catalogue_app.command("retire-downstream")
def retire_downstream(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the downstream to remove")],
    based_on: BASED_ON = 0,
    as_json: JSON_OPTION = False,
) -> None:
    """Remove a downstream no cell calls any more (an admin token)."""
    with _stub(ctx) as stub:
        reply = stub.RetireDownstream(
            catalogue_pb2.RetireDownstreamRequest(
                downstream=name, based_on_version=_based_on(stub, based_on)
            ),
            timeout=10,
        )
    raise typer.Exit(show(reply, as_json, lambda r: _render(r.catalogue)))
