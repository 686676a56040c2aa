"""Throw-away PKI for the local control plane: a CA, the API server's serving cert, the
service-account signing key. Everything is written into the rig's private work directory.

Not for production: keys are unencrypted and valid for a day.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    kubelet_client_cert: Path
    """The API server's client certificate towards kubelets (``kubectl logs``, exec)."""
    kubelet_client_key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def issue(
    *,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    common_name: str,
    dns_names: list[str],
    ips: list[str],
    days: int = 1,
    client: bool = False,
    organization: str = "",
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A serving certificate signed by ``ca_key`` for the given names (with ``client``, a
    client certificate whose subject is ``common_name`` in group ``organization``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        subject.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    usage = x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH if client else None
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name(subject))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([usage or x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def new_ca(
    common_name: str, *, days: int = 1
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
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
        .sign(key, hashes.SHA256())
    )
    return cert, key


def write(directory: Path, *, extra_ips: list[str] | None = None) -> Pki:
    """Create the rig's CA, API serving cert (for loopback and ``extra_ips``: the rig's own
    link and the ``kubernetes`` Service address when it has real nodes), the SA key and the
    API server's kubelet client certificate under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = new_ca("nodewright-rig-ca")
    cert, key = issue(
        ca_cert=ca_cert,
        ca_key=ca_key,
        common_name="kube-apiserver",
        dns_names=[
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ],
        ips=["127.0.0.1", *(extra_ips or [])],
    )
    client_cert, client_key = issue(
        ca_cert=ca_cert,
        ca_key=ca_key,
        common_name="kube-apiserver-kubelet-client",
        organization="system:masters",
        dns_names=[],
        ips=[],
        client=True,
    )
    sa_key = ec.generate_private_key(ec.SECP256R1())
    pki = Pki(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt",
        serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key",
        sa_pub=directory / "sa.pub",
        kubelet_client_cert=directory / "kubelet-client.crt",
        kubelet_client_key=directory / "kubelet-client.key",
    )
    pki.kubelet_client_cert.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    pki.kubelet_client_key.write_bytes(_key_pem(client_key))
    pki.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.ca_key.write_bytes(_key_pem(ca_key))
    pki.serving_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.serving_key.write_bytes(_key_pem(key))
    # kube-apiserver reads SEC1 ("EC PRIVATE KEY") signing keys and public keys in PEM.
    pki.sa_key.write_bytes(
        sa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    pki.sa_pub.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for path in (pki.ca_key, pki.serving_key, pki.sa_key, pki.kubelet_client_key):
        path.chmod(0o600)
    return pki
