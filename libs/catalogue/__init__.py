"""The cell catalogue, one YAML file read by every service that needs it.

The gateway owns it (it validates submissions against ``cells`` and expands them); the
executor calls the ``downstreams`` its actions name; the reconciler probes those
downstreams and arbitrates the ``conflict`` each cell declares. All three read the same
file, named by one setting, ``DISPO_CATALOGUE``; unset, they read the content governance
example shipped inside this package (:data:`EXAMPLE`)::

    from dispo.libs.catalogue import load_configured_catalogue
    catalogue = load_configured_catalogue()
"""

from __future__ import annotations

from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml
from dispo.libs.catalogue.model import (
    ACTION_KINDS,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_WORKER_TIMEOUT_MS,
    FIELD_TYPES,
    MAX_OUTPUT_BYTES,
    ON_TIMEOUT,
    QUEUE_PATTERN,
    ActionDef,
    BusinessLimit,
    Catalogue,
    CatalogueError,
    CellDef,
    Conflict,
    Downstream,
    FieldSpec,
    Queue,
    declared_problem,
    default_max_effect_seconds,
    parse_catalogue,
    topological,
)
from dispo.libs.settings import DEMO_DOWNSTREAM_ORIGIN, local_address
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "ACTION_KINDS",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_WORKER_TIMEOUT_MS",
    "MAX_OUTPUT_BYTES",
    "QUEUE_PATTERN",
    "ON_TIMEOUT",
    "EXAMPLE",
    "FIELD_TYPES",
    "ActionDef",
    "BusinessLimit",
    "Catalogue",
    "CatalogueError",
    "CatalogueSettings",
    "CellDef",
    "Conflict",
    "Downstream",
    "FieldSpec",
    "Queue",
    "declared_problem",
    "default_max_effect_seconds",
    "catalogue_document",
    "load_catalogue",
    "configured_document",
    "load_configured_catalogue",
    "parse_catalogue",
    "example_calling",
    "topological",
]

# The shipped example (content governance), package data of this package: it is there
# in an editable checkout and in an installed wheel alike.
EXAMPLE: Traversable = files(__name__) / "content_governance.yaml"


class CatalogueSettings(BaseSettings):
    """Which catalogue the gateway, the executor and the reconciler read, and how they
    follow its versions."""

    model_config = SettingsConfigDict(env_prefix="DISPO_", extra="ignore")

    catalogue: str = Field(
        default="",
        description="Cell catalogue file (YAML) read by gateway, executor and reconciler;"
        " empty: the shipped content governance example. Since ADR-0111 it seeds the"
        " catalogue's first version when the gateway finds none; the versions recorded"
        " through CatalogueService follow it",
    )
    catalogue_check_interval_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How often gateways, executors and reconcilers check for a newer catalogue"
        " version than the one they hold (ADR-0111)",
    )
    catalogue_gateway_address: str = Field(
        default=local_address("gateway"),
        description="Where the executor and the reconciler ask for the catalogue's versions"
        " (a gateway's gRPC address)",
    )


def catalogue_document(path: str | Path | Traversable = "") -> dict[str, Any]:
    """The mapping the catalogue file ``path`` holds (the shipped example when ``path`` is
    empty), unchecked: what :func:`parse_catalogue` reads, and what the gateway records as
    the catalogue's first version (ADR-0111)."""
    source = EXAMPLE if path == "" else path
    if isinstance(source, str):
        source = Path(source)
    data = yaml.safe_load(source.read_text()) or {}
    if not isinstance(data, dict):
        raise CatalogueError("the catalogue file must hold a mapping (cells, downstreams, ...)")
    return data


def load_catalogue(path: str | Path | Traversable = "") -> Catalogue:
    """The catalogue in ``path``; the shipped example when ``path`` is empty."""
    return parse_catalogue(catalogue_document(path))


def example_calling(origin: str) -> str:
    """The example catalogue's text with its downstreams at ``origin`` (``http://host:port``)
    instead of the demo downstream's default address (``dispo up --demo-port``)."""
    return EXAMPLE.read_text().replace(DEMO_DOWNSTREAM_ORIGIN, origin)


def configured_document(settings: CatalogueSettings | None = None) -> dict[str, Any]:
    """The mapping of the file ``DISPO_CATALOGUE`` names (the example when unset)."""
    return catalogue_document((settings or CatalogueSettings()).catalogue)


def load_configured_catalogue(settings: CatalogueSettings | None = None) -> Catalogue:
    """The catalogue ``DISPO_CATALOGUE`` names (the example when unset)."""
    return load_catalogue((settings or CatalogueSettings()).catalogue)
