"""The run cache's invariants (zoo/engine/cache.py), in-process and fast: what `commit` records (every
output, its digest, a folder's tree digest, the mode and size of every file, the entry written only
with `record`), that nothing is cached when an output is missing or empty, that `lookup` is a hit
only with a readable entry holding every output and every object, the on-disk layout, read-only
deduplicated objects, materialisation (hardlinks, rebuilt when incomplete, a missing object is an
IntegrityError), what `gc` frees, keeps, skips for a live run, or only counts, and
both under a race with another process (named stand-ins for its gc or its materialisation)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from zoo.engine import cache as cache_mod
from zoo.engine.lockfile import record_identity
from zoo.engine.cache import Cache, Entry, missing_outputs
from zoo.files import atomic_write
from zoo.errors import IntegrityError, StageFailed, StorageError
from zoo.engine.hashing import StatCache, digest_json, hash_file_uncached

KEY = "ab" + "c" * 62


def _out(tmp_path, name="out", **files: bytes):
    out = tmp_path / name
    for rel, data in files.items():
        p = out / rel.replace("__", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _parts(key: str) -> dict:
    """Key parts whose record differs per key, as real ones do (gc keeps entries by record)."""
    return {"p": 2, "config": {"key": key}}


def _record(key: str) -> str:
    return record_identity(_parts(key))


def _commit(cache, out, outputs, key=KEY, **kw):
    args = dict(key=key, stage="s", kind="k", out_dir=out, outputs=outputs, metrics={"m": 1},
                parts=_parts(key), duration_s=1.5, host={"cpu": "x"})
    args.update(kw)
    return cache.commit(**args)


def test_commit_records_every_output_file_and_folder(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    out = _out(tmp_path, **{"model.bin": b"abc", "sub__a.txt": b"a", "sub__deep__b.txt": b"bb", "subx__c": b"c"})
    os.chmod(out / "model.bin", 0o755)
    entry = _commit(cache, out, {"model": "model.bin", "folder": "sub", "folder2": "sub/"})
    (tmp_path / "copy").write_bytes(b"abc")
    files = {"model.bin": {"digest": hash_file_uncached(tmp_path / "copy")}}
    assert entry.files["model.bin"]["size"] == 3 and entry.files["model.bin"]["mode"] == "x"
    assert entry.files["sub/a.txt"]["mode"] == "" and entry.files["sub/deep/b.txt"]["size"] == 2
    assert set(entry.files) == {"model.bin", "sub/a.txt", "sub/deep/b.txt", "subx/c"}
    tree = digest_json({"tree": {"a.txt": entry.files["sub/a.txt"]["digest"],
                                 "deep/b.txt": entry.files["sub/deep/b.txt"]["digest"]}})  # not subx/
    assert entry.outputs == {"model": {"path": "model.bin", "digest": files["model.bin"]["digest"]},
                             "folder": {"path": "sub", "digest": tree}, "folder2": {"path": "sub/", "digest": tree}}
    assert entry.output_digests() == {"model": files["model.bin"]["digest"], "folder": tree, "folder2": tree}
    on_disk = json.loads(cache.entry_path(KEY).read_text())
    assert on_disk == entry.to_json() and on_disk["schema_version"] == 1
    assert (on_disk["metrics"], on_disk["parts"], on_disk["duration_s"], on_disk["host"]) == ({"m": 1}, _parts(KEY), 1.5, {"cpu": "x"})
    assert on_disk["created"] > 0 and (on_disk["key"], on_disk["stage"], on_disk["kind"]) == (KEY, "s", "k")
    assert cache.lookup(KEY).to_json() == entry.to_json()
    assert (cache.output_paths(entry)["folder"] / "deep" / "b.txt").read_bytes() == b"bb"  # nested folders
    only_deep = _commit(cache, _out(tmp_path, "deep", **{"a__b__c.txt": b"c"}), {"o": "a"}, key="d" * 64)
    assert (cache.output_paths(only_deep)["o"] / "b" / "c.txt").read_bytes() == b"c"


def test_objects_are_read_only_named_by_digest_and_keep_the_exec_bit(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    out = _out(tmp_path, **{"run.sh": b"#!/bin/sh\n", "data": b"d"})
    os.chmod(out / "run.sh", 0o755)
    entry = _commit(cache, out, {"x": "run.sh"})
    digest = entry.files["run.sh"]["digest"]
    obj = cache.object_path(digest)
    assert obj == cache.root / "objects" / digest[:2] / digest[2:]
    assert hash_file_uncached(obj) == digest
    mode = stat.S_IMODE(os.stat(obj).st_mode)
    assert mode & 0o222 == 0 and mode & 0o444 == 0o444 and mode & 0o111 == 0o111
    assert stat.S_IMODE(os.stat(cache.object_path(entry.files["data"]["digest"])).st_mode) == 0o444
    assert not (out / "run.sh").exists()  # moved into objects/, not copied
    # the same bytes again: stored once, the source removed
    out2 = _out(tmp_path, "out2", **{"run.sh": b"#!/bin/sh\n"})
    _commit(cache, out2, {"x": "run.sh"}, key="d" * 64)
    assert not (out2 / "run.sh").exists() and len(list(cache.objects.glob("*/*"))) == 2


def test_the_layout(tmp_path):
    cache = Cache(tmp_path / "c")
    assert cache.entry_path(KEY) == tmp_path / "c" / "entries" / "ab" / f"{KEY}.json"
    assert cache.log_path(KEY) == tmp_path / "c" / "logs" / f"{KEY}.log"
    assert cache.object_path("0123ff") == tmp_path / "c" / "objects" / "01" / "23ff"
    assert {p.name for p in (cache.objects, cache.entries, cache.out, cache.logs, cache.locks, cache.tmp, cache.runs)} == \
        {"objects", "entries", "out", "logs", "locks", "tmp", "runs"}
    assert cache.ensure() is cache and all((tmp_path / "c" / d).is_dir()
                                           for d in ("objects", "entries", "out", "logs", "locks", "tmp", "runs"))
    assert cache.lock(KEY).lock_file == str(tmp_path / "c" / "locks" / f"{KEY}.lock")
    assert cache.hashes is cache.hashes and isinstance(cache.hashes, StatCache)
    assert cache.hashes._path == tmp_path / "c" / "hashes.sqlite"
    assert Cache(tmp_path / "absent").hashes._path is None  # plan on a missing cache creates nothing
    assert not (tmp_path / "absent").exists()


def test_an_unusable_cache_dir_is_a_storage_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="cannot create the cache"):
        Cache(tmp_path / "file").ensure()


def test_record_false_stores_the_objects_but_no_entry(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, _out(tmp_path, **{"f": b"x"}), {"o": "f"}, record=False)
    assert not cache.entry_path(KEY).exists() and cache.lookup(KEY) is None
    assert cache.object_path(entry.files["f"]["digest"]).exists()


@pytest.mark.parametrize("files,outputs", [
    ({"f": b"x"}, {"o": "f", "gone": "missing.bin"}),
    ({"f": b""}, {"o": "f"}),  # an empty file
    ({"f": b"x"}, {"o": "folder"}),  # a folder with no files
    ({"subx__f": b"x"}, {"o": "sub"}),  # only a sibling with the same prefix
])
def test_a_missing_or_empty_output_caches_nothing(tmp_path, files, outputs):
    cache = Cache(tmp_path / "c").ensure()
    out = _out(tmp_path, **files)
    (out / "folder").mkdir(exist_ok=True)
    with pytest.raises(StageFailed, match="nothing was cached"):
        _commit(cache, out, outputs)
    assert not cache.entry_path(KEY).exists() and list(cache.objects.glob("*/*")) == []


def test_a_commit_of_a_missing_out_dir_is_refused(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    with pytest.raises(StageFailed):
        _commit(cache, tmp_path / "nowhere", {"o": "f"})


def test_missing_outputs_rules():
    files = {"a": {"size": 1, "digest": "1"}, "e": {"size": 0, "digest": "2"}, "d/x": {"size": 1, "digest": "3"},
             "legacy": {"digest": "4"}}
    assert missing_outputs({"a": {"path": "a"}, "d": {"path": "d"}, "d2": {"path": "d/"}, "l": {"path": "legacy"},
                            "all": {"path": "."}, "all2": {"path": ""}}, files) == []
    assert missing_outputs({"e": {"path": "e"}, "n": {"path": "n"}, "dd": {"path": "d/x/"}, "p": {}}, files) == \
        ["'e' (e)", "'n' (n)", "'dd' (d/x/)"]  # "p" has no path: the whole folder, which has files
    assert missing_outputs({"all": {"path": "."}}, {}) == ["'all' (.)"]


def test_lookup_is_a_hit_only_with_every_output_and_object(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    assert cache.lookup(KEY) is None and cache.read_entry(KEY) is None
    entry = _commit(cache, _out(tmp_path, **{"a": b"1", "b": b"2"}), {"a": "a", "b": "b"})
    assert cache.lookup(KEY) is not None
    cache.object_path(entry.files["b"]["digest"]).unlink()
    assert cache.lookup(KEY) is None and cache.read_entry(KEY) is not None
    # an entry whose outputs are not among its files (written by an older zoo)
    data = entry.to_json()
    data["key"] = "e" * 64
    data["files"].pop("b")
    atomic_write(cache.entry_path("e" * 64), json.dumps(data).encode())
    assert cache.read_entry("e" * 64) is not None and cache.lookup("e" * 64) is None


@pytest.mark.parametrize("text", ["not json", "{}", '{"schema_version": 2}', '{"schema_version": 1, "key": "k"}'])
def test_an_unreadable_entry_is_a_miss(tmp_path, text):
    cache = Cache(tmp_path / "c").ensure()
    cache.entry_path(KEY).parent.mkdir(parents=True)
    cache.entry_path(KEY).write_text(text)
    assert cache.read_entry(KEY) is None and cache.lookup(KEY) is None
    assert list(cache.iter_entries()) == []


def test_an_entry_reads_back_with_defaults_for_optional_fields():
    e = Entry.from_json({"schema_version": 1, "key": "k", "stage": "s", "kind": "x", "outputs": {}, "files": {},
                         "host": None})
    assert (e.metrics, e.parts, e.duration_s, e.created, e.host) == ({}, {}, 0.0, 0.0, {})
    full = Entry(key="k", stage="s", kind="x", outputs={"o": {"path": "f", "digest": "d"}}, files={}, metrics={"a": 1},
                 parts={"b": 2}, duration_s=3.0, created=4.0, host={"h": 1})
    assert Entry.from_json(full.to_json()) == full


def test_iter_entries_lists_every_readable_entry_in_order(tmp_path):
    cache = Cache(tmp_path / "c")
    assert list(cache.iter_entries()) == []  # no cache yet
    cache.ensure()
    for key in ("b" * 64, "a" * 64):
        _commit(cache, _out(tmp_path, key, **{"f": key.encode()}), {"o": "f"}, key=key)
    assert [e.key for e in cache.iter_entries()] == ["a" * 64, "b" * 64]


def test_materialize_hardlinks_and_rebuilds_what_is_missing(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, _out(tmp_path, **{"m": b"model", "d__x": b"x"}), {"m": "m", "d": "d"})
    paths = cache.output_paths(entry)
    assert paths == {"m": cache.out / KEY / "m", "d": cache.out / KEY / "d"}
    assert paths["m"].read_bytes() == b"model" and (paths["d"] / "x").read_bytes() == b"x"
    obj = cache.object_path(entry.files["m"]["digest"])
    assert os.stat(obj).st_ino == os.stat(paths["m"]).st_ino
    (paths["d"] / "x").unlink()
    stray = cache.out / KEY / "stray"
    stray.write_text("left from an older materialisation")
    assert cache.materialize(entry) == cache.out / KEY
    assert (paths["d"] / "x").read_bytes() == b"x" and not stray.exists()  # rebuilt whole
    stray.write_text("kept: the folder is complete")
    assert cache.materialize(entry) == cache.out / KEY and stray.exists()
    assert list(cache.tmp.iterdir()) == []  # no staging left behind


def test_materialize_with_a_missing_object_is_an_integrity_error(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, _out(tmp_path, **{"m": b"model"}), {"m": "m"})
    cache.object_path(entry.files["m"]["digest"]).unlink()
    with pytest.raises(IntegrityError) as e:
        cache.materialize(entry)
    assert f"cache object {entry.files['m']['digest'][:16]}… of stage s is missing" in e.value.message
    assert not (cache.out / KEY).exists() and list(cache.tmp.iterdir()) == []




# --- gc -------------------------------------------------------------------------------------

def _two_entries(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    a = _commit(cache, _out(tmp_path, "a", **{"f": b"a" * 10, "shared": b"s"}), {"o": "f"}, key="a" * 64)
    b = _commit(cache, _out(tmp_path, "b", **{"f": b"b" * 1000, "shared": b"s"}), {"o": "f"}, key="b" * 64)
    cache.log_path("b" * 64).write_text("log")
    return cache, a, b


def test_gc_without_keep_frees_only_garbage(tmp_path):
    cache, a, b = _two_entries(tmp_path)
    cache.output_paths(a)
    (cache.tmp / "leftover" / "sub").mkdir(parents=True)
    (cache.tmp / "leftover" / "sub" / "x").write_bytes(b"x" * 7)  # folders count for nothing, files for their size
    (cache.tmp / "loose").write_bytes(b"y" * 5)
    stray = cache.object_path("ff" + "0" * 62)
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"z" * 100)
    result = cache.gc()
    assert (result["entries_removed"], result["objects_removed"], result["bytes_freed"]) == (0, 1, 112)
    assert not stray.exists() and list(cache.tmp.iterdir()) == [] and list(cache.out.iterdir()) == []
    assert cache.lookup("a" * 64) is not None and cache.lookup("b" * 64) is not None
    assert result["skipped"] == {"runs": [], "entries": 0, "workspaces": 0, "materialised": 0, "objects": 0}


def test_gc_with_keep_removes_the_other_entries_their_logs_and_only_their_own_objects(tmp_path):
    cache, a, b = _two_entries(tmp_path)
    result = cache.gc({_record("a" * 64)})
    assert (result["entries_removed"], result["objects_removed"], result["bytes_freed"]) == (1, 1, 1000)
    assert cache.lookup("a" * 64) is not None and cache.read_entry("b" * 64) is None
    assert not cache.log_path("b" * 64).exists()
    assert cache.object_path(b.files["shared"]["digest"]).exists()  # still used by a


def test_gc_dry_run_counts_and_removes_nothing(tmp_path):
    cache, a, b = _two_entries(tmp_path)
    cache.output_paths(b)
    (cache.tmp / "leftover").write_bytes(b"x" * 3)
    before = sorted(p for p in cache.root.rglob("*") if ".lock" not in p.name)
    result = cache.gc({_record("a" * 64)}, dry_run=True)
    assert (result["entries_removed"], result["objects_removed"], result["bytes_freed"]) == (1, 1, 1003)
    assert sorted(p for p in cache.root.rglob("*") if ".lock" not in p.name) == before


def test_gc_leaves_what_a_live_run_holds(tmp_path):
    cache, a, b = _two_entries(tmp_path)
    held = Cache(cache.root)
    with held.leased():
        held.hold(keys=["b" * 64], digests=["ee" + "0" * 62])
        cache.output_paths(b)
        pending = cache.object_path("ee" + "0" * 62)
        pending.parent.mkdir(parents=True)
        pending.write_bytes(b"being stored")
        workspace = held.tmp_dir("stage-")
        (cache.tmp / "zz-leftover").mkdir()  # after the live run's folder: gc goes on past it
        result = Cache(cache.root).gc({_record("a" * 64)})
        assert result["skipped"]["entries"] == 1 and result["skipped"]["workspaces"] == 1
        assert result["skipped"]["materialised"] == 1 and result["skipped"]["objects"] == 1
        assert result["skipped"]["runs"] == [os.getpid()]
        assert result["entries_removed"] == 0 and result["objects_removed"] == 0
        assert cache.lookup("b" * 64) is not None and pending.exists() and workspace.is_dir()
        assert workspace.parent == held.lease.tmp and not (cache.tmp / "zz-leftover").exists()
    assert held.lease is None
    result = Cache(cache.root).gc({_record("a" * 64)})  # the run ended: now it is garbage
    assert result["entries_removed"] == 1 and not pending.exists() and result["skipped"]["runs"] == []


def test_gc_of_a_missing_cache_creates_nothing(tmp_path):
    assert Cache(tmp_path / "none").gc() == {
        "bytes_freed": 0, "objects_removed": 0, "entries_removed": 0,
        "skipped": {"runs": [], "entries": 0, "workspaces": 0, "materialised": 0, "objects": 0}}
    assert not (tmp_path / "none").exists()


def test_tmp_dir_outside_a_run_is_under_tmp(tmp_path):
    cache = Cache(tmp_path / "c")
    d = cache.tmp_dir("x-")
    assert d.parent == cache.tmp and d.name.startswith("x-") and d.is_dir()


def test_the_mode_records_an_execute_bit_for_anyone_this_user_may_execute(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    out = _out(tmp_path, **{"others": b"1", "owner": b"2", "none": b"3"})
    os.chmod(out / "others", 0o641)  # executable by others only: root may execute it, a user not
    os.chmod(out / "owner", 0o744)
    os.chmod(out / "none", 0o644)
    expected = {n: "x" if os.access(out / n, os.X_OK) else "" for n in ("others", "owner", "none")}
    entry = _commit(cache, out, {"o": "owner"})
    assert {n: entry.files[n]["mode"] for n in expected} == expected
    assert expected["owner"] == "x" and expected["none"] == ""


def test_a_storage_failure_that_is_not_a_full_disk_is_a_storage_error_naming_the_stage(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    out = _out(tmp_path, **{"f": b"x"})
    (tmp_path / "probe").write_bytes(b"x")
    digest = hash_file_uncached(tmp_path / "probe")
    cache.object_path(digest).parent.write_text("a file where objects/xx/ must be a folder")
    with pytest.raises(StorageError) as e:
        _commit(cache, out, {"o": "f"})
    assert "cannot store stage s's outputs in the cache" in e.value.message and "no space" not in e.value.message.lower()
    assert not cache.entry_path(KEY).exists()


def _digest_of(tmp_path, data: bytes) -> str:
    (tmp_path / "probe").write_bytes(data)
    return hash_file_uncached(tmp_path / "probe")


def test_objects_sharing_a_folder_are_all_stored(tmp_path):
    datas = {}
    for i in range(1000):  # two contents whose digests share their first two characters: objects/xx/
        d = _digest_of(tmp_path, b"c%d" % i)
        if d[:2] in datas:
            pair = (datas[d[:2]], b"c%d" % i)
            break
        datas[d[:2]] = b"c%d" % i
    cache = Cache(tmp_path / "c").ensure()
    one = _commit(cache, _out(tmp_path, "one", f=pair[0]), {"o": "f"}, key="1" * 64)
    two = _commit(cache, _out(tmp_path, "two", f=pair[1]), {"o": "f"}, key="2" * 64)
    assert cache.lookup(one.key) is not None and cache.lookup(two.key) is not None


def test_gc_frees_every_stray_object_around_one_a_live_run_holds(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    strays = [cache.object_path(f"{i:02x}" + "0" * 62) for i in range(30)]
    for p in strays:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"s")
    held = Cache(cache.root)
    with held.leased():
        held.hold(digests=[f"{7:02x}" + "0" * 62])
        result = Cache(cache.root).gc()
    assert result["objects_removed"] == 29 and result["skipped"]["objects"] == 1
    assert [p for p in strays if p.exists()] == [strays[7]]


def test_a_dead_runs_lease_is_cleared_by_gc_but_not_by_a_dry_run(tmp_path):
    cache = Cache(tmp_path / "c").ensure()
    lock, info = cache.runs / "run-1-dead.lock", cache.runs / "run-1-dead.json"
    lock.write_text("")  # what a killed run leaves: its lease files, their lock held by nobody
    info.write_text('{"pid": 1, "keys": [], "digests": []}')
    cache.gc(dry_run=True)
    assert lock.exists() and info.exists()
    cache.gc()
    assert not lock.exists() and not info.exists()


def test_no_space_for_a_workspace_is_no_space(tmp_path, monkeypatch):
    """Stand-in for a full disk: tempfile.mkdtemp is monkeypatched to fail with ENOSPC."""
    import errno

    from zoo.errors import NoSpace

    cache = Cache(tmp_path / "c").ensure()

    def full(**kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache_mod.tempfile, "mkdtemp", full)
    with pytest.raises(NoSpace):
        cache.tmp_dir("x-")

    def denied(**kw):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(cache_mod.tempfile, "mkdtemp", denied)
    with pytest.raises(PermissionError):
        cache.tmp_dir("x-")


# --- races with another process, through named stand-ins -----------------------------------------
# Each stand-in plays another process (its gc, or a concurrent run) removing or creating the same
# file at the very moment zoo/engine/cache.py touches it; the invariant is that nothing raises and the
# cache ends as it should.

def _stand_in_concurrent_remover(monkeypatch, *roots):
    """shutil.rmtree and Path.unlink under `roots` find their target already removed, as when
    another process's gc removed it an instant before; the real call then runs on what is left."""
    import pathlib
    import shutil

    real_rmtree, real_unlink = shutil.rmtree, pathlib.Path.unlink
    hits = []

    def under(path) -> bool:
        return any(pathlib.Path(path).is_relative_to(r) for r in roots)

    def rmtree(path, *args, **kwargs):
        if under(path) and os.path.lexists(path):
            hits.append(pathlib.Path(path))
            real_rmtree(path)  # the other process
        return real_rmtree(path, *args, **kwargs)

    def unlink(self, *args, **kwargs):
        if under(self) and os.path.lexists(self):
            hits.append(self)
            os.unlink(self)  # the other process
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    monkeypatch.setattr(pathlib.Path, "unlink", unlink)
    return hits


