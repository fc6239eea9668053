"""The remote run cache's store contract (`zoo.engine.cache_store.CacheStore`), and the promises
`RemoteCache` builds on it, checked on every backend against a real server: a local folder, S3
(moto), Google Cloud Storage (fake-gcs-server), Azure Blob (azurite), WebDAV (wsgidav) and SSH/SFTP
(OpenSSH's sshd). A new backend joins `STORE_KINDS`."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import pytest

from remote_fixtures import Backend
from zoo.engine.cache import Cache
from zoo.engine.cache_config import RemoteCacheSetting
from zoo.engine.cache_store import FsCacheStore
from zoo.engine.remote_cache import RemoteCache
from zoo.errors import IntegrityError, SourceUnreachable
from zoo.files import sha256_and_size

STORE_KINDS = ["folder", "s3", "gcs", "azure", "webdav", "ssh"]
KEY = "ab" * 32


@pytest.fixture(params=STORE_KINDS)
def remote(request, tmp_path, monkeypatch) -> Backend:
    return Backend(request.param, request, tmp_path, monkeypatch)


def _store(remote: Backend) -> FsCacheStore:
    return FsCacheStore(remote.url, remote.options)


def _remote_cache(cache: Cache, remote: Backend) -> RemoteCache:
    return RemoteCache(cache, RemoteCacheSetting(remote.url, dict(remote.options)), store=_store(remote))


def _committed(root: Path, key: str = KEY, files: dict[str, bytes] | None = None) -> tuple[Cache, object]:
    """A local cache holding one entry for `key` whose outputs are `files`."""
    cache = Cache(root).ensure()
    out = root.parent / f"{root.name}-out"
    files = files or {"model.bin": bytes(range(256)) * 40, "sub/notes.txt": b"notes\n"}
    for rel, data in files.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data)
    entry = cache.commit(key=key, stage="train", kind="writer", out_dir=out,
                         outputs={"model": "model.bin", "extra": "sub"}, metrics={"acc": 0.5}, parts={}, duration_s=1.0)
    return cache, entry


# --- the store ------------------------------------------------------------------------------

def test_an_entry_is_created_once_and_never_overwritten(remote):
    store = _store(remote)
    assert store.read_entry(KEY) is None
    assert store.create_entry(KEY, b'{"first": 1}') is True
    assert store.create_entry(KEY, b'{"second": 2}') is False
    assert store.read_entry(KEY) == b'{"first": 1}'
    assert sorted(store.keys()) == [KEY]


def test_of_concurrent_creates_of_one_key_exactly_one_wins(remote):
    results: dict[int, bool] = {}

    def create(i: int) -> None:
        results[i] = _store(remote).create_entry(KEY, json.dumps({"writer": i}).encode())

    threads = [threading.Thread(target=create, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, created in results.items() if created]
    assert len(winners) == 1, results
    assert json.loads(_store(remote).read_entry(KEY)) == {"writer": winners[0]}


def test_objects_are_found_by_sha256_and_size_and_served_from_any_offset(remote, tmp_path):
    store = _store(remote)
    data = bytes(range(256)) * 300
    local = tmp_path / "obj"
    local.write_bytes(data)
    sha, size = sha256_and_size(local)
    assert not store.has_object(sha, size)
    store.put_object(local, sha)
    assert store.has_object(sha, size)
    assert not store.has_object(sha, size + 1)  # a different size is not this object
    source = store.object_source(sha, size)
    assert b"".join(source.open_from(0)) == data
    assert b"".join(source.open_from(1000)) == data[1000:]  # ranged: what resuming a download needs


def test_only_hex_keys_become_remote_paths(remote):
    from zoo.errors import InvalidInput

    with pytest.raises(InvalidInput):
        _store(remote).read_entry("../../etc/passwd")


@pytest.mark.parametrize("remote", ["s3", "gcs", "azure", "webdav", "ssh"], indirect=True)
def test_an_unreachable_store_raises_source_unreachable(remote):
    url, options = remote.dead_options()
    with pytest.raises(SourceUnreachable):
        FsCacheStore(url, options).read_entry(KEY)


# --- RemoteCache on the store ---------------------------------------------------------------

def test_a_pushed_entry_is_fetched_into_a_fresh_cache_with_identical_bytes(remote, tmp_path):
    a, entry = _committed(tmp_path / "a")
    assert _remote_cache(a, remote).push(entry)["created"] == 1
    again = _remote_cache(a, remote).push(entry)
    assert again == {"created": 0, "objects": 0, "bytes": 0}  # never overwritten, nothing re-sent
    b = Cache(tmp_path / "b").ensure()
    fetched = _remote_cache(b, remote).fetch(KEY)
    assert fetched is not None and b.lookup(KEY) is not None
    assert fetched.output_digests() == entry.output_digests() and fetched.metrics == {"acc": 0.5}
    for rel, path in [(rel, b.materialize(fetched) / rel) for rel in entry.files]:
        assert path.read_bytes() == (a.materialize(entry) / rel).read_bytes()
    assert _remote_cache(Cache(tmp_path / "c").ensure(), remote).fetch("cd" * 32) is None  # a miss


def test_a_tampered_object_is_refused_and_nothing_is_installed(remote, tmp_path):
    a, entry = _committed(tmp_path / "a")
    _remote_cache(a, remote).push(entry)
    doc = json.loads(_store(remote).read_entry(KEY))
    sha = doc["sha256"][entry.files["model.bin"]["digest"]]
    remote.flip(f"objects/sha256/{sha[:2]}/{sha}")
    b = Cache(tmp_path / "b").ensure()
    with pytest.raises(IntegrityError):
        _remote_cache(b, remote).fetch(KEY)
    assert b.read_entry(KEY) is None
    assert not any(b.objects.rglob("*")) or all(p.is_dir() for p in b.objects.rglob("*"))
    assert not any(p.is_file() for p in (b.root / "partial").rglob("*"))


def test_an_entry_whose_digests_disagree_is_refused(remote, tmp_path):
    a, entry = _committed(tmp_path / "a")
    rc = _remote_cache(a, remote)
    rc.push(entry)
    doc = json.loads(_store(remote).read_entry(KEY))
    # a forged entry under another key: the same sha256 objects, a blake3 digest they do not have
    forged = "cd" * 32
    doc["key"] = doc["entry"]["key"] = forged
    model = doc["entry"]["files"]["model.bin"]
    sha = doc["sha256"].pop(model["digest"])
    model["digest"] = "0" * 64
    doc["entry"]["outputs"]["model"]["digest"] = "0" * 64
    doc["sha256"]["0" * 64] = sha
    _store(remote).create_entry(forged, json.dumps(doc).encode())
    b = Cache(tmp_path / "b").ensure()
    with pytest.raises(IntegrityError, match="disagree"):
        _remote_cache(b, remote).fetch(forged)
    assert b.read_entry(forged) is None


def test_an_entry_naming_a_path_outside_its_folder_is_refused(remote, tmp_path):
    a, entry = _committed(tmp_path / "a")
    doc = {"schema_version": 1, "key": KEY, "entry": {**entry.to_json(), "files": {
        "../escape": entry.files["model.bin"], **entry.files}},
        "sha256": {m["digest"]: "0" * 64 for m in entry.files.values()}}
    _store(remote).create_entry(KEY, json.dumps(doc).encode())
    with pytest.raises(IntegrityError, match="outside"):
        _remote_cache(Cache(tmp_path / "b").ensure(), remote).fetch(KEY)


def test_a_push_cut_off_between_objects_and_entry_leaves_no_hit_stand_in_crash(remote, tmp_path):
    """Stand-in: the store's create_entry raises (as a process killed at that instant would stop),
    after every object was uploaded."""
    a, entry = _committed(tmp_path / "a")
    store = _store(remote)

    def crash(key, data):
        raise KeyboardInterrupt("killed between the objects and the entry")

    store.create_entry = crash
    rc = RemoteCache(a, RemoteCacheSetting(remote.url, dict(remote.options)), store=store)
    with pytest.raises(KeyboardInterrupt):
        rc.push(entry)
    fresh = _store(remote)
    assert list(fresh.keys()) == [] and fresh.read_entry(KEY) is None
    assert _remote_cache(Cache(tmp_path / "b").ensure(), remote).fetch(KEY) is None  # no false hit
    assert _remote_cache(a, remote).push(entry) == {"created": 1, "objects": 0, "bytes": 0}  # a retry finishes it
    assert _remote_cache(Cache(tmp_path / "c").ensure(), remote).fetch(KEY) is not None


def test_an_interrupted_fetch_resumes_from_what_it_had(remote, tmp_path):
    """A fetch killed mid-download left the first half of an object in partial/ (named as
    zoo.download names a dead process's temporary file); the next fetch asks the remote only for
    the rest. The offsets are recorded by a wrapper around the store's real source."""
    import subprocess
    import sys

    from zoo.download import _HOST, Source

    a, entry = _committed(tmp_path / "a")
    _remote_cache(a, remote).push(entry)
    sha = json.loads(_store(remote).read_entry(KEY))["sha256"][entry.files["model.bin"]["digest"]]
    data = (a.materialize(entry) / "model.bin").read_bytes()
    b = Cache(tmp_path / "b").ensure()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = b.root / "partial" / f"{sha}.{_HOST}.{int(dead.stdout)}.abcdef012345.incomplete"
    leftover.parent.mkdir(parents=True)
    leftover.write_bytes(data[:4000])
    store = _store(remote)
    offsets: list[int] = []
    real = store.object_source

    def recording(sha256, size):
        src = real(sha256, size)
        return Source(src.label, lambda offset: (offsets.append(offset), src.open_from(offset))[1])

    store.object_source = recording
    fetched = RemoteCache(b, RemoteCacheSetting(remote.url, dict(remote.options)), store=store).fetch(KEY)
    assert fetched is not None and (b.materialize(fetched) / "model.bin").read_bytes() == data
    assert 4000 in offsets and not leftover.exists()


@pytest.mark.parametrize("remote", ["gcs"], indirect=True)
def test_a_gcs_upload_cut_off_mid_way_leaves_no_object(remote, tmp_path, monkeypatch):
    """An object over gcsfs's single-request limit (5 MiB) goes up as a resumable upload, which GCS
    shows only once finalised: a connection lost between its chunks leaves nothing behind; the
    retry uploads it whole."""
    import gcsfs.core

    data = bytes(range(256)) * (6 * 4096 + 7)  # 6 MiB and a bit
    local = tmp_path / "big"
    local.write_bytes(data)
    sha, size = sha256_and_size(local)
    store = _store(remote)
    real = gcsfs.core.upload_chunk

    async def lost(fs, location, bit, offset, total, content_type):
        raise ConnectionResetError("connection lost mid-upload")

    monkeypatch.setattr(gcsfs.core, "upload_chunk", lost)
    monkeypatch.setattr(gcsfs.core.GCSFileSystem, "_put_file",
                        functools.partialmethod(gcsfs.core.GCSFileSystem._put_file, chunksize=1 << 20))
    with pytest.raises(SourceUnreachable):
        store.put_object(local, sha)
    assert not store.has_object(sha, size) and remote.stat_size(f"objects/sha256/{sha[:2]}/{sha}") is None
    monkeypatch.setattr(gcsfs.core, "upload_chunk", real)
    store.put_object(local, sha)
    assert store.has_object(sha, size)
    assert b"".join(store.object_source(sha, size).open_from(5_000_000)) == data[5_000_000:]


def test_a_store_whose_marker_write_lost_a_race_goes_on_when_the_marker_is_there(tmp_path, monkeypatch):
    """Two first users of a new remote write its marker at once; a WebDAV server may fail the
    loser's MOVE with a 500 (wsgidav does, now and then, in the concurrent-create test above)
    instead of refusing it. The loser goes on when the winner's marker is there, and fails
    when it is not."""
    from zoo.engine import cache_store
    from zoo.storage.fsbackend import FsBackend

    url = str(tmp_path / "remote")
    store = FsCacheStore(url)
    real_create = FsBackend.create

    def racing(self, rpath, data):
        created = real_create(self, rpath, data)  # (the marker: the other first user's)
        if rpath.endswith(cache_store.MARKER):
            raise FileNotFoundError(f"write {rpath}")  # and this request failed
        return created

    monkeypatch.setattr(FsBackend, "create", racing)
    assert store.create_entry(KEY, b"{}") is True and store.read_entry(KEY) == b"{}"
    assert json.loads((tmp_path / "remote" / cache_store.MARKER).read_text()) == {"schema_version": 1}

    def failing(self, rpath, data):
        if rpath.endswith(cache_store.MARKER):
            raise FileNotFoundError(f"write {rpath}")
        return real_create(self, rpath, data)

    monkeypatch.setattr(FsBackend, "create", failing)
    with pytest.raises(FileNotFoundError, match="write .*zoo-run-cache.json"):
        FsCacheStore(str(tmp_path / "other")).create_entry(KEY, b"{}")
