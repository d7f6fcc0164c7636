"""The downstream registry: the ``downstreams`` section of the catalogue file."""

from __future__ import annotations

from pathlib import Path

import yaml
from dispo.executor.actions import Downstream


def parse_downstreams(data: dict) -> dict[str, Downstream]:
    out: dict[str, Downstream] = {}
    for name, raw in (data.get("downstreams") or {}).items():
        raw = raw or {}
        if not raw.get("base_url"):
            raise ValueError(f"downstreams.{name}.base_url is required")
        out[name] = Downstream(
            name=name,
            base_url=str(raw["base_url"]),
            timeout_ms=int(raw.get("timeout_ms", 5000)),
            max_concurrency=int(raw.get("max_concurrency", 16)),
            health_url=str(raw.get("health_url", "")),
        )
    return out


def load_downstreams(path: str | Path) -> dict[str, Downstream]:
    return parse_downstreams(yaml.safe_load(Path(path).read_text()) or {})