def test_gc_completes_with_a_stand_in_concurrent_remover(tmp_path, monkeypatch):
    """Stand-in: another gc removes each entry, log, workspace, materialisation and object an
    instant before this gc does; this gc neither raises nor leaves anything behind."""
    cache, a, b = _two_entries(tmp_path)
    cache.output_paths(a)
    (cache.tmp / "leftover" / "sub").mkdir(parents=True)
    (cache.tmp / "leftover" / "sub" / "x").write_bytes(b"x")
    (cache.tmp / "loose").write_bytes(b"y")
    (cache.out / "loose").write_bytes(b"y")
    stray = cache.object_path("ff" + "0" * 62)
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"z")
    hits = _stand_in_concurrent_remover(monkeypatch, cache.entries, cache.logs, cache.tmp, cache.out,
                                        cache.objects)
    result = cache.gc({_record("a" * 64)})
    assert (result["entries_removed"], result["objects_removed"]) == (1, 2)
    assert {cache.entry_path("b" * 64), cache.log_path("b" * 64), cache.tmp / "leftover", cache.tmp / "loose",
            cache.out / ("a" * 64), cache.out / "loose", stray} <= set(hits)
    assert list(cache.tmp.iterdir()) == [] and list(cache.out.iterdir()) == [] and not stray.exists()
    assert cache.read_entry("b" * 64) is None and not cache.log_path("b" * 64).exists()
    assert not cache.object_path(b.files["f"]["digest"]).exists() and cache.lookup("a" * 64) is not None


