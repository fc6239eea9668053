"""Signed versions in the local zoo, with real keys and certificates (tests/signing_keys.py) and the
OpenSSF model_signing library: what is signed, who is trusted and from where (a cloned project's
config cannot widen it), `zoo verify` on a good and a damaged version, bundles carrying their
signatures, certificate chains, and the library's own verify accepting zoo's signature.
The same on remotes (S3, …): tests/test_signing_remotes.py."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from cli_helpers import zoo as run_zoo
from registry_servers import make_staging
from signing_keys import make_ca, make_key, make_leaf
from zoo.errors import Conflict, InvalidInput, MissingExtra, SignatureError
from zoo.registry import signing, trust
from zoo.registry.attachments import BOM, SIGNATURE
from zoo.registry.bundle import export_bundle, import_bundle
from zoo.registry.manifest import MANIFEST_FILE
from zoo.registry.store import LocalZoo



@pytest.fixture
def keys(tmp_path):
    return make_key(tmp_path / "keys", "release"), make_key(tmp_path / "keys", "attacker")


def _user_config(home: Path, text: str) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(text)
    return home / "config.yaml"


def _trust_globally(*paths: Path) -> Path:
    import os

    listed = ", ".join(str(p) for p in paths)
    return _user_config(Path(os.environ["ZOO_HOME"]), f"schema_version: 2\nsigning: {{trust: [{listed}]}}\n")


@pytest.fixture
def home() -> LocalZoo:
    """The zoo $ZOO_HOME selects (what the `zoo` command sees) with tiny@1.0.0 and a BOM."""
    z = LocalZoo()
    return z


def _publish(zoo: LocalZoo, tmp_path: Path, version: str = "1.0.0"):
    m = zoo.publish(make_staging(tmp_path / f"staging-{version}", version=version))
    assert BOM in zoo.attachments(m.name, m.version)  # every publish makes its bill of materials
    return m


def test_a_signature_covers_every_file_the_manifest_and_the_bom(home, tmp_path, keys):
    release, _ = keys
    m = _publish(home, tmp_path)
    verdict = signing.sign_local(home, m, signing.Signer(release.private))
    assert verdict.fingerprint == trust.load_anchor(release.public).fingerprint
    digests = signing.signed_digests(m, home.attachments("tiny", "1.0.0"))
    assert set(digests) == {f.path for f in m.all_files()} | {MANIFEST_FILE, BOM}
    # the publish time is not signed: a remote copy with another `created` verifies alike
    assert signing.canonical_manifest(m) == signing.canonical_manifest(m.model_copy(update={"created": "2000-01-01"}))

    policy = trust.Policy([trust.load_anchor(release.public)])
    attached = home.attachments("tiny", "1.0.0")
    assert signing.verify(m, attached, policy).verified
    with pytest.raises(SignatureError, match="its manifest changed after signing"):
        signing.verify(m.model_copy(update={"description": "better"}), attached, policy)
    with pytest.raises(SignatureError, match=f"{BOM} changed after signing"):
        signing.verify(m, {**attached, BOM: b"{}"}, policy)
    with pytest.raises(SignatureError, match=f"{BOM} signed but no longer part of the version"):
        signing.verify(m, {SIGNATURE: attached[SIGNATURE]}, policy)

    # signing again with the same key keeps the signature (attachments are immutable); another key is refused
    again = signing.sign_local(home, m, signing.Signer(release.private))
    assert again.notes == ["already signed by this key: signature kept"]
    with pytest.raises(Conflict, match="already signed"):
        signing.sign_local(home, m, signing.Signer(keys[1].private))


@pytest.mark.parametrize("curve", ["SECP384R1", "SECP521R1"])
def test_p384_and_p521_keys_sign_too(home, tmp_path, curve):
    from cryptography.hazmat.primitives.asymmetric import ec

    key = make_key(tmp_path / "keys", curve.lower(), getattr(ec, curve)())
    m = _publish(home, tmp_path)
    signing.sign_local(home, m, signing.Signer(key.private))
    assert signing.verify(m, home.attachments("tiny", "1.0.0"), trust.Policy([trust.load_anchor(key.public)])).verified


def test_the_model_signing_librarys_own_verify_accepts_a_zoo_signature(home, tmp_path, keys):
    """Interoperability: anyone with model_signing checks a zoo release from its files, the canonical
    zoo-manifest.json and the BOM in one folder (docs/releases.md)."""
    import model_signing

    release, attacker = keys
    m = _publish(home, tmp_path)
    signing.sign_local(home, m, signing.Signer(release.private))
    folder = tmp_path / "checked"
    _trust_globally(release.public)
    exported = run_zoo("verify", "tiny@1.0.0", "--export", folder, "--json")
    assert exported.code == 0, exported.err
    assert set(json.loads(exported.out)["exported"]["files"]) == {f.path for f in m.all_files()} | {
        MANIFEST_FILE, BOM, SIGNATURE}
    assert (folder / MANIFEST_FILE).read_bytes() == signing.canonical_manifest(m)
    # the library's own command line, as docs/releases.md shows it
    import subprocess
    import sys

    cli = [str(Path(sys.executable).parent / "model_signing"), "verify", "key", str(folder), "--signature",
           str(folder / SIGNATURE), "--public_key", str(release.public)]
    checked = subprocess.run(cli, capture_output=True, text=True)
    assert checked.returncode == 0 and "Verification succeeded" in checked.stdout + checked.stderr, checked
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=release.public).verify(
        folder, folder / SIGNATURE)
    with pytest.raises(ValueError):
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=attacker.public).verify(
            folder, folder / SIGNATURE)
    (folder / "builds/cpu-fp32/model.onnx").write_bytes(b"other bytes")
    with pytest.raises(ValueError, match="Signature mismatch"):
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=release.public).verify(
            folder, folder / SIGNATURE)


def test_zoo_verify_a_good_and_a_tampered_local_version(home, tmp_path, keys):
    release, attacker = keys
    m = _publish(home, tmp_path)
    signing.sign_local(home, m, signing.Signer(release.private))

    untrusted = run_zoo("verify", "tiny@1.0.0")  # asked to verify, an untrusted signer is refused
    assert untrusted.code == 4 and "which you do not trust" in untrusted.err
    _trust_globally(attacker.public)
    wrong = run_zoo("verify", "tiny@1.0.0")
    assert wrong.code == 4 and trust.load_anchor(release.public).fingerprint in wrong.err

    _trust_globally(release.public)
    ok = run_zoo("verify", "tiny@1.0.0", "--json")
    assert ok.code == 0, ok.err
    report = json.loads(ok.out)
    assert report["ok"] and report["signature"]["verified"] and report["signature"]["anchor"] == str(release.public)
    assert set(report["files"].values()) == {"ok"} and report["attachments"] == [BOM, SIGNATURE]
    shown = json.loads(run_zoo("show", "tiny@1.0.0", "--json").out)["signature"]
    assert shown["method"] == "key" and shown["fingerprint"] == report["signature"]["fingerprint"]
    assert "signed: key sha256:" in run_zoo("show", "tiny@1.0.0").out

    blob = home.blobs.path(m.builds["cpu-fp32"].file.sha256)  # flip a byte of the stored model
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes()[:-1] + bytes([blob.read_bytes()[-1] ^ 0xFF]))
    bad = run_zoo("verify", "tiny@1.0.0")
    assert bad.code == 4 and "builds/cpu-fp32/model.onnx" in bad.err and "changed after signing" in bad.err


def test_an_unsigned_version_passes_verify_unless_a_signature_is_demanded(home, tmp_path):
    _publish(home, tmp_path)
    ok = run_zoo("verify", "tiny@1.0.0")
    assert ok.code == 0 and "not signed" in ok.out
    refused = run_zoo("verify", "tiny@1.0.0", "--require-signature")
    assert refused.code == 4 and "tiny@1.0.0 is not signed" in refused.err and "--require-signature" in refused.err
    # the user's signing.require is about versions entering the zoo: their own build still verifies and pulls
    _user_config(home.root, "schema_version: 2\nsigning: {require: true}\n")
    assert run_zoo("verify", "tiny@1.0.0").code == 0
    assert run_zoo("pull", "tiny@1.0.0").code == 0


def test_a_certificate_chain_is_checked_against_a_trusted_root(home, tmp_path):
    certs = tmp_path / "pki"
    root, other_root = make_ca(certs, "team-root"), make_ca(certs, "other-root")
    leaf, stranger = make_leaf(certs, "release-bot", root), make_leaf(certs, "stranger", other_root)
    m = _publish(home, tmp_path)
    verdict = signing.sign_local(home, m, signing.Signer(leaf.key.private, leaf.path))
    assert verdict.method == "certificate" and "CN=release-bot" in verdict.identity
    attached = home.attachments("tiny", "1.0.0")
    checked = signing.verify(m, attached, trust.Policy([trust.load_anchor(root.path)]))
    assert checked.verified and "release@example.com" in checked.identity and checked.anchor == str(root.path)
    with pytest.raises(SignatureError, match="does not chain to a root certificate you trust"):
        signing.verify(m, attached, trust.Policy([trust.load_anchor(other_root.path)]))
    with pytest.raises(SignatureError, match="you trust no root certificate"):
        signing.verify(m, attached, trust.Policy([trust.load_anchor(leaf.key.public)]))

    m2 = _publish(home, tmp_path, "1.1.0")  # a leaf from another CA
    signing.sign_local(home, m2, signing.Signer(stranger.key.private, stranger.path))
    with pytest.raises(SignatureError, match="CN=stranger"):
        signing.verify(m2, home.attachments("tiny", "1.1.0"), trust.Policy([trust.load_anchor(root.path)]))
    with pytest.raises(InvalidInput, match="does not match"):  # a certificate for another key
        signing.check_signer(signing.Signer(leaf.key.private, stranger.path))

    # a leaf under an intermediate: the signature carries the chain, the consumer trusts the root alone
    intermediate = make_ca(certs, "team-intermediate", issuer=root)
    deep = make_leaf(certs, "deep-bot", intermediate)
    m3 = _publish(home, tmp_path, "1.2.0")
    signing.sign_local(home, m3, signing.Signer(deep.key.private, deep.path, (intermediate.path,)))
    assert signing.verify(m3, home.attachments("tiny", "1.2.0"), trust.Policy([trust.load_anchor(root.path)])).verified
    with pytest.raises(SignatureError, match="does not chain"):
        signing.verify(m3, home.attachments("tiny", "1.2.0"), trust.Policy([trust.load_anchor(other_root.path)]))


def test_a_cloned_projects_config_cannot_widen_trust(home, tmp_path, keys):
    release, attacker = keys
    m = _publish(home, tmp_path)
    signing.sign_local(home, m, signing.Signer(attacker.private))
    _trust_globally(release.public)
    project = tmp_path / "cloned"
    (project / ".zoo").mkdir(parents=True)
    (project / ".zoo" / "config.yaml").write_text(
        f"schema_version: 2\nsigning: {{trust: [{attacker.public}], key: {attacker.private}, require: true}}\n")
    run_zoo("config", "allow", project / ".zoo" / "config.yaml")  # approved or not: trust stays the user's
    refused = run_zoo("verify", "tiny@1.0.0", cwd=project)
    assert refused.code == 4 and "which you do not trust" in refused.err
    assert "signing.key, signing.trust ignored" in refused.err
    # (its signing.require narrows, and is honoured for what enters the zoo: tests/test_signing_remotes.py)


def test_bundles_carry_signatures_and_import_checks_them(home, tmp_path, keys):
    release, attacker = keys
    m = _publish(home, tmp_path)
    signing.sign_local(home, m, signing.Signer(release.private))
    _publish(home, tmp_path, "1.1.0")  # unsigned
    out = tmp_path / "models.tar"
    export_bundle(["tiny@1.0.0"], out, zoo=home)
    both = tmp_path / "both.tar"
    export_bundle(["tiny@1.0.0", "tiny@1.1.0"], both, zoo=home)

    _trust_globally(release.public)
    fresh = LocalZoo(tmp_path / "air-gapped")
    result = import_bundle(out, zoo=fresh, require_signature=True)
    assert result.installed == ["tiny@1.0.0"] and result.signatures["tiny@1.0.0"]["verified"]
    assert fresh.attachments("tiny", "1.0.0")[SIGNATURE] == home.attachments("tiny", "1.0.0")[SIGNATURE]

    other = LocalZoo(tmp_path / "other")
    with pytest.raises(SignatureError, match="tiny@1.1.0 is not signed"):
        import_bundle(both, zoo=other, require_signature=True)
    assert other.get("tiny", "1.0.0") is None and other.get("tiny", "1.1.0") is None  # all or nothing

    # the manifest (and its index entry) rewritten consistently: the signature no longer matches
    forged = tmp_path / "forged.tar"
    with tarfile.open(out) as src, tarfile.open(forged, "w", format=tarfile.PAX_FORMAT) as dst:
        index = json.loads(src.extractfile("zoo-bundle.json").read())
        mpath = index["versions"][0]["manifest"]
        manifest = json.loads(src.extractfile(mpath).read())
        manifest["description"] = "now with a backdoor"
        new = (json.dumps(manifest, sort_keys=True, indent=2) + "\n").encode()
        import hashlib

        index["versions"][0]["manifest_sha256"] = hashlib.sha256(new).hexdigest()
        for member in src.getmembers():
            data = src.extractfile(member).read()
            data = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode() if member.name == "zoo-bundle.json" \
                else new if member.name == mpath else data
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    with pytest.raises(SignatureError, match="its manifest changed after signing"):
        import_bundle(forged, zoo=other)  # trust is configured: checked without --require-signature
    assert other.get("tiny", "1.0.0") is None
    refused = run_zoo("bundle", "import", forged)
    assert refused.code == 4 and "nothing was installed" in refused.err


def test_trusted_keys_are_checked_when_they_are_named(tmp_path, keys):
    release, _ = keys
    with pytest.raises(InvalidInput, match="holds a private key"):
        trust.load_anchor(release.private)
    (tmp_path / "junk.pub").write_text("not a key")
    with pytest.raises(InvalidInput, match="neither a PEM public key nor a certificate"):
        trust.load_anchor(tmp_path / "junk.pub")
    added = run_zoo("remote", "add", "team", tmp_path / "remote", "--trust", release.public)
    assert added.code == 0 and "trusts key sha256:" in added.out
    stored = json.loads((Path(__import__("os").environ["ZOO_CONFIG_DIR"]) / "remotes.json").read_text())
    assert stored["schema_version"] == 2 and stored["remotes"][0]["trust"] == [str(release.public)]
    assert run_zoo("remote", "add", "plain", tmp_path / "r2").code == 0
    assert run_zoo("remote", "add", "bad", tmp_path / "r3", "--trust", tmp_path / "junk.pub").code == 2
    assert run_zoo("remote", "remove", "team").code == 0  # no trust left: written as schema 1 again
    remotes = Path(__import__("os").environ["ZOO_CONFIG_DIR"]) / "remotes.json"
    assert json.loads(remotes.read_text())["schema_version"] == 1
    old = json.loads(remotes.read_text())  # a schema-1 file naming trust is not one zoo wrote
    old["remotes"][0]["trust"] = [str(release.public)]
    remotes.write_text(json.dumps(old))
    refused = run_zoo("remote", "list")
    assert refused.code == 2 and "`trust` needs schema_version 2" in refused.err


def test_config_schema_versions(home, tmp_path):
    _publish(home, tmp_path)
    _user_config(home.root, "schema_version: 1\nsigning: {require: true}\n")
    old = run_zoo("verify", "tiny@1.0.0")
    assert old.code == 2 and "needs schema_version: 2" in old.err
    _user_config(home.root, "schema_version: 2\nsigning: {trust: yes}\n")
    assert "signing.trust must be a list of paths" in run_zoo("verify", "tiny@1.0.0").err
    _user_config(home.root, "schema_version: 3\n")
    assert "schema_version 3 is not supported" in run_zoo("verify", "tiny@1.0.0").err


def test_without_the_extra_a_check_names_it(home, tmp_path, keys, monkeypatch):
    import sys

    release, _ = keys
    m = _publish(home, tmp_path)
    signing.sign_local(home, m, signing.Signer(release.private))
    monkeypatch.setitem(sys.modules, "model_signing", None)  # as if not installed
    with pytest.raises(MissingExtra, match="needs the `signing` extra") as e:
        signing.verify(m, home.attachments("tiny", "1.0.0"), trust.Policy([trust.load_anchor(release.public)]))
    assert e.value.hint == "pip install 'zoo-onnx[signing]'" and e.value.exit_code == 2


def test_zoo_release_sign_signs_what_it_pushes(tmp_path, keys, monkeypatch):
    """`zoo release --sign KEY` (and `signing.key` in the user's config) signs the local version before the
    push, which carries the signature; a fresh zoo trusting the key pulls it with --require-signature."""
    from cli_helpers import SHIPPED, write_recipe

    release, _ = keys
    recipe = write_recipe(tmp_path, SHIPPED)
    site = tmp_path / "site"
    assert run_zoo("remote", "add", "site", site).code == 0
    assert run_zoo("run", recipe).code == 0  # the lockfile a release runs under
    bad = run_zoo("release", recipe, "--version", "0.1.0", "--to", "site", "--sign", tmp_path / "nowhere.pem")
    assert bad.code == 2 and "cannot read the signing key" in bad.err and not site.exists()
    done = run_zoo("release", recipe, "--version", "0.1.0", "--to", "site", "--sign", release.private, "--json")
    assert done.code == 0, done.text
    out = json.loads(done.out)
    assert out["signature"]["fingerprint"] == trust.load_anchor(release.public).fingerprint
    assert (site / "models/shipped/attachments/0.1.0" / SIGNATURE).is_file()

    _user_config(LocalZoo().root, f"schema_version: 2\nsigning: {{key: {release.private}}}\n")
    again = run_zoo("release", recipe, "--version", "0.1.0", "--to", "site")  # signed by the config's key: kept
    assert again.code == 0 and "signed by key sha256:" in again.out, again.text

    # a version released unsigned first: a signed release adds the signature beside it on the remote
    (site / "models/shipped/attachments/0.1.0" / SIGNATURE).unlink()
    LocalZoo().attachments_dir("shipped", "0.1.0").joinpath(SIGNATURE).unlink()
    added = run_zoo("release", recipe, "--version", "0.1.0", "--to", "site")
    assert added.code == 0 and f"with the same bytes: added {SIGNATURE}" in added.out, added.text

    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "fresh"))
    assert run_zoo("pull", "shipped@0.1.0", "--require-signature").code == 4  # nothing trusted here
    _trust_globally(release.public)
    pulled = run_zoo("pull", "shipped@0.1.0", "--require-signature")
    assert pulled.code == 0 and "signed by key sha256:" in pulled.err, pulled.text


@pytest.mark.parametrize("garbage", [b'{"sig": 1}', b"[" * 100_000, b"\xff\xfe not json", b'{"mediaType": "x", '
                                     b'"verificationMaterial": {"publicKey": {"hint": "00"}}, "dsseEnvelope": {}}',
                                     b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "verificationMaterial": '
                                     b'{"x509CertificateChain": {"certificates": [{"rawBytes": "AAAA"}]}}, "dsseEnvelope": '
                                     b'{"payload": "e30=", "payloadType": "application/vnd.in-toto+json", "signatures": []}}'])
def test_a_malformed_signature_is_refused_in_one_line(home, tmp_path, keys, garbage):
    release, _ = keys
    m = _publish(home, tmp_path)
    home.add_attachment("tiny", "1.0.0", SIGNATURE, garbage)
    with pytest.raises(SignatureError, match="tiny@1.0.0: its sign") as e:
        signing.verify(m, home.attachments("tiny", "1.0.0"), trust.Policy([trust.load_anchor(release.public)]))
    assert "\n" not in e.value.message
    assert json.loads(run_zoo("show", "tiny@1.0.0", "--json").out)["signature"]["problem"]
