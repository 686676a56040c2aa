"""The webhook's certificates: issuing a self-signed CA and serving certificate, and reading
what a PEM chain says (when it expires, which hosts it names), with ``cryptography``.

The validator never imports it: ``cryptography`` adds about 10 MB to a process for good,
so the validator runs this module as a short-lived child (``python -m
services.validator.pki``, :func:`main`: one :class:`~services.validator.certs.Request` as
JSON on stdin, the bundle or facts as JSON on stdout; :mod:`services.validator.certs`).
Keeping the chain in a Secret, serving it and registering the webhook are not this
module's job.
"""

from __future__ import annotations

import ipaddress
import sys
from datetime import datetime, timedelta
from typing import Final

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.validator.certs import CertBundle, CertFacts, IssueRequest, Request, digest

_CA_VALIDITY: Final = timedelta(days=3650)
# Clocks of the API server and the webhook may disagree a little.
_BACKDATE: Final = timedelta(minutes=5)


def facts_of(bundle: CertBundle) -> CertFacts:
    """What ``bundle``'s chain says, read from the certificates themselves."""
    cert = x509.load_pem_x509_certificate(bundle.cert)
    ca = x509.load_pem_x509_certificate(bundle.ca_cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    hosts = [*sans.get_values_for_type(x509.DNSName)]
    hosts += [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    return CertFacts(
        digest=digest(bundle),
        expires=min(cert.not_valid_after_utc, ca.not_valid_after_utc),
        ca_expires=ca.not_valid_after_utc,
        hosts=tuple(hosts),
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _new_ca(now: datetime) -> CertBundle:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nodewright-validator-ca")])
    ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + _CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .add_extension(ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return CertBundle(
        ca_cert=ca_cert.public_bytes(serialization.Encoding.PEM),
        ca_key=_key_pem(ca_key),
        cert=b"",
        key=b"",
    )


def issue(
    hosts: tuple[str, ...], *, now: datetime, validity: timedelta, ca: CertBundle | None = None
) -> CertBundle:
    """A serving certificate for ``hosts`` signed by ``ca``'s CA, or by a new CA when None;
    described (:attr:`CertBundle.facts`), so no reader needs this module."""
    if ca is None:
        ca = _new_ca(now)
    signer = serialization.load_pem_private_key(ca.ca_key, password=None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    issuer = x509.load_pem_x509_certificate(ca.ca_cert)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(min(now + validity, issuer.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )
    bundle = CertBundle(
        ca_cert=ca.ca_cert,
        ca_key=ca.ca_key,
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=_key_pem(key),
    )
    return CertBundle(
        ca_cert=bundle.ca_cert,
        ca_key=bundle.ca_key,
        cert=bundle.cert,
        key=bundle.key,
        facts=facts_of(bundle),
    )


def main() -> int:
    """Answer the one request on stdin (see the module's docstring)."""
    try:
        request = msgspec.json.decode(sys.stdin.buffer.read(), type=Request)
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        print(f"bad certificate request on stdin: {exc}", file=sys.stderr)
        return 2
    answer: CertBundle | CertFacts
    if isinstance(request, IssueRequest):
        answer = issue(
            request.hosts,
            now=request.now,
            validity=timedelta(seconds=request.validity_s),
            ca=request.ca,
        )
    else:
        answer = facts_of(request.bundle)
    sys.stdout.buffer.write(msgspec.json.encode(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
