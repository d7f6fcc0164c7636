"""Settings read from ``DISPO_*`` environment variables, with defaults for one machine.

Every process reads :class:`CommonSettings` (where PostgreSQL and NATS are). Each service
adds its own class with the prefix ``DISPO_<SERVICE>_`` built with :func:`service_settings_config`.

Conventions: every field has a ``description`` (docs/settings.md's table is
generated from them, ``python -m dispo.libs.settings_doc``); every duration is in seconds
and its name ends in ``_seconds``; a default that a domain policy also needs is written
once, in the policy, and the setting's default refers to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from dispo.libs.tls import ClientTLS, ServerTLS
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    # Imported where used: every process reads these settings, the CLI too, and it needs
    # neither the NATS client nor the HTTP client these bring.
    from dispo.libs.bus import BusCredentials
    from dispo.libs.egress import AllowList

# The demo downstream the example catalogue calls, as `dispo up` starts it by default: the
# one origin the embedded default lets callers' addresses name (``DISPO_EGRESS_ALLOW``).
DEMO_DOWNSTREAM_ORIGIN = "http://127.0.0.1:8181"

# Default gRPC ports of the five services on one machine.
DEFAULT_PORTS = {
    "gateway": 50051,
    "executor": 50052,
    "reconciler": 50053,
    "intelligence": 50054,
    "pool": 50055,
}


def local_address(service: str) -> str:
    """Where ``service`` listens on one machine by default (another service's default
    address of it)."""
    return f"127.0.0.1:{DEFAULT_PORTS[service]}"


# Default port of the web console (dispo.console) on one machine.
DEFAULT_CONSOLE_PORT = 8180

# Default metrics ports `dispo up` gives the services (DISPO_<SERVICE>_METRICS_PORT).
DEFAULT_METRICS_PORTS = {
    "gateway": 9151,
    "executor": 9152,
    "reconciler": 9153,
    "intelligence": 9154,
    "pool": 9155,
}


def service_settings_config(service: str) -> SettingsConfigDict:
    """Config for a service's own settings class: env prefix ``DISPO_<SERVICE>_``."""
    return SettingsConfigDict(env_prefix=f"DISPO_{service.upper()}_", extra="ignore")


