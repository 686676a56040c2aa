"""The webhook's certificate bundle and what is known about it, without ``cryptography``.

A :class:`CertBundle` is the PEM CA and serving certificate with their keys, as the
validator keeps them in a Secret. Its :class:`CertFacts` (expiry, host names) are written
next to it when it is issued, tied to the certificates by their digest, so a validator that
loads a described bundle decides whether to renew it without parsing X.509
(:mod:`services.validator.pki` does, when the facts are missing or do not match).
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import msgspec


class CertFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What a chain says, for the certificates with this :attr:`digest`."""

    digest: str
    expires: datetime
    """The earlier of the serving certificate's and the CA's ``notAfter``."""
    ca_expires: datetime
    hosts: tuple[str, ...]
    """The serving certificate's DNS names and IP addresses."""


class CertBundle(msgspec.Struct, frozen=True, kw_only=True):
    """PEM-encoded CA and serving certificate with their keys."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    facts: CertFacts | None = None

    def described(self) -> CertFacts:
        """The bundle's facts: as written with it when they are about these certificates,
        else read from them (loads ``cryptography``)."""
        if self.facts is not None and self.facts.digest == digest(self):
            return self.facts
        from services.validator import pki

        return pki.facts_of(self)

    def expires(self) -> datetime:
        return self.described().expires

    def covers(self, hosts: tuple[str, ...]) -> bool:
        """The serving certificate names every one of ``hosts``."""
        return set(hosts) <= set(self.described().hosts)


def digest(bundle: CertBundle) -> str:
    """What facts are tied to: the SHA-256 of the CA and serving certificates."""
    return hashlib.sha256(bundle.ca_cert + b"\0" + bundle.cert).hexdigest()