def test_gc_goes_on_past_an_object_removed_by_a_stand_in_concurrent_gc(tmp_path, monkeypatch):
    """Stand-in: another gc removes the first stray object between this gc's listing and its stat;
    this gc skips it and still removes every other stray object."""
    import pathlib

    cache = Cache(tmp_path / "c").ensure()
    strays = [cache.object_path(f"{i:02x}" + "0" * 62) for i in range(5)]
    for p in strays:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"s")
    real_glob = pathlib.Path.glob

    def glob(self, pattern, *args, **kwargs):
        found = sorted(real_glob(self, pattern, *args, **kwargs))
        if self == cache.objects and found:
            os.unlink(found[0])  # the other gc, after this one listed it
        return iter(found)

    monkeypatch.setattr(pathlib.Path, "glob", glob)
    result = cache.gc()
    assert result["objects_removed"] == 5 and result["bytes_freed"] == 4
    assert [p for p in strays if p.exists()] == []


def test_materialize_rebuilds_with_a_stand_in_concurrent_remover(tmp_path, monkeypatch):
    """Stand-in: another process's gc removes the incomplete out/<key>/ just before materialize
    does; materialize still returns a complete folder and leaves no staging behind."""
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, _out(tmp_path, **{"m": b"model", "d__x": b"x"}), {"m": "m", "d": "d"})
    dest = cache.out / KEY
    (dest / "d").mkdir(parents=True)
    (dest / "m").write_bytes(b"model")  # d/x missing: incomplete
    hits = _stand_in_concurrent_remover(monkeypatch, cache.out, cache.tmp)
    assert cache.materialize(entry) == dest and dest in hits
    assert (dest / "m").read_bytes() == b"model" and (dest / "d" / "x").read_bytes() == b"x"
    assert list(cache.tmp.iterdir()) == []


