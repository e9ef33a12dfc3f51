"""Test-only PKI, made at test time with ``cryptography``: a CA, a server certificate for 127.0.0.1/localhost,
client certificates, and a second, unrelated CA with its own client (the "wrong CA" case). Nothing is stored.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    # Unencrypted PKCS#8: what Kafka's PEM keystore reads (Go and OpenSSL read it too).
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    return path


def _builder(subject: str, issuer: x509.Name, public_key, days: int = 2) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days)))


class CertificateAuthority:
    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
        folder.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        cert = (_builder(f"infersight test CA {name}", _name(f"infersight test CA {name}"), self.key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(self.key, hashes.SHA256()))
        self.cert = cert
        self.cert_path = folder / f"{name}-ca.pem"
        self.cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, subject: str, server: bool, cert_path: Path | None = None, key_path: Path | None = None) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = _builder(subject, self.cert.subject, key.public_key())
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = (builder.add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .sign(self.key, hashes.SHA256()))
        cert_path = cert_path or self.folder / f"{self.name}-{subject}.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return Issued(cert_path, _write_key(key, key_path or self.folder / f"{self.name}-{subject}-key.pem"))


@dataclass(frozen=True)
class Pki:
    tls_dir: Path  # the layout INFERSIGHT_TLS_DIR expects: ca.pem, server.pem, server-key.pem, client-ca.pem
    ca: Path
    client: Issued  # signed by the CA the gateways trust for clients
    rogue_client: Issued  # signed by another CA
    rogue_ca: Path


def make_pki(root: Path, mutual: bool = True) -> Pki:
    """A TLS dir for ``INFERSIGHT_TLS_DIR`` (one CA signs the server and the good client), plus a rogue CA."""
    tls_dir = root / "tls"
    tls_dir.mkdir(parents=True)
    ca = CertificateAuthority(root / "pki", "good")
    (tls_dir / "ca.pem").write_bytes(ca.cert_path.read_bytes())
    ca.issue("server", server=True, cert_path=tls_dir / "server.pem", key_path=tls_dir / "server-key.pem")
    if mutual:
        (tls_dir / "client-ca.pem").write_bytes(ca.cert_path.read_bytes())
    client = ca.issue("pod", server=False)
    rogue = CertificateAuthority(root / "pki", "rogue")
    return Pki(tls_dir, tls_dir / "ca.pem", client, rogue.issue("pod", server=False), rogue.cert_path)
