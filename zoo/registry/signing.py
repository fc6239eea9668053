"""Signed releases: a version's signature made and checked with the OpenSSF `model_signing` library.

What is signed: a model_signing manifest named ``NAME@VERSION`` (`signed_digests`) whose
resources are

- every file of the zoo manifest (``manifest.all_files()``: each build's files, the card, the
  version-level ``zoo.lock`` and ``provenance.intoto.json``), by the sha256 the manifest records;
- ``zoo-manifest.json`` itself, as its canonical bytes (`zoo.registry.codec.dump_manifest`) with
  the publish time ``created`` left out, which differs between a local zoo and a remote one;
- every other attachment of the version (the bill of materials, ``bom.cdx.json``).

The resources are built from those digests rather than by hashing a folder, so a pull checks the
whole signature before it fetches a byte, and then only the build it needs: each fetched file is
held to its sha256 in the manifest, which the signature covers. The signature is the sigstore
bundle the library writes (a DSSE envelope over an in-toto statement, `attachments.SIGNATURE`),
made with an EC private key (P-256/P-384/P-521), or with one and its certificate and chain; never
Sigstore's online services (no Fulcio, no Rekor: nothing here needs the network). Anyone with the
library can check a release: the version's files, that canonical ``zoo-manifest.json`` and the
BOM in one folder are what ``model_signing verify key --signature … --public_key …`` expects
(docs/releases.md).

Checking (`verify`) follows a `zoo.registry.trust.Policy`: the signer must be a trusted key (its
``sha256:`` fingerprint, the bundle's key hint) or a certificate chaining to a trusted root, the
statement must name this version and list exactly the digests above. Any failure is a
`SignatureError` (exit 4) naming the version and why. The library is the `signing` extra,
imported only when a signature is made or checked.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.errors import Conflict, InvalidInput, SignatureError
from zoo.registry.attachments import SIGNATURE
from zoo.registry.manifest import MANIFEST_FILE, Manifest
from zoo.registry.anchors import Anchor, cert_fingerprint, cert_identity, missing_extra
from zoo.registry.trust import Policy

if TYPE_CHECKING:
    from zoo.registry.store import LocalZoo

HASH = "sha256"
TRUST_HINT = ("if you trust the signer, add its public key (or root certificate) to `signing.trust` in "
              "$ZOO_HOME/config.yaml, or to the remote: `zoo remote add NAME URL --trust FILE --replace`")


def canonical_manifest(manifest: Manifest) -> bytes:
    """The manifest's bytes as signed: the zoo's canonical encoding without the publish time."""
    from zoo.registry.codec import dump_manifest

    return dump_manifest(manifest.model_copy(update={"created": None}))


def signed_digests(manifest: Manifest, attachments: dict[str, bytes]) -> dict[str, str]:
    """Resource name -> sha256 of everything a signature of `manifest` covers (module docstring)."""
    out = {f.path: f.sha256 for f in manifest.all_files()}
    covered = {MANIFEST_FILE: canonical_manifest(manifest)} | {n: d for n, d in attachments.items() if n != SIGNATURE}
    for name, data in sorted(covered.items()):
        if name in out:  # a manifest that lists a file under the name of the manifest or an attachment
            raise SignatureError(f"{manifest.ref}: its manifest lists a file named {name}, which the signature "
                                 "covers as the version's own; refusing an ambiguous version",
                                 hint="rename that file in the release")
        out[name] = hashlib.sha256(data).hexdigest()
    return out


def _lib():
    """model_signing's modules (the `signing` extra)."""
    try:
        from model_signing import manifest as ms_manifest
        from model_signing._hashing import hashing as ms_hashing
        from model_signing._signing import sign_certificate, sign_ec_key, sign_sigstore_pb
        from model_signing._signing import signing as ms_signing
    except ImportError:
        raise missing_extra("signing or checking a signature") from None
    return ms_manifest, ms_hashing, ms_signing, sign_ec_key, sign_certificate, sign_sigstore_pb


def _library_manifest(ref: str, digests: dict[str, str]):
    from pathlib import PurePosixPath

    ms_manifest, ms_hashing, *_ = _lib()
    items = [ms_manifest.FileManifestItem(path=PurePosixPath(name), digest=ms_hashing.Digest(HASH, bytes.fromhex(d)))
             for name, d in sorted(digests.items())]
    # the library's folder serialization, so its own verify hashes a folder of these files the same
    # way; the signature file itself is left out of such a folder
    return ms_manifest.Manifest(ref, items, ms_manifest._FileSerialization(HASH, False, [SIGNATURE]))


# ---------------------------------------------------------------------------------------------
# signing


