"""What a remote hit checks of each object it installs, in-process on a folder remote: blake3 (the
local cache's name for it, the digest the entry and the lockfile record), while the bytes stream
(zoo.download) and over the whole file when the download resumed, so an entry whose sha256 points
at other bytes installs nothing; and a file a download verified by sha256 spares the publish a
second hash (zoo.files.remember_sha256)."""

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


def test_a_resumed_download_is_checked_over_the_whole_file(tmp_path):
    """A download a finished process left half done is resumed: blake3 covers the bytes it had
    and the ones it fetched, so a wrong prefix is caught too (and fetched again from the start)."""
    from zoo.download import _HOST

    url, entry = _pushed(tmp_path)
    b = _b(tmp_path, url)
    digest = entry.files["model.bin"]["digest"]
    sha = FsCacheStore(url).read_entry(KEY)
    sha = json.loads(sha)["sha256"][digest]
    partial = b.cache.root / "partial"
    partial.mkdir(parents=True)
    gone = 2 ** 22 + 1  # no such process: its leftover may be adopted
    good = partial / f"{sha}.{_HOST}.{gone}.0123456789ab.incomplete"
    good.write_bytes(DATA["model.bin"][:5000])
    fetched = b.fetch(KEY)
    assert fetched is not None and (b.cache.materialize(fetched) / "model.bin").read_bytes() == DATA["model.bin"]
    assert not good.exists()

    c = Cache(tmp_path / "c").ensure()
    (c.root / "partial").mkdir()
    bad = c.root / "partial" / good.name
    bad.write_bytes(b"X" * 5000)  # a prefix that is not the file's: dropped, the file fetched whole
    fetched = RemoteCache(c, RemoteCacheSetting(url)).fetch(KEY)
    assert fetched is not None and (c.materialize(fetched) / "model.bin").read_bytes() == DATA["model.bin"]


def test_an_entry_whose_blake3_and_sha256_name_different_bytes_installs_nothing(tmp_path):
    """A forged entry maps one object's blake3 name to the sha256 of another object the remote
    holds: those bytes are not the ones the blake3 digest names, and the local cache never files
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
    with pytest.raises(IntegrityError, match="bytes disagree with it .*checksum mismatch \\(expected blake3"):
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
