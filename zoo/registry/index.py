"""The SQLite index of a local zoo: versions, tags, build metrics and blob references.

Manifests and tag files on disk are the truth; the index is derived from them. It makes
listing, searching and "is this blob still used?" cost one query instead of a scan of every
manifest, so they stay fast with 10,000 versions.

The index never stays out of date (see `IndexSource`, implemented by `LocalZoo`):

- missing, never completed (the ``complete`` meta row is written in the same transaction as a
  full rebuild), of another ``schema_version``, or damaged (not an SQLite file): rebuilt from the
  manifests when opened;
- a writer marks a model pending before it touches its manifests or tags and clears the mark
  after the index is updated, so a writer killed in between leaves the mark behind, and the
  next read re-syncs that model from its files first. Checking for marks is one listdir.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Protocol

from zoo.errors import StorageError
from zoo.registry.manifest import Manifest
from zoo.registry.refs import version_key

# 2: sort_key from refs.version_key's current form (semver precedence); an index of another
# version is rebuilt from the manifests when opened, like an incomplete one
INDEX_SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS versions (
  name TEXT NOT NULL, version TEXT NOT NULL, sort_key TEXT NOT NULL, created TEXT,
  task TEXT, description TEXT, license TEXT, manifest_sha256 TEXT, builds TEXT,
  PRIMARY KEY (name, version));
CREATE TABLE IF NOT EXISTS builds (
  name TEXT NOT NULL, version TEXT NOT NULL, build TEXT NOT NULL, precision TEXT, providers TEXT,
  latency_p50_ms REAL, accuracy REAL, passed INTEGER, size INTEGER,
  PRIMARY KEY (name, version, build));
CREATE TABLE IF NOT EXISTS tags (name TEXT NOT NULL, tag TEXT NOT NULL, version TEXT NOT NULL, PRIMARY KEY (name, tag));
CREATE TABLE IF NOT EXISTS files (sha256 TEXT NOT NULL, name TEXT NOT NULL, version TEXT NOT NULL,
  PRIMARY KEY (sha256, name, version));
CREATE INDEX IF NOT EXISTS files_by_version ON files (name, version);
"""


@dataclass
class VersionInfo:
    """One row of `zoo list`: a published version and the tags pointing at it."""

    name: str
    version: str
    created: str | None
    task: str
    description: str
    license: str
    builds: list[str]
    tags: list[str] = field(default_factory=list)


def _number(value) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def build_passed(metrics: dict) -> bool:
    """A build passed verification unless its metrics say otherwise (passed false / status failed).

    The manifest stores metrics as numbers or strings, so ``passed: false`` may arrive as 0.
    """
    passed = metrics.get("passed")
    if passed is not None and str(passed).strip().lower() in ("false", "0", "0.0", "no"):
        return False
    return str(metrics.get("status", "")).lower() not in ("failed", "fail", "error")


# one version as the files say it: (manifest, sha256 of its manifest bytes)
Entry = tuple[Manifest, str]


class IndexSource(Protocol):
    """Where the truth lives (the local zoo's manifests and tag files)."""

    def index_entries(self) -> tuple[Iterable[Entry], dict[str, dict[str, str]]]:
        """Every version and every model's tags, for a full rebuild."""

    def reconcile_pending(self, index: "Index") -> None:
        """Re-sync the models whose writers left a pending mark (see the module docstring)."""