@dataclass(frozen=True)
class Signer:
    """A private key (PEM, EC) and, for a certificate signature, its certificate and chain."""

    key: Path
    certificate: Path | None = None
    chain: tuple[Path, ...] = ()

    def public_key(self):
        """The public half of the private key (cryptography's object)."""
        from cryptography.hazmat.primitives import serialization

        try:
            return serialization.load_pem_private_key(Path(self.key).read_bytes(), None).public_key()
        except OSError as e:
            raise InvalidInput(f"cannot read the signing key {self.key} ({e.strerror})") from None
        except (ValueError, TypeError) as e:
            raise InvalidInput(f"cannot sign with {self.key}: {str(e)[:200]}") from None

    def _library_signer(self):
        *_, sign_ec_key, sign_certificate, _ = _lib()
        try:
            if self.certificate is None:
                return sign_ec_key.Signer(Path(self.key))
            if self.chain:
                return sign_certificate.Signer(Path(self.key), Path(self.certificate), [Path(c) for c in self.chain])
            return _leaf_only_signer(sign_ec_key, sign_certificate, Path(self.key), Path(self.certificate))
        except OSError as e:
            raise InvalidInput(f"cannot read the signing key or certificate {e.filename or self.key} ({e.strerror})",
                               hint="--sign names a PEM EC private key (and --certificate its certificate)") from None
        except (ValueError, TypeError) as e:
            raise InvalidInput(f"cannot sign with {self.key}: {str(e)[:200]}",
                               hint="an unencrypted PEM EC private key (P-256, P-384 or P-521), and a certificate "
                                    "for that key; e.g. openssl ecparam -name prime256v1 -genkey -noout -out key.pem")


def _leaf_only_signer(sign_ec_key, sign_certificate, key: Path, certificate: Path):
    """model_signing's certificate signer for a leaf issued by the root itself (no intermediates):
    the library's own constructor cannot parse an empty chain (it loads b"" as PEM), so this does
    what it does with none."""
    from cryptography import x509

    signer = sign_certificate.Signer.__new__(sign_certificate.Signer)
    sign_ec_key.Signer.__init__(signer, key)
    signer._signing_certificate = x509.load_pem_x509_certificate(certificate.read_bytes())
    if signer._private_key.public_key() != signer._signing_certificate.public_key():
        raise ValueError("The public key from the certificate does not match the public key paired with the private key")
    signer._trust_chain = []
    return signer


def check_signer(signer: Signer) -> None:
    """InvalidInput (or MissingExtra) now when `signer` cannot sign, before a release runs anything."""
    signer._library_signer()


def sign(manifest: Manifest, attachments: dict[str, bytes], signer: Signer) -> bytes:
    """The signature (sigstore bundle JSON) of `manifest` with `attachments` (module docstring)."""
    _, _, ms_signing, *_ = _lib()
    library_signer = signer._library_signer()
    payload = ms_signing.Payload(_library_manifest(manifest.ref, signed_digests(manifest, attachments)))
    return library_signer.sign(payload).bundle.to_json().encode()


def sign_local(zoo: "LocalZoo", manifest: Manifest, signer: Signer) -> "Verdict":
    """Sign a version of the local zoo and store the signature as its attachment.

    A version already signed by this key over the same content keeps its signature (an ECDSA
    signature differs every time it is made, and attachments are immutable); one signed by
    another key or over other content is a Conflict.
    """
    attachments = zoo.attachments(manifest.name, manifest.version)
    data = sign(manifest, attachments, signer)
    mine = inspect(data)
    existing = attachments.get(SIGNATURE)
    if existing is not None:
        theirs = inspect(existing)
        if theirs.fingerprint != mine.fingerprint or not _content_matches(existing, manifest, attachments,
                                                                          signer.public_key()):
            raise Conflict(f"{manifest.ref} is already signed in the local zoo, by {theirs.describe()}",
                           hint="a version's signature is immutable like its files: bump the version")
        return Verdict(manifest.ref, signed=True, verified=True, method=mine.method, fingerprint=mine.fingerprint,
                       identity=mine.identity, notes=["already signed by this key: signature kept"])
    zoo.add_attachment(manifest.name, manifest.version, SIGNATURE, data)
    return Verdict(manifest.ref, signed=True, verified=True, method=mine.method, fingerprint=mine.fingerprint,
                   identity=mine.identity)


def _content_matches(signature: bytes, manifest: Manifest, attachments: dict[str, bytes], key) -> bool:
    """Whether `key` signed exactly this content in `signature`."""
    bundle = _parse(signature, manifest.ref)
    try:
        _, _, ms_signing, sign_ec_key, _, sign_sigstore_pb = _lib()
        from cryptography.hazmat.primitives.asymmetric import ec

        envelope = bundle.dsse_envelope
        key.verify(envelope.signatures[0].sig, sign_sigstore_pb.pae(envelope.payload),
                   ec.ECDSA(sign_ec_key.get_ec_key_hash(key)))
        signed = ms_signing.dsse_payload_to_manifest(json.loads(envelope.payload))
    except Exception:  # noqa: BLE001 - any failure means "not this content"
        return False
    return _digests(signed) == signed_digests(manifest, attachments)


