"""compose.yaml stays consistent with the settings the services actually read, and with the
security model: each service's own database role, bus user and service token, every secret
from the env file `compose_env generate` makes (none in the file), and the init container
that applies them from the same variables."""

import re
from pathlib import Path

import yaml
from dispo.auth.signing import KEY_ENV, SIGNING_KEY_HOLDERS
from dispo.libs import settings_doc
from dispo.libs.auth.lookup import token_by_hash
from dispo.libs.auth.tokens import Kind, secret_hash
from dispo.libs.db.driver import Database
from dispo.libs.db.roles import role_name
from dispo.libs.settings import CommonSettings, ServerSettings
from dispo.tools.stack import compose_env
from dispo.tools.stack.nats_auth import USERS
from dispo.tools.stack.stack import SERVICES

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


# A variable compose must be given: ``${NAME:?why}`` (compose refuses to start without it).
REQUIRED = re.compile(r"\$\{([A-Z0-9_]+):\?[^}]+\}")
ANY_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)")


def variable(value: str) -> str:
    """The one required variable ``value`` consists of."""
    found = REQUIRED.fullmatch(value)
    assert found, f"{value!r} is not a required variable"
    return found.group(1)


def setting(name: str) -> str:
    """The environment name of a CommonSettings field (a name the services read)."""
    assert name in CommonSettings.model_fields
    return f"{CommonSettings.model_config.get('env_prefix', '')}{name}".upper()


def test_no_secret_is_in_the_file_each_comes_from_the_generated_env_file():
    lines = COMPOSE.read_text().splitlines()
    text = "\n".join(line for line in lines if not line.lstrip().startswith("#"))
    required = set(REQUIRED.findall(text))
    assert set(ANY_VARIABLE.findall(text)) == required, "a variable with a default"
    # every variable the file needs is made by `generate`, and it makes nothing unused
    assert required == set(compose_env.generate())
    for url in re.findall(r"postgresql://[^\s\"']+", text):
        assert re.match(r"postgresql://\w+:\$\{\w+:\?", url), f"a literal password: {url}"
    assert compose()["services"]["postgres"]["environment"]["POSTGRES_PASSWORD"] == (
        "${POSTGRES_PASSWORD:?" + text.split("${POSTGRES_PASSWORD:?")[1].split("}")[0] + "}"
    )


def test_each_service_has_its_own_role_bus_user_and_token_from_the_names_the_settings_read():
    services = compose()["services"]
    init = services["dispo-init"]["environment"]
    # the signing key is the gateway's and the reconciler's alone: not the init container's
    signing_key = compose()["x-signing-key"]
    assert variable(signing_key) == compose_env.SIGNING_KEY
    assert compose_env.SIGNING_KEY not in init and KEY_ENV not in init
    database, user, password, token = (
        setting(n) for n in ("database_url", "nats_user", "nats_password", "service_token")
    )
    assert setting("signing_key") == KEY_ENV
    for name in SERVICES:
        env = services[name]["environment"]
        role, secret = re.fullmatch(r"postgresql://(\w+):(\$\{[^}]+\})@.*", env[database]).groups()
        assert role == role_name(name) and variable(secret) == compose_env.db_password(name)
        # the init container makes the role with the very URL the service logs in with
        assert env[database] == init[f"DISPO_{name.upper()}_DATABASE_URL"]
        assert env[user] == name
        assert variable(env[password]) == compose_env.nats_password(name)
        # and stores the hash of the very token the service sends
        assert variable(env[token]) == compose_env.service_token(name)
        assert init[compose_env.service_token(name)] == env[token]
        assert (KEY_ENV in env) == (name in SIGNING_KEY_HOLDERS), name
        if KEY_ENV in env:
            assert env[KEY_ENV] == signing_key
        assert services[name]["depends_on"]["dispo-init"] == {
            "condition": "service_completed_successfully"
        }
    assert variable(init[compose_env.ADMIN_TOKEN]) == compose_env.ADMIN_TOKEN


def test_the_bus_nodes_take_the_users_the_init_container_writes():
    services = compose()["services"]
    init = services["dispo-init"]
    assert init["command"] == ["python", "-m", "dispo.tools.stack.compose_env", "init"]
    auth_file = init["environment"][compose_env.NATS_AUTH_FILE_ENV]
    auth_block = compose_env.nats_authorization()
    for node in (n for n in services if n.startswith("nats-")):
        spec = services[node]
        command = spec["command"]
        assert command[command.index("-c") + 1] == auth_file
        volume = next(v for v in spec["volumes"] if v.split(":")[1] == str(Path(auth_file).parent))
        assert volume.split(":")[0] in {v.split(":")[0] for v in init["volumes"]}
        # every user's password, under the name the authorization block reads
        assert set(spec["environment"]) == {compose_env.nats_password(u) for u in USERS}
        for key, value in spec["environment"].items():
            assert variable(value) == key and f"${key}" in auth_block


async def test_init_stores_the_tokens_once_as_the_gateways_role(role_url):
    values = compose_env.generate()
    gateway = role_url("gateway")
    assert await compose_env.store_tokens(gateway, values) == 1 + len(SERVICES)
    assert await compose_env.store_tokens(gateway, values) == 0  # idempotent
    db = await Database.open(gateway, "auth", size=1)
    try:
        async with db.connection() as conn:
            admin = await token_by_hash(conn, secret_hash(values[compose_env.ADMIN_TOKEN]))
            pool = await token_by_hash(conn, secret_hash(values[compose_env.service_token("pool")]))
    finally:
        await db.close()
    assert admin is not None and admin.kind is Kind.ADMIN
    assert pool is not None and (pool.kind, pool.service) == (Kind.SERVICE, "pool")
