"""Transport security of every gRPC server and channel Dispo opens (docs/security.md, ADR-0042).

Each process is configured by its ``DISPO_TLS_*`` settings
(:class:`dispo.libs.settings.TLSSettings`):

- :class:`ServerTLS`: a server given a certificate and its key listens for TLS only (no
  plaintext port); with ``client_auth`` it also requires a client certificate signed by the
  CA file (mTLS). :func:`dispo.libs.grpcserver.create_server` applies it.
- :class:`ClientTLS`: a client given a CA file opens TLS channels only, verifying the server's
  certificate against it, and presents its own certificate when it has one.
  :mod:`dispo.libs.auth.channel` applies it to every channel.

Without these settings servers and channels are plaintext. ``dispo up --tls`` makes a local
CA and certificates (:class:`LocalCertificates`, made by :mod:`dispo.tools.stack.certificates`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read TLS file {path}: {error.strerror}") from None


@dataclass(frozen=True)
class ServerTLS:
    """A server's certificate (PEM, its chain after it) and key; with ``client_auth``, the
    CA file (PEM) its callers' certificates must chain to."""

    cert_file: str
    key_file: str
    ca_file: str = ""
    client_auth: bool = False

    def __post_init__(self) -> None:
        if not (self.cert_file and self.key_file):
            raise ValueError("a TLS server needs both DISPO_TLS_CERT_FILE and DISPO_TLS_KEY_FILE")
        if self.client_auth and not self.ca_file:
            raise ValueError(
                "DISPO_TLS_CLIENT_AUTH needs DISPO_TLS_CA_FILE: the CA client certificates"
                " must be signed by"
            )

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(_read(self.key_file), _read(self.cert_file))],
            root_certificates=_read(self.ca_file) if self.client_auth else None,
            require_client_auth=self.client_auth,
        )


@dataclass(frozen=True)
class ClientTLS:
    """The CA file (PEM) a client verifies servers against, and the certificate and key it
    presents to a server that requires one. Without a CA file: plaintext
    (:data:`PLAINTEXT`)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError(
                "a client certificate needs both DISPO_TLS_CLIENT_CERT_FILE and"
                " DISPO_TLS_CLIENT_KEY_FILE"
            )
        if self.cert_file and not self.ca_file:
            raise ValueError("a client certificate is sent over TLS only: set DISPO_TLS_CA_FILE")

    @property
    def enabled(self) -> bool:
        return bool(self.ca_file)

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file) if self.key_file else None,
            certificate_chain=_read(self.cert_file) if self.cert_file else None,
        )


PLAINTEXT = ClientTLS()


@dataclass(frozen=True)
class LocalCertificates:
    """The files of a local CA and the certificates it signed, in one folder."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def ca_key_file(self) -> Path:
        return self.folder / "ca.key"

    @property
    def cert_file(self) -> Path:
        return self.folder / "server.pem"

    @property
    def key_file(self) -> Path:
        return self.folder / "server.key"

    @property
    def client_cert_file(self) -> Path:
        return self.folder / "client.pem"

    @property
    def client_key_file(self) -> Path:
        return self.folder / "client.key"

    def env(self) -> dict[str, str]:
        """The settings that hand these files to a process (server and client alike)."""
        return {
            "DISPO_TLS_CERT_FILE": str(self.cert_file),
            "DISPO_TLS_KEY_FILE": str(self.key_file),
            "DISPO_TLS_CA_FILE": str(self.ca_file),
            "DISPO_TLS_CLIENT_CERT_FILE": str(self.client_cert_file),
            "DISPO_TLS_CLIENT_KEY_FILE": str(self.client_key_file),
        }

    def client(self) -> ClientTLS:
        return ClientTLS(str(self.ca_file), str(self.client_cert_file), str(self.client_key_file))


__all__ = ["PLAINTEXT", "ClientTLS", "LocalCertificates", "ServerTLS"]
