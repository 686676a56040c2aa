"""The webhook's certificate bundle and what is known about it, without ``cryptography``.

A :class:`CertBundle` is the PEM CA and serving certificate with their keys, as the
validator keeps them in a Secret. Its :class:`CertFacts` (expiry, host names) are written
next to it when it is issued, tied to the certificates by their digest, so a validator that
loads a described bundle decides whether to renew it without parsing X.509.

Making a certificate, or reading the facts of a chain nobody described, needs
``cryptography`` (:mod:`services.validator.pki`), which adds about 10 MB to a process that
imports it and never gives them back. :func:`issue` and :func:`describe` run it in a
short-lived child process instead (``python -m services.validator.pki``), so the validator
stays the size of the other services (issue 15). Keeping the chain in a Secret and serving
it are not this module's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sys
from datetime import datetime, timedelta
from typing import Final

import msgspec

_CHILD_TIMEOUT_S: Final = 60.0
"""Generous: the child imports ``cryptography`` and makes two EC keys, well under a second
on a loaded node; a child that takes a minute is stuck, not slow."""


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

    def is_described(self) -> bool:
        """Its facts are about these certificates (not missing, not another chain's)."""
        return self.facts is not None and self.facts.digest == digest(self)

    def described(self) -> CertFacts:
        """The bundle's facts; a bundle read from a Secret without them (or with facts
        about another chain, a hand edit) must first go through :func:`describe`."""
        if self.facts is None or not self.is_described():
            raise ValueError(
                "the webhook certificate bundle carries no facts about its own certificates:"
                " describe it first (services.validator.certs.describe)"
            )
        return self.facts

    def expires(self) -> datetime:
        return self.described().expires

    def covers(self, hosts: tuple[str, ...]) -> bool:
        """The serving certificate names every one of ``hosts``."""
        return set(hosts) <= set(self.described().hosts)


def digest(bundle: CertBundle) -> str:
    """What facts are tied to: the SHA-256 of the CA and serving certificates."""
    return hashlib.sha256(bundle.ca_cert + b"\0" + bundle.cert).hexdigest()


class IssueRequest(msgspec.Struct, frozen=True, kw_only=True, tag="issue"):
    """Make a serving certificate for :attr:`hosts`, signed by :attr:`ca`'s CA or a new one."""

    hosts: tuple[str, ...]
    now: datetime
    validity_s: float
    ca: CertBundle | None = None


class DescribeRequest(msgspec.Struct, frozen=True, kw_only=True, tag="describe"):
    """Read the facts of :attr:`bundle`'s certificates."""

    bundle: CertBundle


Request = IssueRequest | DescribeRequest


class CertificateError(RuntimeError):
    """The child process that makes or reads certificates failed; says how."""


async def issue(
    hosts: tuple[str, ...], *, now: datetime, validity: timedelta, ca: CertBundle | None = None
) -> CertBundle:
    """A described serving certificate for ``hosts`` (see :func:`services.validator.pki.issue`),
    made in a child process."""
    request = IssueRequest(hosts=hosts, now=now, validity_s=validity.total_seconds(), ca=ca)
    return msgspec.json.decode(await _in_child(request), type=CertBundle)


async def describe(bundle: CertBundle) -> CertBundle:
    """``bundle`` with the facts read from its certificates, in a child process; as it is
    when already described."""
    if bundle.is_described():
        return bundle
    answer = await _in_child(DescribeRequest(bundle=bundle))
    facts = msgspec.json.decode(answer, type=CertFacts)
    return msgspec.structs.replace(bundle, facts=facts)


async def _in_child(request: Request) -> bytes:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "services.validator.pki",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(
            child.communicate(msgspec.json.encode(request)), _CHILD_TIMEOUT_S
        )
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
        raise CertificateError(
            f"the certificate child process ({sys.executable} -m services.validator.pki)"
            f" did not answer within {_CHILD_TIMEOUT_S:.0f} s; the next pass tries again"
        ) from None
    if child.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise CertificateError(
            f"the certificate child process ({sys.executable} -m services.validator.pki)"
            f" exited {child.returncode}: {lines[-1] if lines else 'no message'}"
        )
    return out