class Index:
    """A SQLite file (WAL mode) shared by every process using the same zoo."""

    def __init__(self, path: Path, source: IndexSource | None = None):
        self.path = Path(path)
        self.source = source
        self._local = threading.local()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(INDEX_SCHEMA_VERSION),))
            db.execute("SELECT count(*) FROM versions").fetchone()
        except BaseException:
            db.close()
            raise
        return db

    def _open(self) -> sqlite3.Connection:
        try:
            try:
                db = self._connect() if self.path.exists() else self._create()
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.OperationalError) or self.source is None:
                    raise
                db = self._replace_damaged()
            complete = db.execute("SELECT value FROM meta WHERE key='complete'").fetchone()
            schema = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.Error as e:
            raise StorageError(f"cannot open the zoo index {self.path}: {e}",
                               hint="check the permissions of ZOO_HOME; if the file is damaged, delete it: "
                                    "it is rebuilt from the manifests") from e
        self._local.db = db
        self._local.ino = _inode(self.path)
        if (complete is None or schema != (str(INDEX_SCHEMA_VERSION),)) and self.source is not None:
            self.rebuild()
        return db

    def _create(self) -> sqlite3.Connection:
        """A new index file; a -wal/-shm left from a deleted one would be replayed into it, so they go first."""
        from filelock import FileLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(self.path) + ".lock", timeout=120):
            if not self.path.exists():
                for suffix in ("-wal", "-shm"):
                    Path(str(self.path) + suffix).unlink(missing_ok=True)
            return self._connect()

    def _replace_damaged(self) -> sqlite3.Connection:
        """Move a file that is not an SQLite database aside (one process at a time) and start afresh."""
        from filelock import FileLock

        with FileLock(str(self.path) + ".lock", timeout=120):
            try:
                return self._connect()  # another process replaced it already
            except sqlite3.DatabaseError as e:
                if isinstance(e, sqlite3.OperationalError):
                    raise
            os.replace(self.path, self.path.with_name(self.path.name + ".damaged"))
            for suffix in ("-wal", "-shm"):
                Path(str(self.path) + suffix).unlink(missing_ok=True)
            return self._connect()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is not None and _inode(self.path) != self._local.ino:
            self.close()  # the file was deleted or replaced under us: writes must reach the new one
            db = None
        return db if db is not None else self._open()

    def _fresh(self) -> sqlite3.Connection:
        """The connection for a read: pending writers' marks are reconciled first."""
        db = self._db()
        if self.source is not None and not getattr(self._local, "reconciling", False):
            self._local.reconciling = True
            try:
                self.source.reconcile_pending(self)
            finally:
                self._local.reconciling = False
        return db

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # ---- writes -------------------------------------------------------------------------
    def add(self, manifest: Manifest, manifest_sha256: str) -> None:
        """Record a version (idempotent)."""
        with self._transaction("update") as db:
            self._insert(db, manifest, manifest_sha256)

    @contextmanager
    def _transaction(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed at the end, rolled back on any exception (a SQLite
        error becomes a StorageError naming the index)."""
        db = self._db()
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException as e:
            _rollback(db)
            if isinstance(e, sqlite3.Error):
                raise StorageError(f"cannot {doing} the zoo index {self.path}: {e}") from e
            raise

    @staticmethod
    def _insert(db: sqlite3.Connection, manifest: Manifest, manifest_sha256: str) -> None:
        name, version = manifest.name, manifest.version
        rows = []
        for b in manifest.builds.values():
            rows.append((name, version, b.name, b.precision, ",".join(b.execution_providers),
                         _number(b.metrics.get("latency_p50_ms")), _number(b.metrics.get("accuracy")),
                         int(build_passed(b.metrics)), b.file.size + sum(f.size for f in b.extra_files)))
        db.execute("INSERT OR REPLACE INTO versions VALUES (?,?,?,?,?,?,?,?,?)",
                   (name, version, version_key(version), manifest.created, manifest.task, manifest.description,
                    manifest.license, manifest_sha256, json.dumps(sorted(manifest.builds))))
        db.execute("DELETE FROM builds WHERE name=? AND version=?", (name, version))
        db.executemany("INSERT INTO builds VALUES (?,?,?,?,?,?,?,?,?)", rows)
        db.executemany("INSERT OR IGNORE INTO files VALUES (?,?,?)",
                       [(f.sha256, name, version) for f in manifest.all_files()])

    def remove(self, name: str, version: str) -> None:
        self._write([(f"DELETE FROM {t} WHERE name=? AND version=?", (name, version))
                     for t in ("versions", "builds", "files", "tags")])

    def set_tag(self, name: str, tag: str, version: str | None) -> None:
        if version is None:
            self._write([("DELETE FROM tags WHERE name=? AND tag=?", (name, tag))])
        else:
            self._write([("INSERT OR REPLACE INTO tags VALUES (?,?,?)", (name, tag, version))])

    def _write(self, statements: list[tuple[str, tuple]]) -> None:
        with self._transaction("update") as db:
            for sql, args in statements:
                db.execute(sql, args)

    def clear(self) -> None:
        self._write([(f"DELETE FROM {t}", ()) for t in ("versions", "builds", "files", "tags")])

    def rebuild(self) -> int:
        """Replace the whole index with what the source's files say, in one transaction; returns the version count.

        The files are read inside the write transaction, so a writer that updates the index
        after its manifest either is seen by the scan or commits after this rebuild.
        """
        with self._transaction("rebuild") as db:
            entries, tags = self.source.index_entries()
            for t in ("versions", "builds", "files", "tags"):
                db.execute(f"DELETE FROM {t}")
            count = 0
            for manifest, sha in entries:
                self._insert(db, manifest, sha)
                count += 1
            db.executemany("INSERT OR REPLACE INTO tags VALUES (?,?,?)",
                           [(n, t, v) for n, ts in tags.items() for t, v in ts.items()])
            db.execute("INSERT OR REPLACE INTO meta VALUES ('complete', '1')")
            db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(INDEX_SCHEMA_VERSION),))
        return count

    def sync_model(self, name: str, entries: Iterable[Entry], tags: dict[str, str]) -> None:
        """Make one model's rows equal `entries` and `tags` (what its files say), in one transaction."""
        with self._transaction("update") as db:
            for t in ("versions", "builds", "files", "tags"):
                db.execute(f"DELETE FROM {t} WHERE name=?", (name,))
            for manifest, sha in entries:
                self._insert(db, manifest, sha)
            db.executemany("INSERT OR REPLACE INTO tags VALUES (?,?,?)", [(name, t, v) for t, v in tags.items()])

    # ---- reads --------------------------------------------------------------------------
    def has(self, name: str, version: str) -> bool:
        return self._fresh().execute("SELECT 1 FROM versions WHERE name=? AND version=?", (name, version)).fetchone() is not None

    def versions(self, name: str | None = None) -> list[VersionInfo]:
        """Every version (of `name`, or of all models), newest first within a model."""
        db = self._fresh()
        where, args = ("WHERE v.name=?", (name,)) if name else ("", ())
        tags: dict[tuple[str, str], list[str]] = {}
        targs = (name,) if name else ()
        for n, t, v in db.execute(f"SELECT name, tag, version FROM tags {'WHERE name=?' if name else ''}", targs):
            tags.setdefault((n, v), []).append(t)
        out = []
        for n, v, created, task, desc, lic, builds in db.execute(
                f"SELECT v.name, v.version, v.created, v.task, v.description, v.license, v.builds FROM versions v {where} "
                "ORDER BY v.name, v.sort_key DESC", args):
            out.append(VersionInfo(n, v, created, task or "", desc or "", lic or "", json.loads(builds or "[]"),
                                   sorted(tags.get((n, v), []))))
        return out

    def models(self) -> list[dict]:
        """One row per model: its `latest` version (else the highest), version count, task, description, tags."""
        db = self._fresh()
        tags: dict[str, dict[str, str]] = {}
        for n, t, v in db.execute("SELECT name, tag, version FROM tags"):
            tags.setdefault(n, {})[t] = v
        out = []
        for n, v, task, desc, count in db.execute(
                "SELECT v.name, v.version, v.task, v.description, c.n FROM versions v JOIN "
                "(SELECT name, count(*) AS n, max(sort_key) AS k FROM versions GROUP BY name) c "
                "ON v.name = c.name AND v.sort_key = c.k ORDER BY v.name"):
            latest = tags.get(n, {}).get("latest", v)
            if latest != v:
                row = db.execute("SELECT task, description FROM versions WHERE name=? AND version=?", (n, latest)).fetchone()
                if row:
                    v, (task, desc) = latest, row
            out.append({"name": n, "latest": v, "versions": count, "task": task or "", "description": desc or "",
                        "tags": dict(sorted(tags.get(n, {}).items()))})
        return out

    def version_names(self, name: str) -> list[str]:
        return [r[0] for r in self._fresh().execute(
            "SELECT version FROM versions WHERE name=? ORDER BY sort_key DESC", (name,))]

    def model_names(self) -> list[str]:
        return [r[0] for r in self._fresh().execute("SELECT DISTINCT name FROM versions ORDER BY name")]

    def tags(self, name: str) -> dict[str, str]:
        return dict(self._fresh().execute("SELECT tag, version FROM tags WHERE name=? ORDER BY tag", (name,)).fetchall())

    def blob_in_use(self, sha256: str) -> bool:
        return self._fresh().execute("SELECT 1 FROM files WHERE sha256=? LIMIT 1", (sha256,)).fetchone() is not None

    def manifest_digests(self, name: str | None = None) -> dict[tuple[str, str], str]:
        """(name, version) -> sha256 of the manifest bytes the index was built from."""
        where, args = ("WHERE name=?", (name,)) if name else ("", ())
        return {(n, v): d for n, v, d in self._fresh().execute(
            f"SELECT name, version, manifest_sha256 FROM versions {where}", args)}

    def files_of(self, name: str, version: str) -> list[str]:
        """The sha256 of every file the index records for a version (fsck compares them with the manifest)."""
        return [r[0] for r in self._fresh().execute("SELECT sha256 FROM files WHERE name=? AND version=?", (name, version))]

    def search(self, text: str = "", *, task: str | None = None, tag: str | None = None,
               max_latency: float | None = None, min_accuracy: float | None = None,
               latest_only: bool = True) -> list[dict]:
        """Builds matching every filter; text matches name, description or task (case-insensitive)."""
        sql = ["SELECT v.name, v.version, v.task, v.description, b.build, b.latency_p50_ms, b.accuracy, b.passed, v.sort_key "
               "FROM versions v JOIN builds b ON b.name=v.name AND b.version=v.version WHERE 1=1"]
        args: list = []
        if text:
            like = f"%{text.lower()}%"
            sql.append("AND (lower(v.name) LIKE ? OR lower(v.description) LIKE ? OR lower(v.task) LIKE ?)")
            args += [like, like, like]
        if task:
            sql.append("AND lower(v.task) = ?")
            args.append(task.lower())
        if tag:
            sql.append("AND EXISTS (SELECT 1 FROM tags t WHERE t.name=v.name AND t.version=v.version AND t.tag=?)")
            args.append(tag)
        if max_latency is not None:
            sql.append("AND b.latency_p50_ms IS NOT NULL AND b.latency_p50_ms <= ?")
            args.append(max_latency)
        if min_accuracy is not None:
            sql.append("AND b.accuracy IS NOT NULL AND b.accuracy >= ?")
            args.append(min_accuracy)
        sql.append("ORDER BY v.name, v.sort_key DESC, b.build")
        rows = self._fresh().execute(" ".join(sql), args).fetchall()
        newest: dict[str, str] = {}
        if latest_only:
            for n, key in self._fresh().execute("SELECT name, max(sort_key) FROM versions GROUP BY name"):
                newest[n] = key
        out = []
        for n, v, t, d, b, lat, acc, passed, key in rows:
            if latest_only and newest.get(n) != key:
                continue
            out.append({"name": n, "version": v, "task": t or "", "description": d or "", "build": b,
                        "latency_p50_ms": lat, "accuracy": acc, "passed": bool(passed)})
        return out


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _rollback(db: sqlite3.Connection) -> None:
    try:
        db.execute("ROLLBACK")
    except sqlite3.Error:
        pass