# ---------------------------------------------------------------------------------------------
# reading and checking


@dataclass(frozen=True)
class SignerInfo:
    """Who a signature says made it: a key's fingerprint, or a certificate's (with its subject)."""

    method: str  # "key" | "certificate"
    fingerprint: str
    identity: str | None = None

    def describe(self) -> str:
        if self.method == "key":
            return f"key {self.fingerprint}"
        return f"certificate {self.identity} ({self.fingerprint})"


def _parse(data: bytes, ref: str):
    """The sigstore bundle in `data` (a stranger's bytes: any failure is a SignatureError)."""
    *_, sign_sigstore_pb = _lib()
    with tempfile.TemporaryDirectory(prefix="zoo-signature-") as d:
        path = Path(d) / SIGNATURE
        path.write_bytes(data)
        try:
            return sign_sigstore_pb.Signature.read(path).bundle
        except Exception as e:  # noqa: BLE001 - json, pydantic, KeyError, RecursionError: all "malformed"
            raise SignatureError(f"{ref}: its signature is not a readable sigstore bundle ({type(e).__name__}: "
                                 f"{_one_line(e)})", hint="the signature is damaged or was not written by zoo or "
                                                          "model_signing; nothing was installed") from None


def _one_line(e: BaseException, limit: int = 160) -> str:
    """An exception's text on one line, cut at `limit` (pydantic's and OpenSSL's span several)."""
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "…"


def _info(bundle, ref: str) -> SignerInfo:
    from cryptography import x509

    material = bundle.verification_material
    chain = getattr(material, "x509_certificate_chain", None)
    if chain is not None and chain.certificates:
        try:
            cert = x509.load_der_x509_certificate(chain.certificates[0].raw_bytes)
        except Exception as e:  # noqa: BLE001 - a stranger's bytes: ValueError, TypeError…
            raise SignatureError(f"{ref}: its signing certificate is unreadable ({_one_line(e)})",
                                 hint="the signature is damaged; nothing was installed") from None
        return SignerInfo("certificate", cert_fingerprint(cert), cert_identity(cert))
    public_key = getattr(material, "public_key", None)
    hint = getattr(public_key, "hint", None) if public_key is not None else None
    if not hint:
        raise SignatureError(f"{ref}: its signature names no key (an older model_signing format, or a Sigstore "
                             "keyless one, which zoo does not check offline)", hint="sign the version again with zoo")
    return SignerInfo("key", f"sha256:{hint}")


def inspect(data: bytes, ref: str = "the version") -> SignerInfo:
    """Who signed (nothing is checked: `zoo show` says who a signature claims)."""
    return _info(_parse(data, ref), ref)


def signature_summary(attachments: dict[str, bytes], ref: str) -> dict | None:
    """Who `attachments`' signature names (``method``, ``fingerprint``, ``identity``; ``problem`` when
    it cannot be read, e.g. without the `signing` extra); None for an unsigned version. Nothing is
    checked: `zoo show` says who a signature claims, `zoo verify` whether it holds."""
    data = attachments.get(SIGNATURE)
    if data is None:
        return None
    from zoo.errors import ZooError

    try:
        info = inspect(data, ref)
    except ZooError as e:
        return {"method": None, "fingerprint": None, "identity": None, "problem": e.message}
    return {"method": info.method, "fingerprint": info.fingerprint, "identity": info.identity, "problem": None}


def _digests(library_manifest) -> dict[str, str]:
    out = {}
    for rd in library_manifest.resource_descriptors():
        if rd.digest.algorithm != HASH:
            raise ValueError(f"resource {rd.identifier} is hashed with {rd.digest.algorithm}, not {HASH}")
        out[rd.identifier] = rd.digest.digest_hex
    return out


@dataclass
class Verdict:
    """What a check found: whether `ref` is signed, whether its signature was checked and holds,
    who signed it, and by which trusted anchor."""

    ref: str
    signed: bool
    verified: bool
    method: str | None = None
    fingerprint: str | None = None
    identity: str | None = None
    anchor: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if not self.signed:
            return "not signed"
        who = f"key {self.fingerprint}" if self.method == "key" else f"certificate {self.identity} ({self.fingerprint})"
        return f"signed by {who}" + (", verified" if self.verified else ", not checked (no trusted key configured)")


