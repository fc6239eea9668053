"""The file layer (zoo/files.py): every writer replaces a file whole or not at all, and leaves no
temp file behind; links and copies place what they say; one sha256.

Failures are stand-ins: os.replace, os.fsync or os.link are monkeypatched to fail as the OS would
(a real full disk is tested in tests/test_cache_live.py and tests/test_registry_pull.py).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from zoo import files
from zoo.errors import IntegrityError, NoSpace, StorageError

OLD, NEW = b"the old bytes\n", b"the new bytes, a little longer\n"
NEW_SHA = hashlib.sha256(NEW).hexdigest()


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "src" / "new.bin"
    src.parent.mkdir(exist_ok=True)
    src.write_bytes(NEW)
    return src


def _with_atomic_output(tmp_path: Path, dest: Path) -> None:
    with files.atomic_output(dest) as tmp:
        tmp.write_bytes(NEW)


# every way the layer puts bytes at a path: (name, function(tmp_path, dest))
WRITERS = {
    "atomic_write": lambda tmp_path, dest: files.atomic_write(dest, NEW),
    "atomic_write unsynced": lambda tmp_path, dest: files.atomic_write(dest, NEW, fsync=False),
    "atomic_write_text": lambda tmp_path, dest: files.atomic_write_text(dest, NEW.decode()),
    "atomic_write_json": lambda tmp_path, dest: files.atomic_write_json(dest, {"b": 1, "a": "é"}),
    "atomic_output": _with_atomic_output,
    "atomic_copy": lambda tmp_path, dest: files.atomic_copy(_source(tmp_path), dest),
    "copy_verified": lambda tmp_path, dest: files.copy_verified(_source(tmp_path), dest, NEW_SHA, len(NEW), "x"),
    "hardlink_or_copy": lambda tmp_path, dest: files.hardlink_or_copy(_source(tmp_path), dest),
    "reflink_or_copy": lambda tmp_path, dest: files.reflink_or_copy(_source(tmp_path), dest, NEW_SHA, len(NEW), "x"),
}


@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
def test_every_writer_replaces_the_file_whole_and_leaves_no_temp_file(tmp_path, writer):
    dest = tmp_path / "f.bin"
    dest.write_bytes(OLD)
    writer(tmp_path, dest)
    assert dest.read_bytes() != OLD and dest.stat().st_size > 0
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("writer", WRITERS.values(), ids=WRITERS.keys())
def test_every_writer_that_fails_leaves_the_old_file_intact_and_no_temp_file(tmp_path, writer, monkeypatch):
    """Stand-in: the rename fails (EIO) after the new bytes were written to the temp file."""
    dest = tmp_path / "f.bin"
    dest.write_bytes(OLD)

    def replace(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(files.os, "replace", replace)
    with pytest.raises(StorageError) as e:
        writer(tmp_path, dest)
    assert not isinstance(e.value, NoSpace) and str(dest) in e.value.message
    assert dest.read_bytes() == OLD and _leftovers(tmp_path) == []


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_an_interrupted_write_leaves_the_old_file_and_is_not_disguised(tmp_path, monkeypatch, error):
    """Stand-in: os.fsync raises what a signal handler or a bug would; it passes through as it is."""
    dest = tmp_path / "f"
    dest.write_bytes(OLD)

    def fsync(fd):
        raise error("stop")

    monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(error):
        files.atomic_write(dest, NEW)
    with pytest.raises(error):
        with files.atomic_output(dest) as tmp:
            tmp.write_bytes(NEW)
    assert dest.read_bytes() == OLD and _leftovers(tmp_path) == []


def test_a_full_disk_is_no_space_naming_the_file_system_and_the_file(tmp_path, monkeypatch):
    """Stand-in for a full disk: os.fsync fails with ENOSPC."""
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", fsync)
    dest = tmp_path / "deep" / "f"
    with pytest.raises(NoSpace) as e:
        files.atomic_write(dest, NEW)
    assert e.value.message.startswith(f"no space left on {files._mount_of(tmp_path)} (writing {dest})")
    assert "hint" not in e.value.message and e.value.hint
    assert not dest.exists() and _leftovers(dest.parent) == []


def test_a_write_creates_its_folder_and_the_rename_is_made_durable(tmp_path, monkeypatch):
    """Stand-in: os.fsync records what it was given (a file, then the folder of the rename)."""
    synced: list[bool] = []
    real = os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)) or real(fd))
    dest = tmp_path / "a" / "b" / "f"
    files.atomic_write(dest, NEW)
    assert dest.read_bytes() == NEW and synced == [False, True]
    synced.clear()
    files.atomic_write(dest, OLD, fsync=False)
    assert dest.read_bytes() == OLD and synced == []


def test_temp_names_are_hidden_siblings_unique_per_process_and_call(tmp_path):
    names = {files.temp_path(tmp_path / "f.json") for _ in range(100)}
    assert len(names) == 100
    for name in names:
        assert name.parent == tmp_path and name.name.startswith(f".f.json.{os.getpid()}.") and name.suffix == ".tmp"


def test_modes_default_to_the_owners_and_can_be_set(tmp_path):
    assert stat.S_IMODE(files.atomic_write(tmp_path / "a", NEW).stat().st_mode) == 0o600
    assert stat.S_IMODE(files.atomic_write(tmp_path / "b", NEW, mode=0o444).stat().st_mode) == 0o444
    assert stat.S_IMODE(files.atomic_copy(tmp_path / "b", tmp_path / "c", mode=0o640).stat().st_mode) == 0o640


def test_json_is_stable_text_and_refuses_nan(tmp_path):
    path = files.atomic_write_json(tmp_path / "x.json", {"b": [1, 2], "a": "é"})
    assert files.atomic_write_json(tmp_path / "y.json", {"a": "é", "b": [1, 2]}).read_bytes() == path.read_bytes()
    assert path.read_bytes() == '{\n  "a": "é",\n  "b": [\n    1,\n    2\n  ]\n}\n'.encode()
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": "é", "b": [1, 2]}
    with pytest.raises(ValueError):
        files.atomic_write_json(path, {"x": float("nan")})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": "é", "b": [1, 2]} and _leftovers(tmp_path) == []


def test_create_exclusive_creates_once(tmp_path):
    path = tmp_path / "m" / "manifest.json"
    assert files.create_exclusive(path, OLD) is True
    assert files.create_exclusive(path, NEW) is False
    assert path.read_bytes() == OLD and _leftovers(path.parent) == []


@pytest.mark.parametrize("data", [NEW[:-1] + b"!", NEW[:-1], NEW + b"more"], ids=["changed", "short", "long"])
def test_copy_verified_places_only_matching_bytes(tmp_path, data):
    src = tmp_path / "src"
    src.write_bytes(data)
    with pytest.raises(IntegrityError, match="model.onnx: content does not match the manifest"):
        files.copy_verified(src, tmp_path / "dest", NEW_SHA, len(NEW), "model.onnx")
    assert not (tmp_path / "dest").exists() and _leftovers(tmp_path) == []
    files.copy_verified(iter([NEW[:5], NEW[5:]]), tmp_path / "dest", NEW_SHA, len(NEW), "x")  # chunks work too
    assert (tmp_path / "dest").read_bytes() == NEW and stat.S_IMODE((tmp_path / "dest").stat().st_mode) == 0o444


def test_hardlink_or_copy_links_and_relinking_the_same_file_leaves_nothing(tmp_path):
    src = _source(tmp_path)
    dest = tmp_path / "dest"
    files.hardlink_or_copy(src, dest)
    files.hardlink_or_copy(src, dest)  # already the same file: the rename does nothing
    assert os.stat(dest).st_ino == os.stat(src).st_ino and _leftovers(tmp_path) == []


def test_hardlink_or_copy_copies_with_the_mode_when_a_link_is_impossible(tmp_path, monkeypatch):
    """Stand-in for another file system: os.link fails as it does across devices."""
    src = _source(tmp_path)
    os.chmod(src, 0o555)

    def no_link(a, b):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(files.os, "link", no_link)
    files.hardlink_or_copy(src, tmp_path / "dest")
    dest = tmp_path / "dest"
    assert dest.read_bytes() == NEW and os.stat(src).st_ino != os.stat(dest).st_ino
    assert stat.S_IMODE(dest.stat().st_mode) == 0o555  # the same file a link would show


def test_reflink_or_copy_is_independent_of_its_source(tmp_path):
    src = _source(tmp_path)
    dest = tmp_path / "dest"
    files.reflink_or_copy(src, dest, NEW_SHA, len(NEW), "x", mode=0o644)
    assert os.stat(dest).st_ino != os.stat(src).st_ino
    assert stat.S_IMODE(dest.stat().st_mode) == 0o644 & ~files.current_umask()
    dest.write_bytes(OLD)
    assert src.read_bytes() == NEW


def test_sha256(tmp_path):
    src = _source(tmp_path)
    assert files.sha256_file(src) == NEW_SHA
    assert files.sha256_and_size(src) == (NEW_SHA, len(NEW))


def test_the_file_layer_imports_nothing_heavy():
    code = ("import sys, zoo.files; "
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'torch', 'numpy', 'pydantic', 'yaml') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_verified_sha256_memo_keeps_only_the_most_recently_used_files(tmp_path, monkeypatch):
    """remember_sha256's memo is bounded: past VERIFIED_MEMO_SIZE files the least recently used
    one is forgotten (placing it hashes it again), while one looked up since is kept."""
    monkeypatch.setattr(files, "VERIFIED_MEMO_SIZE", 3)
    monkeypatch.setattr(files, "_VERIFIED_SHA256", type(files._VERIFIED_SHA256)())
    objects = []
    for i in range(4):
        src = tmp_path / f"object{i}"
        src.write_bytes(b"object %d\n" % i)
        os.chmod(src, 0o444)
        objects.append((src, *files.sha256_and_size(src)))
    hashed: list[str] = []
    real = files._fill_verified
    monkeypatch.setattr(files, "_fill_verified", lambda out, src, sha, size, what: (hashed.append(what), real(out, src, sha, size, what))[1])
    for src, sha, _ in objects[:3]:
        files.remember_sha256(src, sha)
    src, sha, size = objects[0]
    files.link_verified(src, tmp_path / "again0", sha, size, "object0")  # used: now the most recent
    assert hashed == []
    files.remember_sha256(objects[3][0], objects[3][1])  # one too many: object1 (least recent) goes
    assert len(files._VERIFIED_SHA256) == 3
    for i, (src, sha, size) in enumerate(objects):
        files.link_verified(src, tmp_path / f"blob{i}", sha, size, f"object{i}")
    assert hashed == ["object1"]
