"""Digests: blake3 for content (fast and strong), canonical JSON for keys, and a stat cache.

The stat cache remembers values computed from a file's bytes — its digest, the import statements
of a Python source (zoo.engine.import_closure) — by (path, inode, size, mtime_ns) in SQLite, so an
unchanged file is never hashed or parsed twice, across runs and processes.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import stat as statmod
from pathlib import Path
from typing import Any, Callable

from zoo.errors import Unhashable

ALGORITHM = "blake3"
_CHUNK = 1 << 22


def content_hasher():
    """A new blake3 hasher, as content digests use (update it with bytes, then `hexdigest()`)."""
    from blake3 import blake3

    # max_threads lets blake3 use both cores on large files
    return blake3(max_threads=blake3.AUTO)


def digest_bytes(data: bytes) -> str:
    h = content_hasher()
    h.update(data)
    return h.hexdigest()


def hash_file_uncached(path: Path) -> str:
    """blake3 of a file's bytes (memory-mapped where possible)."""
    h = content_hasher()
    try:
        h.update_mmap(str(path))
    except (AttributeError, OSError, ValueError):
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
    return h.hexdigest()


def canonical_json(obj: Any) -> bytes:
    """Canonical JSON bytes (sorted keys, no spaces); refuses values that cannot be hashed stably."""
    _check_hashable(obj, "")
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def digest_json(obj: Any) -> str:
    return digest_bytes(canonical_json(obj))


def _check_hashable(obj: Any, where: str) -> None:
    if obj is None or isinstance(obj, (bool, int, str)):
        return
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise Unhashable(f"cannot hash non-finite number {obj!r} at {where or 'top level'}")
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise Unhashable(f"cannot hash non-string key {k!r} at {where or 'top level'}")
            _check_hashable(v, f"{where}.{k}" if where else k)
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_hashable(v, f"{where}[{i}]")
        return
    raise Unhashable(f"cannot hash a value of type {type(obj).__name__} at {where or 'top level'}",
                     hint="cache keys are built from plain JSON values only; pass a path or a number instead")


class StatCache:
    """(path, inode, size, mtime_ns, what) -> a value computed from the file; safe across processes.

    `what` names the computation and its format (``blake3``, ``imports/1``): a value is reused
    only for the same file version and the same computation.
    """

    def __init__(self, db_path: Path | None):
        self._db: sqlite3.Connection | None = None
        self._path = db_path
        self._memory: dict[tuple, str] = {}
        self._real: dict[str, str] = {}  # path as given -> real path (the key on disk)

    def _conn(self) -> sqlite3.Connection | None:
        if self._path is None:
            return None
        if self._db is None:
            try:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(str(self._path), timeout=30, isolation_level=None)
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("CREATE TABLE IF NOT EXISTS file_values (path TEXT, what TEXT, inode INTEGER, "
                                 "size INTEGER, mtime_ns INTEGER, value TEXT, PRIMARY KEY (path, what))")
            except (sqlite3.Error, OSError):
                # a read-only or unplaceable store still works, just without persistence
                self._path = None
                return None
        return self._db

    def digest(self, path: Path) -> str:
        """blake3 of the file's bytes, hashed once per file version."""
        return self.remember(path, ALGORITHM, hash_file_uncached)

    def remember(self, path: Path, what: str, compute: Callable[[Path], str]) -> str:
        """`compute(path)`, computed once per file version (path, inode, size, mtime_ns) and `what`."""
        st = os.stat(path)
        ident = (st.st_ino, st.st_size, st.st_mtime_ns)
        # in memory by the path as given (resolving costs a syscall per folder); on disk by the real path
        memo_key = (str(path), what) + ident
        hit = self._memory.get(memo_key)
        if hit is not None:
            return hit
        spath = self._real.get(str(path))
        if spath is None:
            spath = self._real[str(path)] = str(Path(path).resolve())
        db = self._conn()
        if db is not None:
            row = db.execute("SELECT inode, size, mtime_ns, value FROM file_values WHERE path=? AND what=?",
                             (spath, what)).fetchone()
            if row and tuple(row[:3]) == ident:
                self._memory[memo_key] = row[3]
                return row[3]
        value = compute(path)
        self._memory[memo_key] = value
        if db is not None:
            try:
                db.execute("INSERT OR REPLACE INTO file_values VALUES (?,?,?,?,?,?)", (spath, what, *ident, value))
            except sqlite3.Error:
                pass
        return value

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


def tree_files(root: Path) -> list[Path]:
    """Regular files below `root` (or `root` itself), sorted; symlinks are refused, not followed."""
    if root.is_symlink():
        raise Unhashable(f"{root} is a symbolic link; zoo hashes real files only")
    if root.is_file():
        return [root]
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            if statmod.S_ISLNK(mode):
                raise Unhashable(f"{p} is a symbolic link; zoo hashes real files only")
            if statmod.S_ISREG(mode):
                files.append(p)
    return files


def digest_path(path: Path, cache: StatCache | None = None) -> str:
    """Digest of a file, or of a folder as canonical JSON of its (relative path, digest) pairs."""
    path = Path(path)
    if not path.exists():
        raise Unhashable(f"{path} does not exist", hint="check the path in the recipe")
    hash_one = cache.digest if cache else hash_file_uncached
    if path.is_file():
        return hash_one(path)
    listing = {p.relative_to(path).as_posix(): hash_one(p) for p in tree_files(path)}
    return digest_json({"tree": listing})
