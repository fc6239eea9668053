"""Trust anchors: the PEM files a user trusts signatures by (zoo.registry.trust says whose count where).

A public key (EC P-256/P-384/P-521) trusts what that key signed, by its fingerprint; a certificate
trusts the signing certificates that chain up to it (a root CA), shown by its subject. Reading
one needs `cryptography` (the `signing` extra).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from zoo.errors import InvalidInput

EXTRA = "signing"
MAX_ANCHOR_BYTES = 1 << 20


@dataclass(frozen=True)
class Anchor:
    """One trusted key or certificate: its file, kind, fingerprint (``sha256:…``) and, for a
    certificate, its subject."""

    path: str
    kind: Literal["key", "certificate"]
    fingerprint: str
    subject: str | None = None

    def describe(self) -> str:
        return f"{self.kind} {self.fingerprint}" + (f" ({self.subject})" if self.subject else "") + f" from {self.path}"


def missing_extra(what: str):
    from zoo.errors import MissingExtra

    return MissingExtra(f"{what} needs the `{EXTRA}` extra (model-signing), which is not installed",
                        hint=f"pip install 'zoo-onnx[{EXTRA}]'")


def key_fingerprint(public_key) -> str:
    """``sha256:`` + the hex sha256 of a public key's PEM SubjectPublicKeyInfo: the key hint a
    model_signing bundle carries, so a signature and a trusted key name one key alike."""
    from cryptography.hazmat.primitives import serialization

    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(pem).hexdigest()


def cert_fingerprint(cert) -> str:
    from cryptography.hazmat.primitives import hashes

    return "sha256:" + cert.fingerprint(hashes.SHA256()).hex()


def cert_identity(cert) -> str:
    """A certificate's subject, then its e-mail and URI alternative names: who it says it is."""
    from cryptography import x509

    names = [cert.subject.rfc4514_string()]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names += san.get_values_for_type(x509.RFC822Name) + san.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        pass
    return ", ".join(n for n in names if n)


def load_anchor(path: str | Path, where: str = "trust") -> Anchor:
    """The anchor in the PEM file at `path` (absolute); InvalidInput naming `where` when the file is
    unreadable or holds neither a public key nor a certificate."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        raise missing_extra("a trusted key") from None
    p = Path(path).expanduser().resolve()
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_ANCHOR_BYTES + 1)
    except OSError as e:
        raise InvalidInput(f"{where}: cannot read {p} ({e.strerror})",
                           hint="name a PEM public key (e.g. release.pub) or a root certificate") from None
    if len(data) > MAX_ANCHOR_BYTES:
        raise InvalidInput(f"{where}: {p} is larger than {MAX_ANCHOR_BYTES} bytes: not a key or certificate")
    if b"PRIVATE KEY" in data:
        raise InvalidInput(f"{where}: {p} holds a private key; trust names the public half",
                           hint="openssl ec -in KEY -pubout -out KEY.pub")
    if b"-----BEGIN CERTIFICATE-----" in data:
        try:
            cert = x509.load_pem_x509_certificate(data)
        except ValueError as e:
            raise InvalidInput(f"{where}: {p} is not a readable PEM certificate ({e})") from None
        return Anchor(str(p), "certificate", cert_fingerprint(cert), cert_identity(cert))
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as e:
        raise InvalidInput(f"{where}: {p} is neither a PEM public key nor a certificate ({str(e)[:120]})",
                           hint="name a PEM public key (-----BEGIN PUBLIC KEY-----) or a root certificate") from None
    from cryptography.hazmat.primitives.asymmetric import ec

    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise InvalidInput(f"{where}: {p} is not an elliptic-curve key (model_signing signs with P-256, P-384 or P-521)")
    return Anchor(str(p), "key", key_fingerprint(key))
