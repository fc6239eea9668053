"""What a remote hit checks of each object it installs, in-process on a folder remote: sha256 while
the bytes stream (zoo.download) and blake3 — from the same stream when the download ran in one go,
from the file when it resumed — so an entry whose two digests name different bytes installs nothing;
and the sha256 a download verified spares the publish a second hash (zoo.files.remember_sha256)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from zoo import files
from zoo.engine import hashing
from zoo.engine.cache import Cache
from zoo.engine.cache_config import RemoteCacheSetting
from zoo.engine.cache_store import FsCacheStore
from zoo.engine.remote_cache import RemoteCache
from zoo.errors import IntegrityError

KEY = "cd" * 32
DATA = {"model.bin": bytes(range(256)) * 64, "other.bin": b"other bytes\n" * 100}


def _pushed(tmp_path: Path):
    """Machine A's cache with one entry, pushed to a folder remote; (url, entry)."""
    a = Cache(tmp_path / "a").ensure()
    out = tmp_path / "a-out"
    out.mkdir()
    for rel, data in DATA.items():
        (out / rel).write_bytes(data)
    entry = a.commit(key=KEY, stage="train", kind="writer", out_dir=out,
                     outputs={"model": "model.bin", "other": "other.bin"}, metrics={}, parts={}, duration_s=0.1)
    url = str(tmp_path / "remote")
    RemoteCache(a, RemoteCacheSetting(url)).push(entry)
    return url, entry


def _b(tmp_path: Path, url: str) -> RemoteCache:
    return RemoteCache(Cache(tmp_path / "b").ensure(), RemoteCacheSetting(url))


def test_blake3_comes_from_the_stream_no_file_is_read_again(tmp_path, monkeypatch):
    url, entry = _pushed(tmp_path)
    reread: list[Path] = []
    real = hashing.hash_file_uncached
    monkeypatch.setattr(hashing, "hash_file_uncached", lambda p: (reread.append(Path(p)), real(p))[1])
    b = _b(tmp_path, url)
    fetched = b.fetch(KEY)
    assert fetched is not None and reread == []
    for rel, data in DATA.items():
        assert (b.cache.materialize(fetched) / rel).read_bytes() == data


def test_a_download_whose_stream_did_not_cover_the_file_is_hashed_from_its_file(tmp_path, monkeypatch):
    """A resumed download's stream starts mid-file, so the tap has no digest (stood in for here):
    blake3 is then read from the file, and the object is still checked."""
    from zoo.engine import remote_cache

    url, entry = _pushed(tmp_path)
    reread: list[Path] = []
    real = hashing.hash_file_uncached
    monkeypatch.setattr(hashing, "hash_file_uncached", lambda p: (reread.append(Path(p)), real(p))[1])
    monkeypatch.setattr(remote_cache._Blake3Tap, "digest", lambda self: None)
    assert _b(tmp_path, url).fetch(KEY) is not None
    assert len(reread) == len(DATA)


def test_an_entry_whose_blake3_and_sha256_name_different_bytes_installs_nothing(tmp_path):
    """A forged entry maps one object's blake3 name to the sha256 of another object the remote
    holds: the bytes pass the sha256 check but not the blake3 one, and the local cache never files
    them under a name that is not theirs."""
    url, entry = _pushed(tmp_path)
    store = FsCacheStore(url)
    path = Path(store._entry_path(KEY))
    doc = json.loads(path.read_text())
    model, other = entry.files["model.bin"]["digest"], entry.files["other.bin"]["digest"]
    doc["sha256"][model] = doc["sha256"][other]
    doc["entry"]["files"]["model.bin"]["size"] = len(DATA["other.bin"])
    doc["entry"]["outputs"]["model"]["digest"] = model
    os.chmod(path, 0o644)
    path.write_text(json.dumps(doc))
    b = _b(tmp_path, url)
    with pytest.raises(IntegrityError, match="blake3 and sha256 digests disagree"):
        b.fetch(KEY)
    assert not b.cache.object_path(model).exists() and b.cache.lookup(KEY) is None


def test_a_file_a_download_verified_is_linked_without_hashing_it_again(tmp_path, monkeypatch):
    src = tmp_path / "object"
    src.write_bytes(DATA["model.bin"])
    os.chmod(src, 0o444)
    sha, size = files.sha256_and_size(src)
    files.remember_sha256(src, sha)
    hashed: list[int] = []
    real = files._fill_verified
    monkeypatch.setattr(files, "_fill_verified", lambda *a: (hashed.append(1), real(*a))[1])
    files.link_verified(src, tmp_path / "blob", sha, size, "x")
    assert hashed == [] and os.path.samefile(src, tmp_path / "blob")


def test_a_remembered_file_changed_since_is_hashed_and_refused(tmp_path):
    src = tmp_path / "object"
    src.write_bytes(DATA["model.bin"])
    sha, size = files.sha256_and_size(src)
    files.remember_sha256(src, sha)
    data = bytearray(DATA["model.bin"])
    data[10] ^= 1
    src.write_bytes(bytes(data))  # same inode and size, a new mtime
    os.utime(src, ns=(os.stat(src).st_atime_ns, os.stat(src).st_mtime_ns + 1_000_000))
    with pytest.raises(IntegrityError, match="does not match"):
        files.link_verified(src, tmp_path / "blob", sha, size, "x")
    assert not (tmp_path / "blob").exists()