# The levels DISPO_LOG_LEVEL takes, lowest first.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class CommonSettings(BaseSettings):
    """What every Dispo process needs to reach the shared infrastructure."""

    model_config = SettingsConfigDict(env_prefix="DISPO_", extra="ignore")

    database_url: str = Field(
        default="postgresql+asyncpg://postgres@127.0.0.1:5432/postgres",
        description="PostgreSQL URL (`postgresql://…` or `postgresql+asyncpg://…`);"
        " `dispo up` starts an embedded one unless this is set, and runs the database"
        " bootstrap with it (a role that may create roles and schemas, docs/security.md);"
        " a service uses it only without its own `DISPO_<SERVICE>_DATABASE_URL`",
    )
    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="NATS server URLs, comma-separated (several for a cluster);"
        " `dispo up` starts an embedded one unless this is set",
    )
    nats_user: str = Field(
        default="",
        description="This process's NATS user (with `DISPO_NATS_PASSWORD`); `dispo up` hands"
        " each service it starts its own, made on first start",
    )
    nats_password: str = Field(default="", description="Password of `DISPO_NATS_USER`")
    nats_token: str = Field(
        default="", description="NATS token, for a server that authenticates by token"
    )
    nats_creds_file: str = Field(
        default="",
        description="NATS credentials file (user JWT and NKey seed), for a server with"
        " decentralized (JWT) authentication",
    )
    nats_nkey_seed_file: str = Field(
        default="", description="File holding this process's NKey seed, for NKey authentication"
    )
    stream_replicas: int = Field(
        default=1, description="JetStream replicas per stream (3 on a three-node cluster)"
    )
    log_format: Literal["json", "console"] = Field(
        default="json", description="`json` for services, `console` for people at a terminal"
    )
    log_level: str = Field(
        default="INFO",
        description="Lowest level a process logs: `DEBUG`, `INFO`, `WARNING`, `ERROR` or"
        " `CRITICAL` (any case). Every service logs at `INFO` unless this says otherwise, also"
        " under `dispo up`, which passes it on to the services it starts (their lines in"
        " `<data dir>/logs/<service>.log`). At `INFO` a task is one line in each service it"
        " passes (accepted, settled, finished), besides what needs attention; `WARNING` keeps"
        " only what needs attention, `DEBUG` adds a line per step (a node's call, a pass, a"
        " delivery attempt) and per gRPC call that succeeded."
        " `dispo up`'s own lines"
        " and `dispo bench`'s, with the stack a benchmark starts, default to `WARNING`",
    )

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, level: str) -> str:
        if level.upper() not in LOG_LEVELS:
            raise ValueError(f"{level!r} is not one of {', '.join(LOG_LEVELS)}")
        return level.upper()

    clock: str = Field(
        default="system",
        description="`system`, or `file:<path>`: a clock driven by a file (tests of real processes)",
    )
    outbox_max_attempts: int = Field(
        default=8,
        ge=1,
        description="Failed publications of an outbox row (1 s apart, doubling to a minute)"
        " before the relay quarantines it: kept, marked, logged, and no longer in the way",
    )
    consumer_max_failures: int = Field(
        default=5,
        ge=1,
        description="Times a JetStream message may fail in a consumer (its handler raised)"
        " before it is moved to the service's quarantine; a refused message goes at once",
    )
    consumer_retry_base_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Redelivery delay after a message's first failure; doubles per failure",
    )
    consumer_retry_max_seconds: float = Field(
        default=30.0, gt=0, description="Longest redelivery delay between two failures"
    )
    uvloop: bool = Field(
        default=True,
        description="Run a service's event loop on uvloop (`false`: the standard asyncio loop)",
    )
    metrics_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How long a service serves the backlog and age gauges it read for a"
        " scrape before reading its tables again (however many scrapes arrive)",
    )
    data_dir: str = Field(
        default=".dispo",
        description="Where `dispo up` keeps PostgreSQL, NATS, logs and the pool's local crons",
    )
    egress_allow: str = Field(
        default=DEMO_DOWNSTREAM_ORIGIN,
        description="Where callers' addresses may point: the origins (`scheme://host[:port]`,"
        " `scheme://*.domain[:port]`, comma-separated) a task's `callback_url` and an"
        " evaluation's `target_url` may name; checked at submission and before each callback."
        " Default: the demo downstream only (`dispo up` puts in the one it starts)",
    )
    token: str = Field(
        default="",
        description="The API token the `dispo` CLI and the SDK send (`authorization: Bearer …`);"
        " the CLI's default is the admin token `dispo up` wrote in the data folder",
    )
    service_token: str = Field(
        default="",
        description="This process's service token, sent on its calls to other services"
        " (`dispo up` and the test fixtures hand it over; on a cluster, make one with"
        " `dispo tokens create --service <name>`)",
    )
    signing_key: str = Field(
        default="",
        description="The key webhook signing secrets are derived from (64 hex digits), held by"
        " the gateway (it makes a business's secret) and the reconciler (it signs callbacks)"
        " only; no default: `dispo up` makes one in the data folder (docs/security.md)",
    )
    auth_cache_seconds: float = Field(
        default=5.0,
        ge=0,
        description="How long a server trusts a token it has checked before reading the token"
        " store again: a revoked token is refused everywhere within this time, at once by the"
        " gateway (0: read it on every call)",
    )
    auth_refused_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        description="How long a server refuses an unknown, revoked or expired token again"
        " without reading the token store (0: read it on every try); the gateway forgets a"
        " refusal when it creates a token with that secret",
    )
    auth_failures_per_second: float = Field(
        default=5.0,
        ge=0,
        description="Reads of the token store that found no valid token, per second, a caller"
        " address may cause on one server, at most `DISPO_AUTH_FAILURE_BURST` at once; past"
        " it, a token not cached yet is refused with RESOURCE_EXHAUSTED before the database"
        " (tokens already checked still pass; 0: no limit)",
    )
    auth_failure_burst: int = Field(
        default=50,
        ge=1,
        description="Failed reads of the token store a caller address may cause at once (see"
        " `DISPO_AUTH_FAILURES_PER_SECOND`)",
    )
    otlp_endpoint: str = Field(
        default="",
        description="Base URL of an OTLP/HTTP receiver (`http://127.0.0.1:4318`) each service"
        " exports its trace spans to (`/v1/traces`); empty: no tracing",
    )
    cache_dir: str = Field(
        default="",
        description="Where programs installed on demand are kept (OpenClaw for the pool's"
        " openclaw driver; default: `dispo` under `XDG_CACHE_HOME`, else `~/.cache/dispo`)",
    )

    @property
    def egress(self) -> AllowList:
        """:attr:`egress_allow` parsed (ValueError naming a wrong entry)."""
        from dispo.libs.egress import AllowList

        return AllowList.parse(self.egress_allow)

    @property
    def nats_servers(self) -> list[str]:
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

    @property
    def nats_credentials(self) -> BusCredentials:
        from dispo.libs.bus import BusCredentials

        return BusCredentials(
            user=self.nats_user,
            password=self.nats_password,
            token=self.nats_token,
            creds_file=self.nats_creds_file,
            nkey_seed_file=self.nats_nkey_seed_file,
        )


GIB = 1024**3


