"""The business policy: what each business is granted, from one YAML file every service reads
(``DISPO_BUSINESS_POLICY``; none: the defaults below): how long a business's finished tasks
are kept (ADR-0105) and its weight in the executor's fair share (ADR-0109). The terms of a
business are one :class:`Terms`, so a later term (a limit) is one more field of it, read the
same way::

    default:
      retention_days: 30
      weight: 1
    businesses:
      ecommerce:
        retention_days: 90     # the terms it does not name are the default's
      trust-safety:
        weight: 4

A business's terms are the default's with its own entries over them. A file that does not
parse, names an unknown term or gives a bad value stops the service at its start, naming
where (``businesses.ecommerce.retention_days: …``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_RETENTION_DAYS = 30


class PolicySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DISPO_", extra="ignore")

    business_policy: str = Field(
        default="",
        description="Business policy file (YAML): `default:` terms and per-business"
        " overrides under `businesses:`: `retention_days` (docs/retention.md), `weight`"
        " (docs/fairness.md); empty: every business keeps its finished tasks 30 days and"
        " has weight 1. Give every service the same file",
    )


class PolicyError(ValueError):
    """The policy file is not one: the message names the entry."""


@dataclass(frozen=True)
class Terms:
    """What a business is granted."""

    # Days a finished task (and everything every service keeps about it) is kept.
    retention_days: int = DEFAULT_RETENTION_DAYS
    # Its share of the executor's passes and of each downstream's slots, relative to the
    # other businesses waiting for them (weighted round-robin).
    weight: int = 1

    @property
    def retention(self) -> timedelta:
        return timedelta(days=self.retention_days)


TERMS = {f.name for f in dataclasses.fields(Terms)}


@dataclass(frozen=True)
class BusinessPolicy:
    default: Terms = Terms()
    businesses: Mapping[str, Terms] = field(default_factory=dict)

    def terms(self, business: str) -> Terms:
        return self.businesses.get(business, self.default)

    def weight(self, business: str) -> int:
        return self.terms(business).weight

    @property
    def longest_retention(self) -> timedelta:
        """The longest any business keeps its tasks: what a row whose business is not
        known is kept."""
        return max(t.retention for t in [self.default, *self.businesses.values()])

    def cutoffs(self, businesses: Iterable[str], now: datetime) -> dict[str, datetime]:
        """For each of ``businesses``, the moment before which its finished tasks are past
        their retention at ``now``; ``""`` (a row whose business is not recorded) takes the
        longest retention."""
        return {
            b: now - (self.terms(b).retention if b else self.longest_retention) for b in businesses
        }


def parse_policy(data: Any) -> BusinessPolicy:
    if data is None:
        return BusinessPolicy()
    if not isinstance(data, dict):
        raise PolicyError("the policy must be a mapping with `default` and `businesses`")
    unknown = set(data) - {"default", "businesses"}
    if unknown:
        raise PolicyError(f"{sorted(unknown)[0]}: unknown entry (`default` or `businesses`)")
    default = _terms(data.get("default") or {}, Terms(), "default")
    given = data.get("businesses") or {}
    if not isinstance(given, dict):
        raise PolicyError("businesses: must map a business name to its terms")
    businesses = {
        str(name): _terms(terms or {}, default, f"businesses.{name}")
        for name, terms in given.items()
    }
    return BusinessPolicy(default, businesses)


def _terms(data: Any, base: Terms, where: str) -> Terms:
    if not isinstance(data, dict):
        raise PolicyError(f"{where}: must map terms to values, e.g. `retention_days: 30`")
    for name, value in data.items():
        if name not in TERMS:
            raise PolicyError(f"{where}.{name}: unknown term (one of {', '.join(sorted(TERMS))})")
        if name == "retention_days" and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise PolicyError(f"{where}.{name}: must be a whole number of days ≥ 1, got {value!r}")
        if name == "weight" and (
            isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000
        ):
            raise PolicyError(f"{where}.{name}: must be a whole number 1..1000, got {value!r}")
    return dataclasses.replace(base, **data)


def load_policy(path: str | Path = "") -> BusinessPolicy:
    """The policy in ``path``; the defaults when ``path`` is empty."""
    if path == "":
        return BusinessPolicy()
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise PolicyError(f"the business policy {path} cannot be read: {error}") from error
    try:
        return parse_policy(data)
    except PolicyError as error:
        raise PolicyError(f"{path}: {error}") from None


def load_configured_policy(settings: PolicySettings | None = None) -> BusinessPolicy:
    """The policy ``DISPO_BUSINESS_POLICY`` names (the defaults when unset)."""
    return load_policy((settings or PolicySettings()).business_policy)
