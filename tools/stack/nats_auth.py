"""The bus's users: one per service, allowed what the contracts say it publishes and
consumes, and ``admin`` for operators' tools; anonymous clients are refused (ADR-0037).

    users = NatsUsers.kept(data_dir / "nats" / "users.json")  # made on first start, 0600
    server = NatsServer(data_dir / "nats", users=users)      # its configuration carries them
    env = users.env("executor")                             # DISPO_NATS_USER / _PASSWORD

Each service's permissions are derived from :data:`dispo.libs.contracts.FLOWS`:

- publish: the subjects it publishes and those it alone consumes (its quarantine replays
  them); on the JetStream API, the info and creation of the streams it uses and the update
  of those it publishes to; the info, creation and next-message requests of consumers of
  the streams it consumes, and the deletion of consumers of a stream whose messages it reads
  back (a flow's ``readers``: :meth:`dispo.libs.bus.Bus.read_subject` deletes the ephemeral
  consumer of each read after it), and the acknowledgements of their messages; the creation
  of the declared durables of a stream it publishes to but does not consume (ADR-0092);
- subscribe: its own replies (``_INBOX.<service>.>``) and the plain NATS subjects it consumes.

``python -m dispo.tools.stack.nats_auth`` prints that ``authorization`` block for an external
server or cluster, each password read from the server's environment
(``$NATS_PASSWORD_<USER>``).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispo.libs import contracts
from dispo.libs.bus import BusCredentials, inbox_prefix
from dispo.libs.private_files import kept_secrets

ADMIN = "admin"
# Every user of the bus: one per service that publishes or consumes, and the operators'.
USERS = (*contracts.BUS_SERVICES, ADMIN)


def permissions(service: str) -> dict[str, dict[str, list[str]]]:
    """The publish and subscribe allow-lists of ``service``'s bus user."""
    publish = list(contracts.publishes(service))
    subscribe = [f"{inbox_prefix(service)}.>"]
    subscribe += [flow.subject for flow in contracts.consumes(service) if flow.stream is None]
    owned = {
        flow.stream.name
        for flow in contracts.FLOWS
        if flow.stream is not None and service in flow.publishers
    }
    consumed = {flow.stream.name for flow in contracts.consumes(service) if flow.stream}
    for stream in contracts.streams_of(service):
        name = stream.name
        publish += [f"$JS.API.STREAM.INFO.{name}", f"$JS.API.STREAM.CREATE.{name}"]
        if name in owned:
            publish.append(f"$JS.API.STREAM.UPDATE.{name}")
        if name not in consumed:  # it makes the stream's declared durables (ADR-0092)
            publish += [f"$JS.API.CONSUMER.CREATE.{name}.{d.name}" for d in stream.durables]
        if name in consumed:
            publish += [
                f"$JS.API.CONSUMER.INFO.{name}.*",
                f"$JS.API.CONSUMER.CREATE.{name}.>",
                f"$JS.API.CONSUMER.MSG.NEXT.{name}.*",
                f"$JS.ACK.{name}.>",
            ]
    # A reader deletes the ephemeral consumer of each read after it (Bus.read_subject).
    publish += sorted(
        {
            f"$JS.API.CONSUMER.DELETE.{flow.stream.name}.*"
            for flow in contracts.FLOWS
            if flow.stream is not None and service in flow.readers
        }
    )
    # A purger removes an erased task's messages from the stream (Bus.purge_subject).
    publish += sorted(
        {
            f"$JS.API.STREAM.PURGE.{flow.stream.name}"
            for flow in contracts.FLOWS
            if flow.stream is not None and service in flow.purgers
        }
    )
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


@dataclass(frozen=True)
class Variable:
    """A value nats-server reads from its environment (``$NAME`` in its configuration)."""

    name: str


def server_config(passwords: Mapping[str, str | Variable], extra: str = "") -> str:
    """nats-server's configuration: ``extra`` lines, then the ``authorization`` block of
    every user in ``passwords`` (``admin`` unrestricted, each service with its
    :func:`permissions`). A user not listed cannot connect, nor can an anonymous client."""
    users: list[dict[str, Any]] = []
    for user, password in passwords.items():
        entry: dict[str, Any] = {"user": user, "password": password}
        if user != ADMIN:
            entry["permissions"] = permissions(user)
        users.append(entry)
    block = _render({"users": users})
    return f"{extra.rstrip()}\nauthorization: {block}\n".lstrip()


def _render(value: Any, indent: str = "") -> str:
    """``value`` in nats-server's configuration syntax (JSON, but for environment values)."""
    inner = indent + "  "
    if isinstance(value, Variable):
        return f"${value.name}"
    if isinstance(value, dict):
        lines = [f"{inner}{key}: {_render(item, inner)}" for key, item in value.items()]
        return "{\n" + "\n".join(lines) + f"\n{indent}}}"
    if isinstance(value, list):
        lines = [f"{inner}{_render(item, inner)}" for item in value]
        return "[\n" + "\n".join(lines) + f"\n{indent}]"
    return json.dumps(value)


@dataclass(frozen=True)
class NatsUsers:
    """The users of one embedded bus and their passwords, kept in ``path``."""

    path: Path
    passwords: Mapping[str, str]

    @classmethod
    def kept(cls, path: Path) -> NatsUsers:
        """The users kept in ``path`` (JSON, owner-only), written on first use with a random
        password each; a user added since (a new service) gets one, the others keep theirs.
        Delete the file while the stack is stopped to give every user a new password."""
        path = Path(path)
        kept = kept_secrets(path, USERS, lambda: secrets.token_hex(24))
        return cls(path, {user: kept[user] for user in USERS})

    def credentials(self, user: str) -> BusCredentials:
        return BusCredentials(user=user, password=self.passwords[user])

    def env(self, user: str) -> dict[str, str]:
        """The settings that make a process connect as ``user`` (and as nothing else)."""
        return {
            "DISPO_NATS_USER": user,
            "DISPO_NATS_PASSWORD": self.passwords[user],
            "DISPO_NATS_TOKEN": "",
            "DISPO_NATS_CREDS_FILE": "",
            "DISPO_NATS_NKEY_SEED_FILE": "",
        }

    def config(self, extra: str = "") -> str:
        return server_config(self.passwords, extra)


def main() -> None:
    print(server_config({user: Variable(f"NATS_PASSWORD_{user.upper()}") for user in USERS}))


if __name__ == "__main__":
    main()