def verify(manifest: Manifest, attachments: dict[str, bytes], policy: Policy, where: str = "", *,
           always: bool = False, installing: bool = True) -> Verdict:
    """Check `manifest`'s signature (in `attachments`) against `policy`; SignatureError when it does not hold.

    `where` names the source for messages ("remote origin: ", "bundle models.tar: "). A signature
    is not checked where the policy trusts no key and demands none, unless `always` (`zoo verify`:
    then it is refused as signed by a key not trusted). A refusal's hint carries the policy's notes
    (a project config's trust that was ignored), which the command would otherwise not print;
    `installing`: the message says that nothing was installed (not for `zoo verify`).
    """
    try:
        return _verify(manifest, attachments, policy, where, always)
    except SignatureError as e:
        if not installing:
            e.message = e.message.replace("; nothing was installed", "")
            e.args = (e.message,)
        if policy.notes:
            e.hint = "; ".join([*([e.hint] if e.hint else []), *policy.notes])
        raise


def _verify(manifest: Manifest, attachments: dict[str, bytes], policy: Policy, where: str, always: bool) -> Verdict:
    ref = manifest.ref
    data = attachments.get(SIGNATURE)
    if data is None:
        if policy.require:
            raise SignatureError(f"{where}{ref} is not signed, and {policy.why_required} demands a signature; "
                                 "nothing was installed",
                                 hint="ask its publisher to release it with `zoo release … --sign KEY`, or pull "
                                      "without --require-signature if you accept unsigned versions")
        return Verdict(ref, signed=False, verified=False)
    if not policy.active and not always:
        return Verdict(ref, signed=True, verified=False, notes=[f"{ref} is signed, but you trust no key: not checked"])
    bundle = _parse(data, ref)
    info = _info(bundle, ref)
    *_, sign_ec_key, sign_certificate, sign_sigstore_pb = _lib()
    anchor: Anchor | None
    if info.method == "key":
        anchor = next((a for a in policy.anchors if a.kind == "key" and a.fingerprint == info.fingerprint), None)
        if anchor is None:
            raise SignatureError(f"{where}{ref} is signed by key {info.fingerprint}, which you do not trust; "
                                 "nothing was installed", hint=TRUST_HINT)
        verifier = sign_ec_key.Verifier(Path(anchor.path))
    else:
        roots = [a for a in policy.anchors if a.kind == "certificate"]
        if not roots:
            raise SignatureError(f"{where}{ref} is signed by certificate {info.identity} ({info.fingerprint}), and you "
                                 "trust no root certificate; nothing was installed", hint=TRUST_HINT)
        verifier = sign_certificate.Verifier([Path(a.path) for a in roots])
        anchor = None
    try:
        signed = verifier.verify(sign_sigstore_pb.Signature(bundle))
    except Exception as e:  # noqa: BLE001 - InvalidSignature, OpenSSL's chain errors, ValueError: all refusals
        reason = _one_line(e) or type(e).__name__
        if info.method == "certificate":
            raise SignatureError(f"{where}{ref} is signed by certificate {info.identity} ({info.fingerprint}), which "
                                 f"does not chain to a root certificate you trust ({reason}); nothing was "
                                 "installed", hint=TRUST_HINT) from None
        raise SignatureError(f"{where}{ref}: its signature does not verify with the trusted key {info.fingerprint} "
                             f"({reason}); nothing was installed",
                             hint="the signature was damaged or forged: do not use this version") from None
    if anchor is None:
        anchor = roots[0] if len(roots) == 1 else None
    try:
        got = _digests(signed)
    except ValueError as e:
        raise SignatureError(f"{where}{ref}: its signature lists {e}") from None
    if signed.model_name != ref:
        raise SignatureError(f"{where}{ref}: its signature is for {signed.model_name!r}, not this version; nothing was "
                             "installed", hint="a signature of another version was put beside this one: do not use it")
    problems = _differences(got, signed_digests(manifest, attachments))
    if problems:
        raise SignatureError(f"{where}{ref}: {'; '.join(problems)}; nothing was installed",
                             hint="the version was changed after it was signed (by whoever can write where it came "
                                  "from): do not use it; ask its publisher to check the original")
    return Verdict(ref, signed=True, verified=True, method=info.method, fingerprint=info.fingerprint,
                   identity=info.identity, anchor=anchor.path if anchor else None)


def _differences(signed: dict[str, str], now: dict[str, str]) -> list[str]:
    """What differs between the signed digests and the version's, in words (the manifest first)."""
    out = []
    if signed.get(MANIFEST_FILE) != now.get(MANIFEST_FILE):
        out.append("its manifest changed after signing")
    changed = sorted(n for n in set(signed) & set(now) if n != MANIFEST_FILE and signed[n] != now[n])
    if changed:
        out.append(f"file {', '.join(changed[:5])}{' …' if len(changed) > 5 else ''} changed after signing")
    added = sorted(set(now) - set(signed))
    if added:
        out.append(f"{', '.join(added[:5])} not covered by the signature (added after signing)")
    removed = sorted(set(signed) - set(now))
    if removed:
        out.append(f"{', '.join(removed[:5])} signed but no longer part of the version")
    return out
