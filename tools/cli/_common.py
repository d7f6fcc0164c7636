"""What every ``dispo`` command shares: where the stack is, the caller's token, one way to
call an RPC, one way to print a reply, and the exit codes.

Exit codes (docs/cli.md): 0 ok; 1 the task ended FAILED or CANCELLED (or a service is not
serving, for ``dispo status``); 2 usage (a bad option or input file); 3 a service could not
be reached; 4 the call was refused (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT,
NOT_FOUND, FAILED_PRECONDITION, ...).

``--json`` prints the reply's proto JSON form (``json_format`` with the proto's field names).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import grpc
import typer
from dispo.libs.auth import caller_token, open_sync_channel
from dispo.libs.settings import CommonSettings, server_settings
from dispo.sdk import Client, DispoError
from dispo.tools.stack.state import SERVICES, caller_tls, read_state
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

OK, ENDED_BADLY, USAGE, UNREACHABLE, REFUSED = 0, 1, 2, 3, 4
UNREACHABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

# The width a table is laid out in when the output is not a terminal (a pipe, a file): wide
# enough that no id or reason is folded or cut; a script gets the lines whole.
PIPED_WIDTH = 4096


def console(stderr: bool = False) -> Console:
    """A console at the terminal's width, or :data:`PIPED_WIDTH` wide when the stream is not
    a terminal and ``COLUMNS`` does not say otherwise (Rich would assume 80 columns)."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(stderr=stderr, soft_wrap=True, width=PIPED_WIDTH if piped else None)


out = console()
err = console(stderr=True)

# At a terminal, how much of a reason or an error a table row shows (``… show`` shows it
# whole); in a pipe or a file a row carries it whole.
BRIEF = 80


def brief(text: str, length: int = BRIEF) -> str:
    """``text`` for a table cell: its first ``length`` characters and an ellipsis when the
    output is a terminal, whole otherwise (a script that greps the table gets it all)."""
    if len(text) <= length or not out.is_terminal:
        return text
    return text[: length - 1] + "…"


Reply = TypeVar("Reply")
JSON_OPTION = Annotated[
    bool, typer.Option("--json", help="print the reply as JSON (the proto's JSON form)")
]


@contextmanager
def progress_bar(
    total: int, label: str, *, disable: bool = False, console: Console | None = None
) -> Iterator[Callable[..., None]]:
    """A bar of ``total`` steps on standard error while a long operation runs (its callable
    advances it one step, or as many as it is given); gone once done, and never drawn when the stream is not a terminal,
    so a pipe gets only the output."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    with Progress(
        *columns, TimeElapsedColumn(), console=console or err, transient=True, disable=disable
    ) as progress:
        bar = progress.add_task(label, total=total)
        yield lambda steps=1: progress.advance(bar, steps)


def data_dir(value: str | None) -> Path:
    return Path(value or CommonSettings().data_dir).resolve()


def service_addresses(folder: Path) -> dict[str, str]:
    """From the running stack's state file, else from DISPO_<SERVICE>_HOST/PORT settings."""
    state = read_state(folder)
    if state:
        return {name: info["address"] for name, info in state["services"].items()}
    return {name: server_settings(name).address for name in SERVICES}


@dataclass
class Target:
    """The stack a command talks to (the global options)."""

    data_dir: Path
    explicit_token: str | None

    def address(self, service: str) -> str:
        addresses = service_addresses(self.data_dir)
        if service not in addresses:
            fail(UNREACHABLE, f"the stack in {self.data_dir} runs no {service} service")
        return addresses[service]

    def token(self) -> str:
        return caller_token(self.explicit_token, self.data_dir)

    @contextmanager
    def channel(self, service: str, address: str | None = None) -> Iterator[grpc.Channel]:
        """A channel to ``service``; a call on it that fails ends the command (3 or 4)."""
        where = address or self.address(service)
        with (
            open_sync_channel(where, self.token(), tls=caller_tls(self.data_dir)) as channel,
            self.refusals(service, where),
        ):
            yield channel

    @contextmanager
    def client(self) -> Iterator[Client]:
        """The SDK's client of the gateway; a call that fails ends the command (3 or 4)."""
        where = self.address("gateway")
        with (
            Client(where, token=self.token(), tls=caller_tls(self.data_dir)) as client,
            self.refusals("gateway", where),
        ):
            yield client

    @contextmanager
    def refusals(self, service: str, address: str) -> Iterator[None]:
        try:
            yield
        except grpc.RpcError as error:
            refused(DispoError.from_rpc(error), service, address, self.data_dir)
        except DispoError as error:
            refused(error, service, address, self.data_dir)


