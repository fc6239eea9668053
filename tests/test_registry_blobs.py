"""The blob store and blob transfers state their invariants directly (issue #18, mutation area
registry-blobs): a blob counts only when its bytes hash to its name and match the size asked
for; a source is re-hashed even when a blob with the claimed digest exists, so a tampered file is
never published; a download becomes a blob only when digest and size match, resumes from its
partial file, and fails with the error class that says why. In-process and fast: every mutant of
blobs.py and transfer.py runs these first."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest

from zoo.errors import AccessDenied, IntegrityError, SourceUnreachable, StorageError
from zoo import files
from zoo.registry import transfer
from zoo.registry.blobs import BlobStore, _identity
from zoo.registry.manifest import MANIFEST_FILE
from zoo.registry.store import LocalZoo
from zoo.registry.testing import make_staging

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
    assert store.partial_path(SHA) == store.root / "partial" / f"{SHA}.part"
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


# ---- remove / relinked / partial locks ---------------------------------------------------
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


def test_a_partial_lock_is_dropped_only_when_no_download_holds_it(store):
    import fcntl

    lock = Path(str(store.partial_path(SHA)) + ".lock")
    store.drop_partial_lock(SHA)  # none: nothing to do
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a download holds it (another open file description)
        store.drop_partial_lock(SHA)
        assert lock.exists()
    finally:
        os.close(fd)
    store.drop_partial_lock(SHA)
    assert not lock.exists()


@pytest.mark.parametrize("replacement", ["higher", "lower"])
def test_a_partial_lock_replaced_while_it_was_being_locked_is_left_alone(store, tmp_path, monkeypatch, replacement):
    """The name now points at another file (a waiter's new lock): only the inode we locked may go.
    The replacement's inode number is higher, or lower, than the locked one's, so no ordering
    comparison can stand in for identity."""
    lock = Path(str(store.partial_path(SHA)) + ".lock")
    lock.parent.mkdir(parents=True)
    files = []
    for i in range(2):
        spare = lock.parent / f"spare{i}"
        spare.write_text("")
        files.append(spare)
    lower, higher = sorted(files, key=lambda p: os.stat(p).st_ino)
    locked, newer = (lower, higher) if replacement == "higher" else (higher, lower)
    os.replace(locked, lock)  # the lock a download held
    old = os.stat(lock)
    real_stat = os.stat

    def stat(path, *a, **kw):
        if Path(path) == lock and os.path.exists(newer):
            os.replace(newer, lock)  # between our open() and our check of the name
        return real_stat(path, *a, **kw)
    monkeypatch.setattr(os, "stat", stat)
    store.drop_partial_lock(SHA)
    monkeypatch.setattr(os, "stat", real_stat)
    assert lock.exists() and os.stat(lock).st_ino != old.st_ino


def test_a_symbolic_link_at_a_partial_lock_is_not_followed(store, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    lock = Path(str(store.partial_path(SHA)) + ".lock")
    lock.parent.mkdir(parents=True)
    os.symlink(target, lock)
    store.drop_partial_lock(SHA)
    assert lock.is_symlink() and target.exists()


# ---- fetch_blob --------------------------------------------------------------------------
def _source(data: bytes, log: list | None = None, *, fail_after: int | None = None, exc=SourceUnreachable):
    """(open_from) serving `data` from an offset, in 1000-byte chunks; records the offsets asked
    for; optionally breaks off (raises `exc`) after `fail_after` bytes of one transfer."""
    def open_from(offset: int):
        if log is not None:
            log.append(offset)
        sent = 0
        for i in range(offset, len(data), 1000):
            if fail_after is not None and sent >= fail_after:
                raise exc("connection reset")
            chunk = data[i:i + 1000]
            sent += len(chunk)
            yield chunk
        if fail_after is not None and sent >= fail_after and offset + sent < len(data):
            raise exc("connection reset")
    return open_from


def _refusing(exc):
    def open_from(offset):
        raise exc
        yield b""  # a generator, like the real sources (never reached)
    return open_from


def test_fetch_places_verified_bytes_read_only_and_leaves_no_partial(store):
    log: list[int] = []
    assert transfer.fetch_blob(store, SHA, len(DATA), [("a", _source(DATA, log))], "x") == store.path(SHA)
    assert store.path(SHA).read_bytes() == DATA and log == [0]
    assert stat.S_IMODE(store.path(SHA).stat().st_mode) == 0o444
    assert not store.partial_path(SHA).exists()
    # present and good: no source is asked
    assert transfer.fetch_blob(store, SHA, len(DATA), [("b", _refusing(AssertionError("asked")))], "x") == store.path(SHA)
    store.remove(SHA)  # its folder stays: fetched again into it
    transfer.fetch_blob(store, SHA, len(DATA), [("a", _source(DATA))], "x")
    assert store.check(SHA, rehash=True) == "ok"


@pytest.mark.parametrize("bad", [DATA[:-1] + b"!", DATA + b"more", DATA[:-1]], ids=["changed", "appended", "short"])
def test_fetch_refuses_bytes_that_do_not_match_and_installs_nothing(store, bad):
    with pytest.raises(IntegrityError, match="checksum mismatch") as e:
        transfer.fetch_blob(store, SHA, len(DATA), [("evil", _source(bad))], "m.onnx")
    assert e.value.message.startswith(f"m.onnx from evil: checksum mismatch (expected sha256 {SHA[:12]}… and "
                                      f"{len(DATA)} bytes, got ")
    if len(bad) <= len(DATA):  # (appended bytes: the download stops at the first chunk too many)
        assert e.value.message.endswith(f"got {hashlib.sha256(bad).hexdigest()[:12]}… and {len(bad)} bytes)")
    assert "m.onnx from evil" in e.value.message and "nothing was installed" in e.value.hint
    assert not store.present(SHA) and not store.partial_path(SHA).exists()


def test_fetch_tries_mirrors_in_order_past_bad_bytes(store):
    first, second, third = [], [], []
    sources = [("bad", _source(DATA[::-1], first)), ("good", _source(DATA, second)), ("unused", _source(DATA, third))]
    transfer.fetch_blob(store, SHA, len(DATA), sources, "x")
    assert store.check(SHA, rehash=True) == "ok"
    assert (first, second, third) == ([0], [0], [])


def test_fetch_resumes_a_broken_transfer_from_the_partial_file(store):
    log: list[int] = []
    transfer.fetch_blob(store, SHA, len(DATA), [("flaky", _source(DATA, log, fail_after=3000))], "x")
    assert log == [0, 3000, 6000] and store.path(SHA).read_bytes() == DATA


def test_fetch_gives_up_on_a_source_after_its_retries(store):
    log: list[int] = []
    with pytest.raises(SourceUnreachable):
        transfer.fetch_blob(store, SHA, len(DATA), [("slow", _source(DATA, log, fail_after=1000))], "x")
    assert log == [i * 1000 for i in range(transfer.RETRIES + 1)]
    assert store.partial_path(SHA).stat().st_size == (transfer.RETRIES + 1) * 1000  # kept for the next try
    # a later pull resumes from it
    log.clear()
    transfer.fetch_blob(store, SHA, len(DATA), [("ok", _source(DATA, log))], "x")
    assert log == [(transfer.RETRIES + 1) * 1000] and store.check(SHA, rehash=True) == "ok"


def test_a_source_that_breaks_without_progress_is_not_retried(store):
    log: list[int] = []
    with pytest.raises(SourceUnreachable, match="connection reset"):
        transfer.fetch_blob(store, SHA, len(DATA), [("dead", _source(DATA, log, fail_after=0))], "x")
    assert log == [0]


def test_a_broken_transfer_is_retried_only_while_the_partial_file_grows(store):
    p = store.partial_path(SHA)
    p.parent.mkdir(parents=True)
    p.write_bytes(DATA[:3000])  # a good prefix from an earlier pull
    log: list[int] = []
    with pytest.raises(SourceUnreachable):
        transfer.fetch_blob(store, SHA, len(DATA), [("dead", _source(DATA, log, fail_after=0))], "x")
    assert log == [3000] and p.stat().st_size == 3000  # no progress: not retried, the prefix kept
    p.write_bytes(DATA + b"junk")  # longer than the blob: discarded, so the file shrinks
    log.clear()
    with pytest.raises(SourceUnreachable):
        transfer.fetch_blob(store, SHA, len(DATA), [("flaky", _source(DATA, log, fail_after=1000))], "x")
    assert log == [0]  # shorter than before the attempt: not progress, not retried


def test_a_source_sending_more_than_the_blob_is_cut_off_not_read_to_its_end(store):
    sent = []

    def endless(offset):
        for _ in range(1000):  # a hostile or broken server: far more than the blob (bounded, so a bug fails, not hangs)
            sent.append(1)
            yield DATA[:1000]
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        transfer.fetch_blob(store, SHA, len(DATA), [("endless", endless)], "x")
    assert len(sent) < 2 * (len(DATA) // 1000 + 1)  # one chunk too many, and what the prefetch had queued


def test_a_transfer_that_broke_after_one_byte_is_resumed(store):
    log: list[int] = []

    def one_byte_then_the_rest(offset):
        log.append(offset)
        yield DATA[offset:offset + 1]
        if offset == 0:
            raise SourceUnreachable("reset")
        yield DATA[offset + 1:]
    transfer.fetch_blob(store, SHA, len(DATA), [("flaky", one_byte_then_the_rest)], "x")
    assert log == [0, 1] and store.path(SHA).read_bytes() == DATA


def test_a_partial_file_longer_than_the_blob_is_restarted(store):
    p = store.partial_path(SHA)
    p.parent.mkdir(parents=True)
    p.write_bytes(DATA + b"junk")
    log: list[int] = []
    transfer.fetch_blob(store, SHA, len(DATA), [("a", _source(DATA, log))], "x")
    assert log == [0] and store.path(SHA).read_bytes() == DATA


def test_a_partial_file_of_exactly_the_blob_is_verified_not_refetched(store):
    p = store.partial_path(SHA)
    p.parent.mkdir(parents=True)
    p.write_bytes(DATA)
    log: list[int] = []
    transfer.fetch_blob(store, SHA, len(DATA), [("a", _source(DATA, log))], "x")
    assert log == [len(DATA)] and store.path(SHA).read_bytes() == DATA


def test_a_partial_file_with_bad_bytes_fails_and_is_not_resumed_from(store):
    p = store.partial_path(SHA)
    p.parent.mkdir(parents=True)
    p.write_bytes(b"X" * 4000)
    with pytest.raises(IntegrityError):
        transfer.fetch_blob(store, SHA, len(DATA), [("a", _source(DATA))], "x")
    assert not p.exists() and not store.present(SHA)
    log: list[int] = []
    transfer.fetch_blob(store, SHA, len(DATA), [("a", _source(DATA, log))], "x")
    assert log == [0]


def test_fetch_error_classes_say_why(store):
    size = len(DATA)

    def fetch(*sources):
        return transfer.fetch_blob(store, SHA, size, list(sources), "m")
    denied, unreachable = AccessDenied("401", hint="set the token"), SourceUnreachable("refused", hint="network")
    with pytest.raises(AccessDenied, match="401") as e:
        fetch(("a", _refusing(denied)))
    assert e.value.hint == "set the token"
    with pytest.raises(AccessDenied) as e:  # every mirror refuses: the first refusal is reported
        fetch(("a", _refusing(denied)), ("b", _refusing(AccessDenied("403", hint="other"))))
    assert (e.value.message, e.value.hint) == ("401", "set the token")
    with pytest.raises(AccessDenied):  # refused somewhere, unreachable elsewhere: the refusal is the news
        fetch(("a", _refusing(unreachable)), ("b", _refusing(denied)))
    with pytest.raises(SourceUnreachable) as e:  # every source unreachable: the last one's error
        fetch(("a", _refusing(unreachable)), ("b", _refusing(SourceUnreachable("down", hint="retry later"))))
    assert type(e.value) is SourceUnreachable and e.value.message == "down" and e.value.hint == "retry later"
    with pytest.raises(StorageError, match="not found on a") as e:
        fetch(("a", _refusing(FileNotFoundError("x"))))
    assert type(e.value) is StorageError
    with pytest.raises(StorageError, match="could not be downloaded") as e:  # denied + plain storage error
        fetch(("a", _refusing(denied)), ("b", _refusing(StorageError("disk"))))
    assert type(e.value) is StorageError and "401" in e.value.message and "disk" in e.value.message
    with pytest.raises(StorageError, match="no source") as e:
        fetch()
    assert type(e.value) is StorageError
    with pytest.raises(IntegrityError, match="checksum mismatch"):  # bad bytes anywhere outrank the rest
        fetch(("a", _refusing(unreachable)), ("b", _source(DATA[::-1])), ("c", _refusing(denied)))


@pytest.mark.parametrize("claimed", [len(DATA) + 1, len(DATA) - 1])
def test_a_claimed_size_other_than_the_bytes_is_refused_even_when_the_digest_matches(store, tmp_path, claimed):
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        transfer.fetch_blob(store, SHA, claimed, [("a", _source(DATA))], "x")
    assert not store.present(SHA)
    f = tmp_path / "download"
    f.write_bytes(DATA)
    with pytest.raises(IntegrityError, match=f"and {claimed} bytes, got {SHA[:12]}… and {len(DATA)} bytes"):
        transfer.adopt_file(store, f, SHA, claimed, "x")
    assert not store.present(SHA) and not f.exists()


def test_adopt_file_moves_a_verified_file_and_refuses_a_bad_one(store, tmp_path):
    f = tmp_path / "download"
    f.write_bytes(DATA)
    assert transfer.adopt_file(store, f, SHA, len(DATA), "x") == store.path(SHA)
    assert not f.exists() and store.path(SHA).read_bytes() == DATA
    assert stat.S_IMODE(store.path(SHA).stat().st_mode) == 0o444
    store.remove(SHA)
    f.write_bytes(DATA[::-1])
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        transfer.adopt_file(store, f, SHA, len(DATA), "x")
    assert not f.exists() and not store.present(SHA)


def test_prefetch_yields_every_chunk_in_order_and_closes_a_stream_left_early():
    closed = []

    def chunks():
        try:
            yield from (bytes([i]) for i in range(10))
        finally:
            closed.append(True)
    assert list(transfer._prefetch(chunks())) == [bytes([i]) for i in range(10)]
    assert closed == [True]
    closed.clear()
    it = transfer._prefetch(chunks())
    assert next(it) == b"\x00"
    it.close()  # the consumer stops early (too many bytes): the producer's stream is closed
    assert closed == [True]


def test_prefetch_closes_a_stream_that_is_not_a_generator():
    """An HTTP response: iterable, with close(), and still referenced by its owner (so nothing
    but an explicit close releases it)."""
    class Response:
        def __init__(self):
            self.chunks, self.closed = [b"a", b"b"], 0

        def __iter__(self):
            return self

        def __next__(self):
            if not self.chunks:
                raise StopIteration
            return self.chunks.pop(0)

        def close(self):
            self.closed += 1
    r = Response()
    assert list(transfer._prefetch(r)) == [b"a", b"b"]
    assert r.closed == 1
    assert list(transfer._prefetch([b"x"])) == [b"x"]  # a list iterator has no close(): fine


def test_prefetch_hands_the_producers_exception_to_the_consumer():
    def chunks():
        yield b"a"
        raise SourceUnreachable("reset")
    it = transfer._prefetch(chunks())
    assert next(it) == b"a"
    with pytest.raises(SourceUnreachable, match="reset"):
        next(it)
