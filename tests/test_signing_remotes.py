"""Signed versions through real remotes (a folder, moto's S3 and docker-registry's OCI registry on
127.0.0.1; `KINDS` lists the backends, so another is one more entry): a signed version pushed and pulled with its signature checked before a
byte is fetched; a blob changed on the remote; the manifest and a blob rewritten consistently, as
someone with write access to the bucket would (new bytes, a manifest with their sha256, even a
signature by the attacker's own key); an unsigned version under --require-signature; a signer
the user does not trust; a cloned project's config naming the attacker's key. Every refusal is
exit 4 with nothing installed: no manifest, no tag, no blob."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

from cli_helpers import zoo as run_zoo
from registry_servers import make_staging
from signing_keys import make_key
from zoo.errors import IntegrityError, SignatureError
from zoo.registry import api, signing
from zoo.registry.anchors import load_anchor
from zoo.registry.attachments import BOM, SIGNATURE
from zoo.registry.refs import parse_ref
from zoo.registry.store import LocalZoo

KINDS = ["folder", "s3", "oci"]  # remote kinds these tests run on (remote_fixtures.Backend kinds)
MODEL = "builds/cpu-fp32/model.onnx"


@pytest.fixture
def keys(tmp_path):
    return make_key(tmp_path / "keys", "release"), make_key(tmp_path / "keys", "attacker")


@pytest.fixture
def signed(tmp_path, backend, keys):
    """A publisher's zoo whose tiny@1.0.0 (with a BOM) is signed by the release key and pushed; tiny@1.1.0
    is pushed unsigned."""
    release, _ = keys
    zoo = LocalZoo(tmp_path / "publisher")
    m = zoo.publish(make_staging(tmp_path / "s100", version="1.0.0", big_bytes=3000))
    assert BOM in zoo.attachments(m.name, m.version)  # every publish makes its bill of materials
    signing.sign_local(zoo, m, signing.Signer(release.private))
    zoo.publish(make_staging(tmp_path / "s110", version="1.1.0", scale=7.0))
    backend.add_to(zoo, url=backend.write_url)
    assert api.push("tiny@1.0.0", "origin", zoo=zoo)["attachments"] == [BOM, SIGNATURE]
    api.push("tiny@1.1.0", "origin", zoo=zoo)
    return zoo


def _consumer(tmp_path: Path, backend, trust: list[Path]) -> LocalZoo:
    """An empty zoo (the one $ZOO_HOME names, for the `zoo` command) with the remote, trusting `trust`."""
    import os

    zoo = LocalZoo(Path(os.environ["ZOO_HOME"]))
    backend.add_to(zoo, trust=[str(t) for t in trust])
    return zoo


def _nothing_installed(zoo: LocalZoo) -> None:
    assert zoo.get("tiny", "1.0.0") is None and zoo.tags("tiny") == {}
    assert not list((zoo.blobs.root / "sha256").rglob("*")) if (zoo.blobs.root / "sha256").exists() else True
    assert zoo.attachments_dir("tiny", "1.0.0").exists() is False


def _rewrite(backend, tmp_path: Path, *, resign_with=None) -> None:
    """Replace tiny@1.0.0 on the remote with other model bytes and a manifest that matches them,
    consistently (its sha256 and size are the new bytes'), keeping the BOM and the original signature
    beside it; `resign_with`: a signature by this key over the forged version instead. Done through
    the remote's own write path (remove, then push), as anyone with write access can, so it works
    alike on every kind of remote."""
    attacker = LocalZoo(tmp_path / f"attacker-{uuid.uuid4().hex[:6]}")
    backend.add_to(attacker, url=backend.write_url)
    stolen = api._remote("origin", attacker).read_attachments("tiny", "1.0.0")
    api.rm("tiny@1.0.0", remote="origin", zoo=attacker)
    forged = attacker.publish(make_staging(tmp_path / f"evil-{uuid.uuid4().hex[:6]}", scale=99.0))
    own_bom = {BOM: attacker.attachments("tiny", "1.0.0")[BOM]}  # the forged version's, made by its publish
    sig = stolen[SIGNATURE] if resign_with is None else signing.sign(forged, own_bom,
                                                                     signing.Signer(resign_with.private))
    attacker.add_attachment("tiny", "1.0.0", SIGNATURE, sig)
    api.push("tiny@1.0.0", "origin", zoo=attacker)
    remote_manifest = api._remote("origin", attacker).resolve(parse_ref("tiny@1.0.0"))
    assert remote_manifest.builds["cpu-fp32"].file.sha256 == forged.builds["cpu-fp32"].file.sha256


@pytest.mark.parametrize("backend", KINDS, indirect=True)
def test_a_signed_release_is_pulled_with_its_signature_checked(signed, backend, tmp_path, keys):
    release, _ = keys
    consumer = _consumer(tmp_path, backend, [release.public])
    pulled = run_zoo("pull", "tiny@1.0.0", "--require-signature", "--json")
    assert pulled.code == 0, pulled.err
    result = json.loads(pulled.out)
    assert result["signature"]["verified"] and result["signature"]["fingerprint"] == load_anchor(release.public).fingerprint
    assert result["signature"]["anchor"] == str(release.public)
    assert consumer.attachments("tiny", "1.0.0") == signed.attachments("tiny", "1.0.0")  # kept as checked
    assert "signed by key sha256:" in run_zoo("pull", "tiny@1.0.0", "--require-signature").err  # now local: checked again
    assert run_zoo("verify", "tiny@1.0.0").code == 0
    shown = json.loads(run_zoo("show", "tiny@1.0.0", "--remote", "origin", "--json").out)
    assert shown["signature"]["fingerprint"] == result["signature"]["fingerprint"]


@pytest.mark.parametrize("backend", KINDS, indirect=True)
def test_a_blob_changed_on_the_remote_is_refused(signed, backend, tmp_path, keys):
    consumer = _consumer(tmp_path, backend, [keys[0].public])
    m = signed.resolve("tiny@1.0.0")
    backend.tamper("tiny", "1.0.0", MODEL, m.builds["cpu-fp32"].file.sha256)
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        api.pull("tiny@1.0.0", zoo=consumer, require_signature=True)
    assert consumer.get("tiny", "1.0.0") is None and consumer.tags("tiny") == {}


@pytest.mark.parametrize("backend", KINDS, indirect=True)
def test_a_manifest_and_blob_rewritten_consistently_are_refused(signed, backend, tmp_path, keys):
    release, attacker = keys
    consumer = _consumer(tmp_path, backend, [release.public])
    _rewrite(backend, tmp_path)
    # trust is configured: the signature is checked even without --require-signature
    refused = run_zoo("pull", "tiny@1.0.0")
    assert refused.code == 4, refused.text
    assert "remote origin: tiny@1.0.0: its manifest changed after signing" in refused.err
    # the forged model, and the BOM its publish made for it, are named
    assert re.search(rf"file [^;]*{BOM}, [^;]*{MODEL} changed after signing", refused.err), refused.err
    assert "nothing was installed" in refused.err
    _nothing_installed(consumer)

    _rewrite(backend, tmp_path, resign_with=attacker)  # and re-signed with the attacker's own key
    with pytest.raises(SignatureError, match=f"signed by key {load_anchor(attacker.public).fingerprint}, which you do not trust"):
        api.pull("tiny@1.0.0", zoo=consumer, require_signature=True)
    _nothing_installed(consumer)


@pytest.mark.parametrize("backend", KINDS, indirect=True)
def test_unsigned_and_untrusted_versions_are_refused(signed, backend, tmp_path, keys):
    release, attacker = keys
    consumer = _consumer(tmp_path, backend, [attacker.public])
    unsigned = run_zoo("pull", "tiny@1.1.0", "--require-signature")
    assert unsigned.code == 4 and "tiny@1.1.0 is not signed" in unsigned.err
    assert consumer.get("tiny", "1.1.0") is None
    untrusted = run_zoo("pull", "tiny@1.0.0")
    assert untrusted.code == 4 and load_anchor(release.public).fingerprint in untrusted.err
    assert "--trust FILE" in untrusted.err  # the hint says how to trust a key
    _nothing_installed(consumer)
    assert run_zoo("pull", "tiny@1.1.0").code == 0  # unsigned, not demanded: pulled as before


@pytest.mark.parametrize("backend", KINDS, indirect=True)
def test_a_cloned_projects_config_cannot_make_the_attackers_key_trusted(signed, backend, tmp_path, keys):
    release, attacker = keys
    consumer = _consumer(tmp_path, backend, [release.public])
    _rewrite(backend, tmp_path, resign_with=attacker)
    project = tmp_path / "cloned"
    (project / ".zoo").mkdir(parents=True)
    (project / ".zoo" / "config.yaml").write_text(f"schema_version: 2\nsigning: {{trust: [{attacker.public}]}}\n")
    refused = run_zoo("pull", "tiny@1.0.0", cwd=project)
    assert refused.code == 4 and "which you do not trust" in refused.err and "signing.trust ignored" in refused.err
    _nothing_installed(consumer)

    (project / ".zoo" / "config.yaml").write_text("schema_version: 2\nsigning: {require: true}\n")
    narrowed = run_zoo("pull", "tiny@1.1.0", cwd=project)  # the project's require narrows: honoured
    assert narrowed.code == 4 and "is not signed" in narrowed.err
