"""The settings reference, docs/settings.md: its table, generated from the settings classes.

Each row is one ``DISPO_*`` variable: its name (the class's env prefix and the field), its
default and its meaning (the field's ``description``)::

    python -m dispo.libs.settings_doc           # rewrite the table in docs/settings.md
    python -m dispo.libs.settings_doc --check   # exit 1 when docs/settings.md is not what it writes

A test fails when docs/settings.md differs from what this writes.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispo.libs.settings import DEFAULT_PORTS, ServerSettings
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

BEGIN = "<!-- configuration table: written by `python -m dispo.libs.settings_doc`, do not edit -->"
END = "<!-- end of configuration table -->"
DOC = Path(__file__).resolve().parent.parent / "docs" / "settings.md"

# Every settings class, in the order of the table, as "module:Class". ServerSettings is
# not here: each service reads it under its own prefix (one row per field, for all).
SETTINGS = (
    "dispo.libs.settings:CommonSettings",
    "dispo.libs.settings:TLSSettings",
    "dispo.libs.settings:StreamSettings",
    "dispo.tools.stack.logs:LogSettings",
    "dispo.libs.business_policy:PolicySettings",
    "dispo.libs.retention:RetentionSettings",
    "dispo.console.settings:ConsoleSettings",
    "dispo.libs.catalogue:CatalogueSettings",
    "dispo.libs.business_policy:PolicySettings",
    "dispo.gateway.settings:GatewaySettings",
    "dispo.executor.settings:ExecutorSettings",
    "dispo.reconciler.settings:ReconcilerSettings",
    "dispo.reconciler.drift:DriftSettings",
    "dispo.intelligence.settings:IntelligenceSettings",
    "dispo.pool.settings:PoolSettings",
    "dispo.pool.settings:WorkerSettings",
)


@dataclass(frozen=True)
class Row:
    variable: str
    default: str
    meaning: str


def settings_classes() -> list[type[BaseSettings]]:
    classes = []
    for spec in SETTINGS:
        module, name = spec.split(":")
        classes.append(getattr(importlib.import_module(module), name))
    return classes


def env_name(cls: type[BaseSettings], field: str) -> str:
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()


def show_default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined:
        return "computed" if info.default_factory is not None else "required"
    value: Any = info.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value == "":
        return "empty"
    return f"`{value}`"


def _meaning(info: FieldInfo) -> str:
    return (info.description or "").replace("|", "\\|")


def server_rows() -> list[Row]:
    """``DISPO_<SERVICE>_HOST`` and the rest: one row per field for every service."""
    ports = ", ".join(f"{port} ({name})" for name, port in DEFAULT_PORTS.items())
    return [
        Row(
            f"DISPO_<SERVICE>_{name.upper()}",
            ports if name == "port" else show_default(info),
            _meaning(info),
        )
        for name, info in ServerSettings.model_fields.items()
    ]


def class_rows(cls: type[BaseSettings]) -> list[Row]:
    return [
        Row(env_name(cls, name), show_default(info), _meaning(info))
        for name, info in cls.model_fields.items()
    ]


def rows() -> list[Row]:
    """The common settings, the per-service server settings, then each class's."""
    common, *others = settings_classes()
    return [*class_rows(common), *server_rows(), *(r for cls in others for r in class_rows(cls))]


def table() -> str:
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{r.variable}` | {r.default} | {r.meaning} |" for r in rows()]
    return "\n".join(lines)


def render(doc: str) -> str:
    """``doc`` with the text between the markers replaced by the table."""
    head, found, rest = doc.partition(BEGIN)
    if not found or END not in rest:
        raise ValueError(f"no {BEGIN!r} … {END!r} markers")
    return f"{head}{BEGIN}\n{table()}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check, write nothing")
    parser.add_argument("--file", type=Path, default=DOC, help="the page holding the table")
    args = parser.parse_args(argv)
    current = args.file.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print(
                f"{args.file}: configuration table is stale; run python -m dispo.libs.settings_doc"
            )
            return 1
        return 0
    if current != wanted:
        args.file.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
