"""The SQLite index of a local zoo: versions, tags, build metrics and blob references.

Manifests and tag files on disk are the truth; the index is derived from them (and can be
rebuilt with `Index.rebuild`). It makes listing, searching and "is this blob still used?"
cost one query instead of a scan of every manifest, so they stay fast with 10,000 versions.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path

from zoo.errors import StorageError
from zoo.registry.manifest import Manifest
from zoo.registry.refs import version_key

INDEX_SCHEMA_VERSION = 1

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


class Index:
    """A SQLite file (WAL mode) shared by every process using the same zoo."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._local = threading.local()

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(str(self.path), timeout=60, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
                db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(INDEX_SCHEMA_VERSION),))
            except sqlite3.Error as e:
                raise StorageError(f"cannot open the zoo index {self.path}: {e}",
                                   hint="delete it; it is rebuilt from the manifests") from e
            self._local.db = db
        return db

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    # ---- writes -------------------------------------------------------------------------
    def add(self, manifest: Manifest, manifest_sha256: str) -> None:
        """Record a version (idempotent)."""
        db = self._db()
        name, version = manifest.name, manifest.version
        rows = []
        for b in manifest.builds.values():
            rows.append((name, version, b.name, b.precision, ",".join(b.execution_providers),
                         _number(b.metrics.get("latency_p50_ms")), _number(b.metrics.get("accuracy")),
                         int(build_passed(b.metrics)), b.file.size + sum(f.size for f in b.extra_files)))
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT OR REPLACE INTO versions VALUES (?,?,?,?,?,?,?,?,?)",
                       (name, version, version_key(version), manifest.created, manifest.task, manifest.description,
                        manifest.license, manifest_sha256, json.dumps(sorted(manifest.builds))))
            db.execute("DELETE FROM builds WHERE name=? AND version=?", (name, version))
            db.executemany("INSERT INTO builds VALUES (?,?,?,?,?,?,?,?,?)", rows)
            db.executemany("INSERT OR IGNORE INTO files VALUES (?,?,?)",
                           [(f.sha256, name, version) for f in manifest.all_files()])
            db.execute("COMMIT")
        except sqlite3.Error as e:
            db.execute("ROLLBACK")
            raise StorageError(f"cannot update the zoo index: {e}") from e

    def remove(self, name: str, version: str) -> None:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        for table in ("versions", "builds", "files", "tags"):
            db.execute(f"DELETE FROM {table} WHERE name=? AND version=?", (name, version))
        db.execute("COMMIT")

    def set_tag(self, name: str, tag: str, version: str | None) -> None:
        db = self._db()
        if version is None:
            db.execute("DELETE FROM tags WHERE name=? AND tag=?", (name, tag))
        else:
            db.execute("INSERT OR REPLACE INTO tags VALUES (?,?,?)", (name, tag, version))

    def clear(self) -> None:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        for table in ("versions", "builds", "files", "tags"):
            db.execute(f"DELETE FROM {table}")
        db.execute("COMMIT")

    # ---- reads --------------------------------------------------------------------------
    def has(self, name: str, version: str) -> bool:
        return self._db().execute("SELECT 1 FROM versions WHERE name=? AND version=?", (name, version)).fetchone() is not None

    def versions(self, name: str | None = None) -> list[VersionInfo]:
        """Every version (of `name`, or of all models), newest first within a model."""
        db = self._db()
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
        db = self._db()
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
        return [r[0] for r in self._db().execute(
            "SELECT version FROM versions WHERE name=? ORDER BY sort_key DESC", (name,))]

    def model_names(self) -> list[str]:
        return [r[0] for r in self._db().execute("SELECT DISTINCT name FROM versions ORDER BY name")]

    def tags(self, name: str) -> dict[str, str]:
        return dict(self._db().execute("SELECT tag, version FROM tags WHERE name=? ORDER BY tag", (name,)).fetchall())

    def blob_in_use(self, sha256: str) -> bool:
        return self._db().execute("SELECT 1 FROM files WHERE sha256=? LIMIT 1", (sha256,)).fetchone() is not None

    def files_of(self, name: str, version: str) -> list[str]:
        return [r[0] for r in self._db().execute("SELECT sha256 FROM files WHERE name=? AND version=?", (name, version))]

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
        rows = self._db().execute(" ".join(sql), args).fetchall()
        newest: dict[str, str] = {}
        if latest_only:
            for n, key in self._db().execute("SELECT name, max(sort_key) FROM versions GROUP BY name"):
                newest[n] = key
        out = []
        for n, v, t, d, b, lat, acc, passed, key in rows:
            if latest_only and newest.get(n) != key:
                continue
            out.append({"name": n, "version": v, "task": t or "", "description": d or "", "build": b,
                        "latency_p50_ms": lat, "accuracy": acc, "passed": bool(passed)})
        return out
