"""The blob store states its invariants directly (issue #18, mutation area registry-blobs): a blob
counts only when its bytes hash to its name and match the size asked for; a source is re-hashed
even when a blob with the claimed digest exists, so a tampered file is never published. Downloads
into the store are tested in test_download.py. In-process and fast: every mutant of blobs.py runs
these first."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from zoo import files
from zoo.errors import IntegrityError
from zoo.registry.blobs import BlobStore, _identity
from zoo.registry.manifest import MANIFEST_FILE
from zoo.registry.store import LocalZoo
from registry_servers import make_staging

DATA = b"zoo blob " * 1000  # 9000 bytes
SHA = hashlib.sha256(DATA).hexdigest()


def _flip(path: Path, at: int | None = None) -> None:
    """Change one byte in place (same inode and size, as a write through a hard link would)."""
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if at is None else at
    data[i] ^= 0x01
    with open(path, "r+b") as f:
        f.write(data)


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


@pytest.fixture
def hashes(monkeypatch) -> list[Path]:
    """Every file the store hashes, in order (files.sha256_and_size is the only way it hashes a file)."""
    calls: list[Path] = []
    real = files.sha256_and_size
    monkeypatch.setattr(files, "sha256_and_size", lambda p: calls.append(Path(p)) or real(p))
    return calls


# ---- layout ------------------------------------------------------------------------------
def test_blob_paths_follow_the_documented_layout(store):
    assert store.path(SHA) == store.root / "sha256" / SHA[:2] / SHA
    assert store.partial_dir == store.root / "partial"
    assert store._memo_path(SHA) == store.root / "verified" / SHA[:2] / SHA


def test_an_added_blob_is_read_only_verified_and_remembered(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    dest = store.add(src, SHA, len(DATA), "x")
    assert dest == store.path(SHA) and dest.read_bytes() == DATA
    assert stat.S_IMODE(dest.stat().st_mode) == 0o444
    assert store._memo_path(SHA).read_text() == _identity(os.stat(dest))
    assert store.present(SHA) and store.has(SHA, len(DATA)) and store.check(SHA) == "ok"


# ---- check / has -------------------------------------------------------------------------
def test_check_tells_missing_corrupt_and_ok_apart(store, tmp_path):
    assert store.check(SHA) == "missing" and not store.has(SHA) and not store.present(SHA)
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    assert store.check(SHA, len(DATA)) == "ok" and store.check(SHA) == "ok"
    # a size other than the stored one, either way, is corrupt (without hashing anything)
    assert store.check(SHA, len(DATA) + 1) == "corrupt" and store.check(SHA, len(DATA) - 1) == "corrupt"
    assert not store.has(SHA, len(DATA) + 1)
    assert store.check(SHA, len(DATA)) == "ok"  # the size checks did not forget the verified bytes
    assert store.check(sha256=SHA, size=len(DATA), rehash=True) == "ok"  # every argument can be named


def test_a_blob_whose_bytes_changed_is_corrupt_and_its_memo_is_dropped(store, tmp_path, hashes):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    assert store.has(SHA) and hashes == []  # verified at add: a re-check is a stat, no hash
    _flip(store.path(SHA))
    assert store.check(SHA, len(DATA)) == "corrupt" and not store.has(SHA)
    assert hashes == [store.path(SHA)] * 2
    assert not store._memo_path(SHA).exists()


def test_any_other_digest_is_corrupt_whether_it_sorts_before_or_after_the_name(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    found = {}
    for i in range(len(DATA)):  # one-byte changes whose digests sort below and above the blob's name
        bad = bytearray(DATA)
        bad[i] ^= 1
        found.setdefault(hashlib.sha256(bad).hexdigest() < SHA, i)
        if len(found) == 2:
            break
    for i in found.values():
        store.add(src, SHA, len(DATA), "x")
        _flip(store.path(SHA), at=i)
        assert store.check(SHA) == "corrupt"
        store.remove(SHA)


def test_a_memo_counts_only_for_the_identity_it_recorded(store, tmp_path, hashes):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    store._memo_path(SHA).write_text("0 0 0 0 0")  # another file's identity
    assert store.check(SHA) == "ok" and len(hashes) == 1  # hashed again, and found good
    assert store._memo_path(SHA).read_text() == _identity(os.stat(store.path(SHA)))  # re-recorded
    assert store.check(SHA) == "ok" and len(hashes) == 1
    assert store.check(SHA, rehash=True) == "ok" and len(hashes) == 2  # fsck's rehash ignores the memo
    store._memo_path(SHA).unlink()
    assert store.check(SHA) == "ok" and len(hashes) == 3  # no memo: hashed
    _flip(store.path(SHA))
    for other in ("~", "9" * 40, _identity(os.stat(store.path(SHA))) + " "):  # greater, longer: still not the identity
        store._memo_path(SHA).write_text(other)
        assert store.check(SHA) == "corrupt"


def test_rehash_finds_a_corruption_the_memo_cannot_see(store, tmp_path):
    """Root can restore a blob's mtime after a write (ctime moves, but only if we look); rehash
    does not trust the memo at all."""
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    path = store.path(SHA)
    _flip(path)
    store._memo_path(SHA).write_text(_identity(os.stat(path)))  # a memo that lies about the bytes
    assert store.check(SHA) == "ok"  # the memo is trusted...
    assert store.check(SHA, rehash=True) == "corrupt"  # ...but not by a rehash


def test_a_blob_that_vanishes_while_checked_is_missing(store, tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    store._memo_path(SHA).unlink()

    def gone(p):
        raise FileNotFoundError(p)
    monkeypatch.setattr(files, "sha256_and_size", gone)
    assert store.check(SHA) == "missing"


# ---- add ---------------------------------------------------------------------------------
@pytest.mark.parametrize("same_size", [True, False])
def test_add_rehashes_the_source_even_when_the_blob_exists(store, tmp_path, same_size):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    before = os.stat(store.path(SHA))
    src.write_bytes(DATA[:-1] + b"!" if same_size else DATA + b"!")
    with pytest.raises(IntegrityError, match="does not match the manifest") as e:
        store.add(src, SHA, len(DATA), "model.onnx")
    got = files.sha256_and_size(src)[0]
    assert e.value.message == f"model.onnx: content does not match the manifest (expected sha256 {SHA[:12]}…, got {got[:12]}…)"
    assert "modified after the manifest" in e.value.hint
    after = os.stat(store.path(SHA))
    assert store.path(SHA).read_bytes() == DATA and (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_add_of_a_good_source_onto_an_existing_blob_leaves_it_alone(store, tmp_path, hashes):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    before = os.stat(store.path(SHA))
    hashes.clear()
    assert store.add(src, SHA, len(DATA), "x") == store.path(SHA)
    assert hashes == [src]  # the source, not the (memoised) blob
    assert os.stat(store.path(SHA)).st_ino == before.st_ino


@pytest.mark.parametrize("kind", ["iterable", "file object"])
def test_add_from_a_stream_is_verified_whether_or_not_the_blob_exists(store, tmp_path, kind):
    import io

    def source(data):
        return [data[:100], data[100:]] if kind == "iterable" else io.BytesIO(data)

    bad = DATA[:-1] + b"!"
    with pytest.raises(IntegrityError):
        store.add(source(bad), SHA, len(DATA), "x")
    assert not store.present(SHA)
    store.add(source(DATA), SHA, len(DATA), "x")
    with pytest.raises(IntegrityError):
        store.add(source(bad), SHA, len(DATA), "x")
    assert store.path(SHA).read_bytes() == DATA


def test_add_replaces_a_blob_whose_bytes_went_bad(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    _flip(store.path(SHA))
    store.add(src, SHA, len(DATA), "x")
    assert store.path(SHA).read_bytes() == DATA and store.check(SHA, rehash=True) == "ok"
    assert stat.S_IMODE(store.path(SHA).stat().st_mode) == 0o444


def test_add_of_a_source_with_the_wrong_size_is_refused(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    with pytest.raises(IntegrityError):
        store.add(src, SHA, len(DATA) + 1, "x")
    assert not store.present(SHA)


def test_publishing_a_staging_file_tampered_after_its_manifest_while_its_blob_exists_is_refused(tmp_path):
    """Issue #18's survivor: the claimed digest is already a blob (another version has those
    bytes), so only re-hashing the staging file catches the change."""
    zoo = LocalZoo(tmp_path / "zoo")
    zoo.publish(make_staging(tmp_path / "a", version="1.0.0"))
    staging = make_staging(tmp_path / "b", version="1.0.1")  # same bytes: same blobs
    model = staging / "builds/cpu-fp32/model.onnx"
    sha = json.loads((staging / MANIFEST_FILE).read_text())["builds"]["cpu-fp32"]["file"]["sha256"]
    assert zoo.blobs.has(sha)
    _flip(model, at=-1)  # after the manifest was written
    with pytest.raises(IntegrityError, match="does not match the manifest"):
        zoo.publish(staging)
    assert zoo.get("tiny", "1.0.1") is None and [v.version for v in zoo.list()] == ["1.0.0"]
    assert zoo.blobs.check(sha, rehash=True) == "ok"  # the stored bytes are the published ones


def test_a_memo_that_cannot_be_written_costs_a_rehash_never_a_failure(store, tmp_path, hashes):
    store.root.mkdir(parents=True)
    (store.root / "verified").write_text("not a folder")  # no memo can be written under it
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    assert store.has(SHA) and store.has(SHA)
    assert hashes == [store.path(SHA)] * 2  # verified every time instead of remembered


# ---- remove / relinked ---------------------------------------------------------------
def test_remove_deletes_blob_and_memo_and_tolerates_a_missing_blob(store, tmp_path):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    store.remove(SHA)
    assert not store.path(SHA).exists() and not store._memo_path(SHA).exists()
    store.remove(SHA)  # already gone: no error
    assert store.check(SHA) == "missing"


def test_a_hard_link_keeps_the_memo_valid_only_if_the_bytes_cannot_have_changed(store, tmp_path, hashes):
    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    path = store.path(SHA)
    before = os.stat(path)
    os.link(path, tmp_path / "link")  # moves the blob's ctime
    store.relinked(SHA, before)
    hashes.clear()
    assert store.has(SHA) and hashes == []  # memo refreshed: no re-hash
    # a write between the verification and the link: the memo must not be refreshed
    before = os.stat(path)
    _flip(path)
    os.link(path, tmp_path / "link2")
    store.relinked(SHA, before)
    assert not store.has(SHA) and hashes == [path]
    store.relinked("0" * 64, before)  # no such blob: nothing happens


@pytest.mark.parametrize("field", ["st_ino", "st_size", "st_mtime_ns"])
def test_relinked_compares_inode_size_and_mtime(store, tmp_path, hashes, field):
    from types import SimpleNamespace

    src = tmp_path / "src"
    src.write_bytes(DATA)
    store.add(src, SHA, len(DATA), "x")
    path = store.path(SHA)
    real = os.stat(path)
    os.link(path, tmp_path / "link")  # moves ctime: the memo no longer counts unless refreshed
    before = {"st_ino": real.st_ino, "st_size": real.st_size, "st_mtime_ns": real.st_mtime_ns}
    before[field] += 1  # one of the three compared fields differs
    hashes.clear()
    store.relinked(SHA, SimpleNamespace(**before))
    assert store.has(SHA) and hashes == [path]  # not refreshed: hashed again


def _read_only_source(tmp_path: Path, data: bytes = DATA) -> Path:
    """A file as the run cache keeps its objects: read-only for everyone."""
    src = tmp_path / "cache-object"
    src.write_bytes(data)
    os.chmod(src, 0o444)
    return src


def test_add_by_link_shares_the_source_inode_and_is_verified(store, tmp_path):
    src = _read_only_source(tmp_path)
    dest = store.add(src, SHA, len(DATA), "x", link=True)
    assert os.path.samefile(src, dest)
    assert store.check(SHA, len(DATA)) == "ok"
    assert not os.stat(dest).st_mode & 0o222


def test_add_by_link_refuses_a_source_whose_bytes_differ_and_leaves_nothing(store, tmp_path):
    src = _read_only_source(tmp_path, DATA[:-1] + b"?")
    with pytest.raises(IntegrityError, match="does not match"):
        store.add(src, SHA, len(DATA), "x", link=True)
    assert not store.present(SHA)
    assert sorted(p.name for p in store.path(SHA).parent.iterdir()) == []  # no temp link left behind


def test_add_by_link_copies_where_the_file_system_cannot_link(store, tmp_path, monkeypatch):
    src = _read_only_source(tmp_path)

    def no_links(*a, **k):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(files.os, "link", no_links)
    dest = store.add(src, SHA, len(DATA), "x", link=True)
    assert not os.path.samefile(src, dest) and dest.read_bytes() == DATA


def test_removing_a_linked_blob_leaves_the_run_cache_object_read_only(store, tmp_path):
    src = _read_only_source(tmp_path)
    store.add(src, SHA, len(DATA), "x", link=True)
    store.remove(SHA)
    assert not store.present(SHA)
    assert src.read_bytes() == DATA and not os.stat(src).st_mode & 0o222


def test_publish_links_only_when_asked(tmp_path):
    """A user's folder is copied (a later write to it must not reach the zoo); a cached release,
    whose files are run cache objects, is linked."""
    for link in (False, True):
        staging = make_staging(tmp_path / f"s{link}")
        for p in staging.rglob("*"):
            if p.is_file():
                os.chmod(p, 0o444)
        zoo = LocalZoo(tmp_path / f"home{link}")
        manifest = zoo.publish(staging, link=link)
        for ref in manifest.all_files():
            shared = os.path.samefile(staging / ref.path, zoo.blobs.path(ref.sha256))
            assert shared is link, ref.path