def test_a_missing_object_is_an_integrity_error_with_a_stand_in_concurrent_remover(tmp_path, monkeypatch):
    """Stand-in: another process's gc removes materialize's staging folder (garbage to it) as
    materialize cleans up after a missing object; the error is still the IntegrityError."""
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, _out(tmp_path, **{"a": b"a", "m": b"model"}), {"a": "a", "m": "m"})
    cache.object_path(entry.files["m"]["digest"]).unlink()
    hits = _stand_in_concurrent_remover(monkeypatch, cache.tmp)
    with pytest.raises(IntegrityError):
        cache.materialize(entry)
    assert hits and list(cache.tmp.iterdir()) == [] and not (cache.out / KEY).exists()


@pytest.mark.parametrize("remover", [False, True])
def test_materialize_when_a_stand_in_concurrent_run_materialised_it_first(tmp_path, monkeypatch, remover):
    """Stand-in: a concurrent run renames its own complete out/<key>/ into place just before this
    one's rename (which then fails); materialize returns that folder, complete, and leaves no
    staging behind, also when another gc removes the staging folder at the same moment."""
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, _out(tmp_path, **{"m": b"model", "d__x": b"x"}), {"m": "m", "d": "d"})
    dest = cache.out / KEY
    real_replace = os.replace
    raced = []

    def replace(src, dst, *args, **kwargs):
        if os.fspath(dst) == os.fspath(dest) and not raced:
            raced.append(src)
            (dest / "d").mkdir(parents=True)
            (dest / "m").write_bytes(b"model")
            (dest / "d" / "x").write_bytes(b"x")  # the other run's, complete
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(cache_mod.os, "replace", replace)
    if remover:
        _stand_in_concurrent_remover(monkeypatch, cache.tmp)
    assert cache.materialize(entry) == dest and raced
    assert (dest / "m").read_bytes() == b"model" and (dest / "d" / "x").read_bytes() == b"x"
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["d", "d/x", "m"]
    assert list(cache.tmp.iterdir()) == []


def test_the_records_index_is_a_hint_a_hostile_file_there_is_only_no_hint(tmp_path):
    """`records/<identity>` names the last key built for a record, to explain a rerun: a link to a
    device, a huge file, text that is not a key or a key with no entry gives no hint, never a hang
    or a traceback (a shared cache folder is written by others too)."""
    cache = Cache(tmp_path / "c").ensure()
    entry = _commit(cache, _out(tmp_path, **{"model.bin": b"abc"}), {"model": "model.bin"})
    identity = _record(KEY)
    assert cache.entry_of_record(identity).key == KEY and cache.entry_of_record(identity, other_than=KEY) is None
    index = cache.records / identity[:2] / identity
    for hostile in ("/dev/zero", "not a key", "f" * 64, "A" * 100_000):
        index.unlink()
        if hostile.startswith("/"):
            index.symlink_to(hostile)
        else:
            index.write_text(hostile)
        assert cache.entry_of_record(identity) is None and cache.lookup_record(identity) is None, hostile[:20]
    assert cache.lookup(entry.key) is not None  # the entry itself is untouched
