"""Unit tests of the content-addressed cache and hashing."""

from __future__ import annotations

import math
import os

import pytest

from zoo.engine import hashing
from zoo.engine.lockfile import record_identity
from zoo.engine.cache import Cache
from zoo.errors import Unhashable


def _commit(cache: Cache, tmp_path, key: str, content: bytes):
    out = tmp_path / f"out-{key}"
    (out / "sub").mkdir(parents=True)
    (out / "model.bin").write_bytes(content)
    (out / "sub" / "note.txt").write_text("n")
    return cache.commit(key=key, stage="s", kind="k", out_dir=out, outputs={"model": "model.bin", "folder": "sub"},
                        metrics={"m": 1}, parts={"config": {"key": key}}, duration_s=0.1)


def test_commit_lookup_materialize(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, tmp_path, "k" * 64, b"abc")
    assert cache.lookup("k" * 64).outputs == entry.outputs
    paths = cache.output_paths(entry)
    assert paths["model"].read_bytes() == b"abc"
    assert (paths["folder"] / "note.txt").read_text() == "n"
    obj = cache.object_path(hashing.hash_file_uncached(paths["model"]))
    assert os.stat(obj).st_ino == os.stat(paths["model"]).st_ino  # hardlinked, not copied
    assert not os.access(obj, os.W_OK) or os.geteuid() == 0  # objects are read-only


def test_missing_object_is_not_a_hit(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, tmp_path, "a" * 64, b"abc")
    cache.object_path(entry.outputs["model"]["digest"]).unlink()
    assert cache.lookup("a" * 64) is None
    assert cache.read_entry("a" * 64) is not None


def test_same_content_stored_once(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    _commit(cache, tmp_path, "a" * 64, b"same")
    _commit(cache, tmp_path, "b" * 64, b"same")
    assert len(list(cache.objects.glob("*/*"))) == 2  # model.bin and note.txt, each once


def test_gc_removes_unreferenced(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    _commit(cache, tmp_path, "a" * 64, b"one")
    _commit(cache, tmp_path, "b" * 64, b"two" * 1000)
    result = cache.gc({record_identity({"config": {"key": "a" * 64}})})  # gc keeps entries by their record
    assert result["entries_removed"] == 1 and result["objects_removed"] == 1
    assert result["bytes_freed"] == 3000
    assert cache.lookup("a" * 64) is not None and cache.lookup("b" * 64) is None


def test_unreadable_entry_schema_is_a_miss(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    _commit(cache, tmp_path, "a" * 64, b"x")
    path = cache.entry_path("a" * 64)
    path.write_text(path.read_text().replace('"schema_version": 1', '"schema_version": 99'))
    assert cache.lookup("a" * 64) is None


def test_stat_cache_never_hashes_an_unchanged_file_twice(tmp_path, monkeypatch):
    f = tmp_path / "big.bin"
    f.write_bytes(b"x" * 1000)
    calls = []
    real = hashing.hash_file_uncached
    monkeypatch.setattr(hashing, "hash_file_uncached", lambda p: calls.append(p) or real(p))
    first = hashing.StatCache(tmp_path / "h.sqlite")
    d1 = first.digest(f)
    d2 = hashing.StatCache(tmp_path / "h.sqlite").digest(f)  # another process: persisted
    assert d1 == d2 and len(calls) == 1
    f.write_bytes(b"y" * 1000)
    assert hashing.StatCache(tmp_path / "h.sqlite").digest(f) != d1 and len(calls) == 2
    # other values computed from the same file are kept apart by what computes them
    other = hashing.StatCache(tmp_path / "h.sqlite")
    assert other.remember(f, "size/1", lambda p: str(p.stat().st_size)) == "1000"
    assert hashing.StatCache(tmp_path / "h.sqlite").remember(f, "size/1", lambda p: "recomputed") == "1000"
    assert other.digest(f) == real(f) and len(calls) == 2


@pytest.mark.parametrize("value", [math.nan, {1: "x"}, object(), {"a": {1, 2}}])
def test_canonical_json_refuses_unhashable(value):
    with pytest.raises(Unhashable):
        hashing.canonical_json(value)


def test_canonical_json_is_order_independent():
    assert hashing.digest_json({"a": 1, "b": [1, 2]}) == hashing.digest_json({"b": [1, 2], "a": 1})