def target(ctx: typer.Context) -> Target:
    found: Target = ctx.find_root().obj
    return found


def fail(code: int, message: str, hint: str = "") -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", highlight=False)
    if hint:
        err.print(hint, highlight=False, style="dim")
    raise typer.Exit(code)


def usage(message: str) -> NoReturn:
    fail(USAGE, message, "see --help")


_HINTS = {
    grpc.StatusCode.UNAUTHENTICATED: "the token was not accepted: pass --token, set DISPO_TOKEN,"
    " or run against the stack whose admin token is in {data}/admin.token",
    grpc.StatusCode.PERMISSION_DENIED: "this token may not do that: use an admin token, or a"
    " token of the business the item belongs to (dispo tokens create)",
    grpc.StatusCode.INVALID_ARGUMENT: "fix the fields named above and try again",
    grpc.StatusCode.NOT_FOUND: "check the id (dispo tasks list, dispo failed list, dispo pool"
    " queue list what exists)",
    grpc.StatusCode.FAILED_PRECONDITION: "the item is not in a state that allows this; look at it"
    " first (dispo tasks show, dispo failed show)",
    grpc.StatusCode.ALREADY_EXISTS: "use another id, or repeat the original request",
    grpc.StatusCode.ABORTED: "another change was recorded first: look again and retry",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "a size or rate limit: send less, or wait and try again",
}


def refused(error: DispoError, service: str, address: str, folder: Path) -> NoReturn:
    """Print what a failed call means and what to do, and exit 3 (unreachable) or 4."""
    code = error.code
    if code in UNREACHABLE_CODES:
        fail(
            UNREACHABLE,
            f"cannot reach the {service} at {address} ({code.name}: {error.message})",
            f"is the stack up? `dispo up` starts it and `dispo status` shows it; the addresses"
            f" come from {folder} (--data-dir) or DISPO_{service.upper()}_HOST/PORT",
        )
    lines = "".join(f"\n  {name}: {why}" for name, why in error.violations.items())
    fail(
        REFUSED,
        f"{code.name}: {error.message}{lines}",
        _HINTS.get(code, "").format(data=folder),
    )


def as_dict(message: Message) -> dict[str, Any]:
    """The proto JSON form with the proto's field names; fields at their default value are
    printed too, so every reply of a kind has the same keys."""
    return MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def emit_json(value: Message | list[Message] | dict[str, Any]) -> None:
    if isinstance(value, Message):
        value = as_dict(value)
    elif isinstance(value, list):
        value = {"items": [as_dict(m) for m in value]}
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def show(message: Reply, as_json: bool, render: Callable[[Reply], Any], *, code: int = OK) -> int:
    """Print ``message`` (a proto reply) as JSON or as ``render`` draws it for people."""
    if as_json:
        assert isinstance(message, Message)
        emit_json(message)
    else:
        drawn = render(message)
        if drawn is not None:
            out.print(drawn)
    return code


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """``TASK_STATUS_FAILED`` as ``FAILED``."""
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def when(stamp: Timestamp | None) -> str:
    if stamp is None or (stamp.seconds == 0 and stamp.nanos == 0):
        return ""
    return stamp.ToDatetime(tzinfo=UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def moment(value: datetime | None) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S") if value else ""


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d+)([smhd])")


def duration_seconds(text: str) -> int:
    """``90s``, ``15m``, ``12h``, ``30d`` (or a number of seconds) in seconds."""
    if text.isdigit():
        return int(text)
    found = _DURATION.fullmatch(text.strip())
    if found is None or int(found.group(1)) == 0:
        raise typer.BadParameter(f"not a duration: {text!r} (say 90s, 15m, 12h or 30d)")
    return int(found.group(1)) * _UNITS[found.group(2)]


def since(text: str) -> datetime:
    """``--since``: a duration back from now (``15m``, ``2h``) or an ISO time."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return datetime.now(UTC) - timedelta(seconds=duration_seconds(text))
    return moment if moment.tzinfo else moment.astimezone()


def actor() -> str:
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"
