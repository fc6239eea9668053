"""Whose signatures a command accepts, and whether it demands one (docs/trust.md, "Signed releases").

Trust anchors are PEM files the user names: a public key (EC P-256/P-384/P-521) trusts what that
key signed; a certificate trusts the signing certificates that chain up to it (a root CA: an
identity, shown as the leaf's subject). They come from the user's own files only:

- ``signing.trust`` in ``$ZOO_HOME/config.yaml``: trusted for every source;
- ``trust`` of a remote in the user's ``remotes.json`` (`zoo remote add NAME URL --trust FILE`):
  trusted for what is pulled from that remote. A version already in the local zoo, or in a
  bundle, remembers no remote, so there every anchor the user configured anywhere counts.

A project's ``.zoo/config.yaml`` comes with a cloned repository, so it may only narrow:
``signing.require: true`` there is honoured; its ``trust`` entries, ``key`` and ``certificate``
are ignored with a note, approved or not (an approval is about a run cache's options), so no
repository can make zoo accept its author's key.

Whether a signature is demanded (`Policy.require`): ``--require-signature``, the user's
``signing.require``, or a project's. Without it, a signed version is checked whenever any anchor
applies (and refused if its signature fails: other content, an untrusted signer); an unsigned
one passes, as does a signed one where no anchor is configured (nothing to check it against).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    from zoo.registry.config import RemoteConfig

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


@dataclass(frozen=True)
class SigningSettings:
    """The user's ``signing:`` section, paths resolved (zoo.registry.zoo_config)."""

    key: Path | None = None
    certificate: Path | None = None
    certificate_chain: tuple[Path, ...] = ()
    require: bool = False
    trust: tuple[Path, ...] = ()
    origin: str | None = None


def user_settings() -> SigningSettings:
    """The ``signing:`` section of ``$ZOO_HOME/config.yaml`` (empty when there is none)."""
    from zoo.registry import zoo_config

    path = zoo_config.user_config()
    if not path.is_file():
        return SigningSettings()
    section = zoo_config.parse(path, zoo_config.read_bytes(path)).get("signing") or {}

    def p(v: str | None) -> Path | None:
        return zoo_config.resolve_path(v, path) if v else None

    return SigningSettings(key=p(section.get("key")), certificate=p(section.get("certificate")),
                           certificate_chain=tuple(zoo_config.resolve_path(v, path) for v in section.get("certificate_chain", [])),
                           require=bool(section.get("require", False)),
                           trust=tuple(zoo_config.resolve_path(v, path) for v in section.get("trust", [])), origin=str(path))


def project_require(start: Path | None) -> tuple[bool, list[str]]:
    """(whether the nearest project config demands signatures, notes on what of its ``signing:`` was ignored)."""
    from zoo.registry import zoo_config

    path = zoo_config.project_config(Path(start or Path.cwd()).resolve())
    if path is None:
        return False, []
    section = zoo_config.parse(path, zoo_config.read_bytes(path)).get("signing") or {}
    ignored = sorted(k for k in section if k != "require")
    notes = [f"{path}: signing.{', signing.'.join(ignored)} ignored: a project's config may only demand signatures "
             "(signing.require), never choose whose to trust or which key signs; trust keys in your own "
             "$ZOO_HOME/config.yaml or with `zoo remote add NAME URL --trust FILE`"] if ignored else []
    return bool(section.get("require", False)), notes


@dataclass
class Policy:
    """What a command accepts: these anchors; `require` a signature or not; `notes` to print."""

    anchors: list[Anchor] = field(default_factory=list)
    require: bool = False
    notes: list[str] = field(default_factory=list)
    why_required: str = ""

    @property
    def active(self) -> bool:
        """Whether signatures are checked at all (something is trusted, or one is demanded)."""
        return self.require or bool(self.anchors)


def policy(remotes: "list[RemoteConfig]", *, require: bool = False, project_start: Path | None = None) -> Policy:
    """The policy for a version from `remotes` (one: a pull's source; every configured one: a local
    version or a bundle): the user's global anchors and those remotes' own, deduplicated by
    fingerprint; `require` from the flag, the user's config or the project's."""
    user = user_settings()
    proj_require, notes = project_require(project_start)
    why = "--require-signature" if require else (f"signing.require in {user.origin}" if user.require else "")
    if not why and proj_require:
        from zoo.registry import zoo_config

        why = f"signing.require in {zoo_config.project_config(Path(project_start or Path.cwd()).resolve())}"
    anchors: dict[str, Anchor] = {}
    for path in user.trust:
        a = load_anchor(path, f"signing.trust in {user.origin}")
        anchors.setdefault(a.fingerprint, a)
    for r in remotes:
        for path in r.trust:
            a = load_anchor(path, f"trust of remote {r.name}")
            anchors.setdefault(a.fingerprint, a)
    return Policy(list(anchors.values()), bool(why), notes, why)


def all_remotes(zoo_root: Path) -> "list[RemoteConfig]":
    """Every named remote the zoo at `zoo_root` sees (their anchors count for a local version or a bundle)."""
    from zoo.registry.config import RemotesConfig

    return RemotesConfig(zoo_root).list()