class StreamSettings(BaseSettings):
    """How much each JetStream stream may hold (ADR-0092). Every process that ensures a stream
    brings it to these, so give every process the same values. A full stream refuses new
    messages (the publishers' outboxes keep them in PostgreSQL until there is room); it never
    drops one a consumer has not acknowledged. A limit below what a stream holds now is not
    applied until it holds less."""

    model_config = SettingsConfigDict(env_prefix="DISPO_STREAM_", extra="ignore")

    tasks_max_bytes: int = Field(
        default=8 * GIB,
        ge=0,
        description="Bytes the `TASKS` stream may hold (0: no limit). It keeps a message only"
        " until every consumer that must see it has acknowledged it, so this bounds the work"
        " not taken yet (about 1 KB a task): 8 GiB is hours of backlog at thousands of tasks"
        " a second",
    )
    status_max_bytes: int = Field(
        default=0,
        ge=0,
        description="Bytes the `TASK_STATUS` stream may hold (0: no limit). It keeps each"
        " status snapshot 7 days, the tasks' history (about 1.1 KB a snapshot, a few a task);"
        " a limit must hold 7 days at the stack's rate, or publishers wait for the oldest to"
        " expire",
    )
    callbacks_max_bytes: int = Field(
        default=GIB,
        ge=0,
        description="Bytes the `CALLBACKS` stream (completion notifications to callers' NATS"
        " subjects, kept 7 days) may hold (0: no limit)",
    )
    evaluations_max_bytes: int = Field(
        default=GIB,
        ge=0,
        description="Bytes the `EVALUATIONS` stream may hold (0: no limit). It keeps an event"
        " until the intelligence service has acknowledged it",
    )

    def max_bytes(self, stream: str) -> int:
        """The byte limit of the declared stream ``stream`` (0: none)."""
        return {
            "TASKS": self.tasks_max_bytes,
            "TASK_STATUS": self.status_max_bytes,
            "CALLBACKS": self.callbacks_max_bytes,
            "EVALUATIONS": self.evaluations_max_bytes,
        }.get(stream, 0)


class TLSSettings(BaseSettings):
    """Transport security of this process's gRPC server and channels (:mod:`dispo.libs.tls`);
    none set: plaintext."""

    model_config = SettingsConfigDict(env_prefix="DISPO_TLS_", extra="ignore")

    cert_file: str = Field(
        default="",
        description="This process's gRPC server certificate (PEM, its chain after it); with"
        " `DISPO_TLS_KEY_FILE` the server takes TLS only and refuses plaintext"
        " (`dispo up --tls` hands over the one it made)",
    )
    key_file: str = Field(default="", description="The private key of `DISPO_TLS_CERT_FILE` (PEM)")
    ca_file: str = Field(
        default="",
        description="CA certificates (PEM) this process's channels verify servers against; set:"
        " every channel it opens (CLI, SDK, service to service) uses TLS only. With"
        " `DISPO_TLS_CLIENT_AUTH` its server checks client certificates against them too",
    )
    client_auth: bool = Field(
        default=False,
        description="mTLS: the server refuses a client without a certificate signed by"
        " `DISPO_TLS_CA_FILE`",
    )
    client_cert_file: str = Field(
        default="",
        description="The certificate (PEM) this process's channels present to a server that"
        " requires one (mTLS)",
    )
    client_key_file: str = Field(
        default="", description="The private key of `DISPO_TLS_CLIENT_CERT_FILE` (PEM)"
    )

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> TLSSettings:
        """The settings ``environ`` holds (a child process's environment), not this process's."""
        prefix = str(cls.model_config.get("env_prefix", ""))
        values = {name: info.default for name, info in cls.model_fields.items()}
        values |= {n: environ[k] for n in values if (k := f"{prefix}{n}".upper()) in environ}
        return cls.model_validate(values)

    @property
    def server(self) -> ServerTLS | None:
        """The server's TLS, None for plaintext (ValueError for half a configuration)."""
        if not (self.cert_file or self.key_file):
            if self.client_auth:
                raise ValueError("DISPO_TLS_CLIENT_AUTH needs DISPO_TLS_CERT_FILE and _KEY_FILE")
            return None
        return ServerTLS(self.cert_file, self.key_file, self.ca_file, self.client_auth)

    @property
    def client(self) -> ClientTLS:
        return ClientTLS(self.ca_file, self.client_cert_file, self.client_key_file)


class ServerSettings(BaseSettings):
    """Where a service's gRPC server listens and how it logs in to PostgreSQL; subclass per
    service with its own prefix."""

    host: str = Field(default="127.0.0.1", description="Address the service's gRPC server binds")
    port: int = Field(default=0, description="Port of the service's gRPC server")
    shutdown_grace_seconds: float = Field(
        default=5.0, description="How long a stopping server lets in-flight calls finish"
    )
    metrics_port: int = Field(
        default=0,
        ge=0,
        description="Port of the service's Prometheus metrics endpoint (`/metrics`, on its"
        " host); 0: none. `dispo up` serves them on 9151 (gateway) to 9155 (pool), in the"
        " order of the gRPC ports (docs/metrics.md)",
    )
    database_url: str = Field(
        default="",
        description="The service's own PostgreSQL URL: its role (owner of its schema, no"
        " privilege on the others) and password; empty: `DISPO_DATABASE_URL` (`dispo up` hands"
        " each service its role, made with a password kept in the data folder)",
    )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def server_settings(service: str) -> ServerSettings:
    """The settings of ``service`` (``DISPO_<SERVICE>_HOST`` / ``_PORT`` /
    ``_SHUTDOWN_GRACE_SECONDS`` / ``_DATABASE_URL``)."""

    class _Settings(ServerSettings):
        model_config = service_settings_config(service)

    defaults = _Settings()
    if defaults.port == 0:
        defaults.port = DEFAULT_PORTS[service]
    return defaults
