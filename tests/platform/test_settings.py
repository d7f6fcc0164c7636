"""The settings classes: documented in docs/settings.md by a generator, durations in seconds,
every setting read by some code, and the policies built from them taking their defaults
from one place."""

import importlib
import pkgutil
import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from dispo.executor.runner import ExecutorConfig
from dispo.executor.settings import ExecutorSettings
from dispo.gateway.expand import Limits
from dispo.gateway.settings import GatewaySettings
from dispo.intelligence.runtime import RecoveryPolicy
from dispo.intelligence.settings import IntelligenceSettings
from dispo.libs import settings_doc
from dispo.libs.settings import CommonSettings, ServerSettings
from dispo.pool.domain import PoolPolicy
from dispo.pool.settings import PoolSettings
from dispo.tools.stack.stack import SERVICES
from pydantic import ValidationError
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [
    "dispo.libs",
    "dispo.sdk",
    "dispo.tools",
    "dispo.auth",
    *(f"dispo.{s}" for s in SERVICES),
    "dispo.console",
]


def every_settings_class() -> set[type[BaseSettings]]:
    found: set[type[BaseSettings]] = set()
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        for module in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            if module.name.endswith("__main__") or any(
                part in module.name for part in (".migrations", ".api.", ".cli")
            ):
                continue
            found |= {
                value
                for value in vars(importlib.import_module(module.name)).values()
                if isinstance(value, type)
                and issubclass(value, BaseSettings)
                and value.__module__.startswith("dispo.")
            }
    return found


def test_the_settings_page_table_is_what_the_generator_writes():
    page = ROOT / "docs" / "settings.md"
    assert settings_doc.DOC == page
    assert settings_doc.render(page.read_text()) == page.read_text(), (
        "docs/settings.md's configuration table is stale: run python -m dispo.libs.settings_doc"
    )
    assert settings_doc.main(["--check"]) == 0


def test_the_generator_rewrites_a_stale_table(tmp_path):
    stale = tmp_path / "settings.md"
    stale.write_text(
        f"# x\n\n{settings_doc.BEGIN}\n| `DISPO_GONE` | 1 | old |\n{settings_doc.END}\nafter\n"
    )
    assert settings_doc.main(["--check", "--file", str(stale)]) == 1
    assert settings_doc.main(["--file", str(stale)]) == 0
    text = stale.read_text()
    assert "DISPO_GONE" not in text and text.endswith(f"{settings_doc.END}\nafter\n")
    assert "| `DISPO_EXECUTOR_LEASE_TTL_SECONDS` | `5` | How long a pass holds" in text
    assert "| `DISPO_CATALOGUE` | empty | Cell catalogue file" in text
    assert "| `DISPO_<SERVICE>_PORT` | 50051 (gateway), 50052 (executor)" in text


def test_the_generator_lists_every_settings_class_and_every_field_is_described():
    classes = set(settings_doc.settings_classes())
    assert every_settings_class() - {ServerSettings} == classes
    for cls in [*classes, ServerSettings]:
        for name, info in cls.model_fields.items():
            assert info.description, f"{cls.__name__}.{name} has no description"


DURATION_WORDS = re.compile(
    r"_(ttl|interval|timeout|delay|wait|window|cooldown|grace|ms|millis|minutes|hours)$"
)


def test_every_duration_setting_is_in_seconds_and_named_so():
    for cls in [*settings_doc.settings_classes(), ServerSettings]:
        for name in cls.model_fields:
            assert not DURATION_WORDS.search(name), f"{cls.__name__}.{name}: end it in _seconds"


def source_files() -> list[Path]:
    dirs = [ROOT / "libs", ROOT / "sdk", ROOT / "tools", ROOT / "services"]
    return [
        p
        for d in dirs
        for p in d.rglob("*.py")
        if "migrations" not in p.parts and "api" not in p.parts
    ]


def test_every_setting_is_read_by_some_code():
    code = "\n".join(p.read_text() for p in source_files())
    for cls in [*settings_doc.settings_classes(), ServerSettings]:
        for name in cls.model_fields:
            assert re.search(rf"\.{name}\b", code), f"{cls.__name__}.{name} is read by nothing"


def test_policies_from_default_settings_are_the_domain_defaults():
    assert GatewaySettings().limits() == Limits()
    assert replace(ExecutorSettings().config(), instance="x") == ExecutorConfig(instance="x")
    assert PoolSettings().policy() == PoolPolicy()
    assert IntelligenceSettings().recovery_policy() == RecoveryPolicy()


def test_policies_follow_the_environment(monkeypatch):
    monkeypatch.setenv("DISPO_GATEWAY_MAX_NODES", "7")
    monkeypatch.setenv("DISPO_EXECUTOR_LEASE_TTL_SECONDS", "1.5")
    monkeypatch.setenv("DISPO_EXECUTOR_RETRY_MAX_DELAY_SECONDS", "0.2")
    monkeypatch.setenv("DISPO_EXECUTOR_BREAKER_COOLDOWN_SECONDS", "0.5")
    monkeypatch.setenv("DISPO_POOL_STUCK_SECONDS", "5")
    monkeypatch.setenv("DISPO_INTELLIGENCE_QUEUED_IDLE_SECONDS", "3")
    assert GatewaySettings().limits().max_nodes == 7
    config = ExecutorSettings().config()
    assert (config.lease_ttl, config.retry.max_delay, config.breaker_cooldown) == (1.5, 0.2, 0.5)
    assert PoolSettings().policy().stuck_after == timedelta(seconds=5)
    assert IntelligenceSettings().recovery_policy().queued_idle == timedelta(seconds=3)


def test_the_log_level_takes_a_level_name_in_any_case(monkeypatch):
    monkeypatch.setenv("DISPO_LOG_LEVEL", "warning")
    assert CommonSettings().log_level == "WARNING"
    monkeypatch.setenv("DISPO_LOG_LEVEL", "LOUD")
    with pytest.raises(ValidationError, match="'LOUD' is not one of DEBUG, INFO, WARNING"):
        CommonSettings()
    monkeypatch.delenv("DISPO_LOG_LEVEL")
    assert CommonSettings().log_level == "INFO"


def known_variables() -> set[str]:
    names = {
        settings_doc.env_name(cls, field)
        for cls in settings_doc.settings_classes()
        for field in cls.model_fields
    }
    return names | {f"DISPO_{s}_{f}".upper() for s in SERVICES for f in ServerSettings.model_fields}


@pytest.mark.parametrize(
    "where",
    ["README.md", "compose.yaml", "docs", "tests", "libs", "sdk", "tools", "services", ".ci"],
)
def test_every_variable_named_anywhere_is_one_a_setting_reads(where):
    """A renamed or removed setting leaves no stale name in docs, compose, stack or tests
    (decision records keep the names of their time)."""
    path = ROOT / where
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    known = known_variables()
    for file in files:
        if file.suffix not in {".md", ".py", ".yaml", ".yml", ""} or {"api", "adr"} & set(
            file.parts
        ):
            continue
        for name in re.findall(r"\bDISPO_[A-Z0-9_]*[A-Z0-9]\b", file.read_text(errors="ignore")):
            assert name in known or name in {"DISPO_GATEWAY_PROT", "DISPO_GONE"}, f"{file}: {name}"
