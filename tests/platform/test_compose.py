"""compose.yaml stays consistent with the settings the services actually read."""

from pathlib import Path

import yaml
from dispo.libs import settings_doc
from dispo.libs.settings import ServerSettings
from dispo.libs.stack.stack import SERVICES

COMPOSE = Path(__file__).resolve().parents[2] / "compose.yaml"


def known_variables() -> set[str]:
    names = set()
    for cls in settings_doc.settings_classes():
        prefix = cls.model_config.get("env_prefix", "")
        if not prefix:
            continue
        names |= {f"{prefix}{field}".upper() for field in cls.model_fields}
    for service in SERVICES:
        names |= {f"DISPO_{service}_{field}".upper() for field in ServerSettings.model_fields}
    return names


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_every_service_is_configured_with_known_variables():
    services = compose()["services"]
    known = known_variables()
    for name in SERVICES:
        env = services[name]["environment"]
        unknown = {key for key in env if key.startswith("DISPO_")} - known
        assert not unknown, f"{name} sets variables no settings class reads: {unknown}"
        assert {"DISPO_DATABASE_URL", "DISPO_NATS_URL"} <= set(env)
        assert services[name]["command"] == ["python", "-m", f"dispo.{name}"]
        port = env[f"DISPO_{name.upper()}_PORT"]
        assert all(mapping.endswith(f":{port}") for mapping in services[name].get("ports", []))


def test_nats_is_a_three_node_jetstream_cluster_used_with_three_replicas():
    services = compose()["services"]
    nodes = [name for name in services if name.startswith("nats-")]
    assert len(nodes) == 3
    for node in nodes:
        command = services[node]["command"]
        assert "-js" in command and "--cluster" in command
        routes = command[command.index("--routes") + 1]
        assert {f"nats://{other}:6222" for other in nodes if other != node} == set(
            routes.split(",")
        )
    env = services["gateway"]["environment"]
    assert env["DISPO_NATS_URL"].split(",") == [f"nats://{n}:4222" for n in nodes]
    assert env["DISPO_STREAM_REPLICAS"] == "3"


def test_executor_runs_several_replicas():
    assert compose()["services"]["executor"]["deploy"]["replicas"] >= 2


def test_unknown_variable_would_be_caught():
    assert "DISPO_GATEWAY_PORT" in known_variables()
    assert "DISPO_GATEWAY_PROT" not in known_variables()
