"""A version's attachments (zoo/registry/attachments.py: its signature and bill of materials) in the
local zoo, through a pull and through a bundle: stored create-exclusive, never replaced by other
bytes, removed with the version, and refused when a bundle or remote offers what zoo does not know.
The same promises on every remote backend: tests/test_registry_remote_contract.py."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from registry_servers import make_staging
from zoo.errors import Conflict, IntegrityError, NotFound, StorageError
from zoo.registry import api
from zoo.registry.attachments import BOM, MAX_BYTES, SIGNATURE
from zoo.registry.bundle import export_bundle, import_bundle
from zoo.registry.store import LocalZoo

BOM_BYTES = b'{"bomFormat": "CycloneDX", "specVersion": "1.6"}'


@pytest.fixture
def zoo(tmp_path) -> LocalZoo:
    z = LocalZoo(tmp_path / "zoo")
    z.publish(make_staging(tmp_path / "staging"))
    return z


def test_an_attachment_is_stored_once_and_never_replaced(zoo):
    assert zoo.attachments("tiny", "1.0.0") == {}
    assert zoo.add_attachment("tiny", "1.0.0", BOM, BOM_BYTES) is True
    assert zoo.add_attachment("tiny", "1.0.0", BOM, BOM_BYTES) is False  # the same bytes: nothing to do
    with pytest.raises(Conflict, match="different bill of materials"):
        zoo.add_attachment("tiny", "1.0.0", BOM, b"{}")
    assert zoo.attachments("tiny", "1.0.0") == {BOM: BOM_BYTES}


def test_unknown_names_oversized_data_and_absent_versions_are_refused(zoo):
    with pytest.raises(StorageError, match="unknown attachment 'evil.sh'"):
        zoo.add_attachment("tiny", "1.0.0", "evil.sh", b"rm -rf /")
    with pytest.raises(StorageError, match="larger than"):
        zoo.add_attachment("tiny", "1.0.0", SIGNATURE, b"x" * (MAX_BYTES + 1))
    with pytest.raises(NotFound):
        zoo.add_attachment("tiny", "9.9.9", BOM, BOM_BYTES)
    assert not (zoo.model_dir("tiny") / "attachments").exists()


def test_removing_a_version_removes_its_attachments(zoo):
    zoo.add_attachment("tiny", "1.0.0", BOM, BOM_BYTES)
    zoo.remove("tiny", "1.0.0")
    assert not zoo.attachments_dir("tiny", "1.0.0").exists()


def test_a_pull_brings_the_attachments_of_the_version_it_adopts(zoo, tmp_path):
    zoo.add_attachment("tiny", "1.0.0", BOM, BOM_BYTES)
    zoo.add_attachment("tiny", "1.0.0", SIGNATURE, b'{"sig": 1}')
    api.remote_add("origin", str(tmp_path / "remote"), zoo=zoo)
    api.push("tiny@1.0.0", "origin", zoo=zoo)
    consumer = LocalZoo(tmp_path / "consumer")
    api.remote_add("origin", str(tmp_path / "remote"), zoo=consumer)
    api.pull("tiny@1.0.0", zoo=consumer)
    assert consumer.attachments("tiny", "1.0.0") == {BOM: BOM_BYTES, SIGNATURE: b'{"sig": 1}'}


def test_a_bundle_carries_attachments_and_checks_them(zoo, tmp_path):
    plain = export_bundle(["tiny@1.0.0"], tmp_path / "plain.tar", zoo=zoo)
    with tarfile.open(plain.path) as tar:  # a version without attachments: an older zoo's schema 1
        assert json.load(tar.extractfile("zoo-bundle.json"))["schema_version"] == 1
    zoo.add_attachment("tiny", "1.0.0", BOM, BOM_BYTES)
    out = export_bundle(["tiny@1.0.0"], tmp_path / "b.tar", zoo=zoo)
    with tarfile.open(out.path) as tar:
        index = json.load(tar.extractfile("zoo-bundle.json"))
        assert index["schema_version"] == 2
        assert index["versions"][0]["attachments"] == {BOM: hashlib.sha256(BOM_BYTES).hexdigest()}
    other = LocalZoo(tmp_path / "other")
    import_bundle(out.path, zoo=other)
    assert other.attachments("tiny", "1.0.0") == {BOM: BOM_BYTES}


def _rewrite(src, dest, change):
    """Copy the tar `src` to `dest`, passing each member's (name, bytes) through `change`."""
    with tarfile.open(src) as tin, tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read()
            for name, new in change(m.name, data):
                info = tarfile.TarInfo(name)
                info.size = len(new)
                tout.addfile(info, io.BytesIO(new))


def test_a_bundle_with_a_changed_or_unlisted_attachment_installs_nothing(zoo, tmp_path):
    zoo.add_attachment("tiny", "1.0.0", BOM, BOM_BYTES)
    good = export_bundle(["tiny@1.0.0"], tmp_path / "b.tar", zoo=zoo).path

    def changed(name, data):
        yield name, (b'{"bomFormat": "forged"}' if name.endswith(BOM) else data)

    def unlisted(name, data):
        yield name, data
        if name.endswith(BOM):
            yield name.replace(BOM, SIGNATURE), b"{}"

    for change, message in ((changed, "does not match its sha256"), (unlisted, "is not in zoo-bundle.json")):
        bad = tmp_path / f"{change.__name__}.tar"
        _rewrite(good, bad, change)
        other = LocalZoo(tmp_path / f"other-{change.__name__}")
        with pytest.raises(IntegrityError, match=message):
            import_bundle(bad, zoo=other)
        assert other.list() == [] and not (other.root / "models").exists()
