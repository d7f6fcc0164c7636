"""The local CA ``dispo up --tls`` makes, and the certificates it signs: one for the servers
(naming the stack's hosts), one the clients present (mTLS). Kept in the data folder, owner-only,
and made again only when missing, near their end, or (the server's) not naming a host
the stack now serves on.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from dispo.libs.private_files import write_private
from dispo.libs.tls import LocalCertificates

CA_DAYS = 3650
LEAF_DAYS = 397
# A certificate closer than this to its end is made again on start (the CA's too).
RENEW_BEFORE = datetime.timedelta(days=30)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_private(path, pem.decode())


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    write_private(path, cert.public_bytes(serialization.Encoding.PEM).decode())


def _load(
    cert_path: Path, key_path: Path
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None:
    """The certificate and key kept there, if both are and the certificate is not near its end."""
    if not (cert_path.exists() and key_path.exists()):
        return None
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if (
        not isinstance(key, ec.EllipticCurvePrivateKey)
        or cert.not_valid_after_utc - RENEW_BEFORE < _now()
    ):
        return None
    cert_path.chmod(0o600)
    key_path.chmod(0o600)
    return cert, key


def _san(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _covers(cert: x509.Certificate, hosts: Sequence[str]) -> bool:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(_san(hosts)) <= set(san)


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
    *,
    days: int,
    usage: x509.ObjectIdentifier | None = None,
    hosts: Sequence[str] = (),
) -> x509.Certificate:
    """A certificate for ``key``: the CA's own (``issuer`` None) or a leaf it signs."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = _now()
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()),
            critical=False,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san(hosts)), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def local_certificates(folder: Path, hosts: Sequence[str]) -> LocalCertificates:
    """A local CA and the certificates it signed in ``folder`` (0700, every file 0600): made
    where missing, kept otherwise. The server certificate names ``hosts`` (IP addresses and
    DNS names); it is made again when it does not name all of them, and any certificate
    within :data:`RENEW_BEFORE` of its end is made again (a new CA re-signs both)."""
    files = LocalCertificates(folder)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    folder.chmod(0o700)
    ca = _load(files.ca_file, files.ca_key_file)
    renewed = ca is None
    if ca is None:
        ca_key = _new_key()
        ca = (_issue("Dispo local CA", ca_key, None, days=CA_DAYS), ca_key)
        _write_key(files.ca_key_file, ca_key)
        _write_cert(files.ca_file, ca[0])
    server = None if renewed else _load(files.cert_file, files.key_file)
    if server is None or not _covers(server[0], hosts):
        key = _new_key()
        cert = _issue(
            "dispo", key, ca, days=LEAF_DAYS, usage=ExtendedKeyUsageOID.SERVER_AUTH, hosts=hosts
        )
        _write_key(files.key_file, key)
        _write_cert(files.cert_file, cert)
    if renewed or _load(files.client_cert_file, files.client_key_file) is None:
        key = _new_key()
        cert = _issue(
            "dispo client", key, ca, days=LEAF_DAYS, usage=ExtendedKeyUsageOID.CLIENT_AUTH
        )
        _write_key(files.client_key_file, key)
        _write_cert(files.client_cert_file, cert)
    return files


__all__ = ["local_certificates"]
