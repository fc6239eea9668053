"""The content-addressed run cache.

Layout under the cache dir (default ``./cache``, env ``ZOO_CACHE_DIR``, flag ``--cache-dir``)::

    objects/ab/cdef…        file contents, named by blake3 digest, read-only
    entries/ab/<key>.json   one record per completed stage run (schema_version, outputs, metrics)
    out/<key>/…             outputs materialised as hardlinks to objects (rebuilt on demand)
    logs/<key>.log          each stage's captured stdout/stderr
    locks/<key>.lock        one lock per key, so concurrent runs never compute a key twice
    records/ab/<record>     the key of the last entry recorded for a record identity (lockfile.record_identity):
                            how `status --why` names the code that changed when the record did not
    runs/<id>.lock|.json    each live run's lease: what gc must leave alone (zoo/engine/leases.py)
    partial/                downloads from a remote run cache in progress (zoo/engine/remote_cache.py);
                            an interrupted one is resumed by the next run, gc empties it when no run is live
    tmp/<run id>/           a live run's stage workspaces; anything else here is garbage
    hashes.sqlite           stat cache: an unchanged file is never hashed twice

Crash safety: objects are written to tmp/, fsynced and renamed into place; the entry is
written last, the same way. A run killed at any point leaves at most garbage in tmp/ and
unreferenced objects, never an entry that would count as a hit. An entry is written only when
every declared output is in it, and lookup refuses one whose outputs are not (older versions
could commit one after gc removed a stage's workspace).

gc and live runs: `gc` skips whatever a live run's lease holds (its workspaces, the keys it
uses with their entries, objects and out/ folders, objects it stores before their entry exists)
and reports what it skipped; see zoo/engine/leases.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from zoo.errors import IntegrityError, MalformedEntry, StageFailed, StorageError, is_no_space, no_space
from zoo.files import atomic_write, hardlink_or_copy
from zoo.engine.hashing import StatCache, digest_json, hash_file_uncached, tree_files

ENTRY_SCHEMA_VERSION = 1


@dataclass
class Entry:
    """A completed stage run: what it produced and how to find the bytes."""

    key: str
    stage: str
    kind: str
    outputs: dict[str, dict[str, Any]]  # name -> {"path": relpath, "digest": digest}
    files: dict[str, dict[str, Any]]  # relpath -> {"digest", "size", "mode"}
    metrics: dict[str, Any] = field(default_factory=dict)
    parts: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    created: float = 0.0
    host: dict[str, Any] = field(default_factory=dict)  # where it ran (zoo.host.describe); not part of the key

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": ENTRY_SCHEMA_VERSION, "key": self.key, "stage": self.stage, "kind": self.kind,
                "outputs": self.outputs, "files": self.files, "metrics": self.metrics, "parts": self.parts,
                "duration_s": self.duration_s, "created": self.created, "host": self.host}

    @classmethod
    def from_json(cls, data: Any) -> "Entry":
        """The entry `data` describes; ValueError (a pydantic ValidationError) when it is not a valid
        entry document of this schema: every field's type is checked before anything uses it."""
        from zoo.engine.entry_schema import EntryDoc

        if not isinstance(data, dict) or data.get("schema_version") != ENTRY_SCHEMA_VERSION:
            found = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"unsupported cache entry schema_version {found!r}")
        doc = EntryDoc.model_validate(data)
        return cls(key=doc.key, stage=doc.stage, kind=doc.kind,
                   outputs={name: out.model_dump() for name, out in doc.outputs.items()},
                   files={rel: meta.model_dump() for rel, meta in doc.files.items()},
                   metrics=dict(doc.metrics), parts=dict(doc.parts), duration_s=doc.duration_s, created=doc.created,
                   host=doc.host.model_dump(exclude_none=True) if doc.host is not None else {})

    def output_digests(self) -> dict[str, str]:
        return {name: out["digest"] for name, out in self.outputs.items()}


class Cache:
    """The run cache rooted at `root`; see the module docstring for the layout."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.entries = self.root / "entries"
        self.out = self.root / "out"
        self.logs = self.root / "logs"
        self.locks = self.root / "locks"
        self.tmp = self.root / "tmp"
        self.runs = self.root / "runs"
        self.records = self.root / "records"
        self.notes: list[str] = []  # entries found invalid (each a miss), for the run to print
        self._noted: set[str] = set()
        self.lease = None  # the RunLease of the run using this Cache object, if any (zoo/engine/leases.py)
        self._hashes: StatCache | None = None

    # --- set-up -------------------------------------------------------------------------
    def ensure(self) -> "Cache":
        """Create the folders (idempotent); StorageError if the cache dir is unusable."""
        try:
            for d in (self.objects, self.entries, self.out, self.logs, self.locks, self.tmp, self.runs):
                d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            if is_no_space(e):
                raise no_space(self.root) from e
            raise StorageError(f"cannot create the cache at {self.root}: {e.strerror}",
                               hint="pass --cache-dir or set ZOO_CACHE_DIR to a writable folder") from None
        return self

    @property
    def hashes(self) -> StatCache:
        if self._hashes is None:
            self._hashes = StatCache(self.root / "hashes.sqlite" if self.root.exists() else None)
        return self._hashes

    # --- entries ------------------------------------------------------------------------
    def entry_path(self, key: str) -> Path:
        return self.entries / key[:2] / f"{key}.json"

    def lookup(self, key: str) -> Entry | None:
        """The entry for `key` if it exists, is readable, holds every output it declares, and all
        its objects are present."""
        entry = self.read_entry(key)
        if entry is None:
            return None
        if missing_outputs(entry.outputs, entry.files):
            return None  # committed by an older zoo after its files vanished: never a hit
        for meta in entry.files.values():
            if not self.object_path(meta["digest"]).exists():
                return None
        return entry

    def read_entry(self, key: str) -> Entry | None:
        """The entry for `key` regardless of its objects; None if absent or not a valid entry (a
        note says so: `malformed_entry`)."""
        try:
            return self.load_entry(key)
        except FileNotFoundError:
            return None
        except MalformedEntry as e:
            if key not in self._noted:  # one note per entry and Cache
                self._noted.add(key)
                self.notes.append(f"{e.message}; treated as a miss (`zoo gc` removes it)")
            return None

    def load_entry(self, key: str) -> Entry:
        """The entry for `key`. FileNotFoundError when there is none; MalformedEntry when the file
        is not a valid entry: a link or not a regular file, larger than any entry, not JSON, or
        any field of the wrong type (a damaged or tampered cache must be a miss, never a traceback
        in whatever reads the field later)."""
        from zoo.engine import entry_schema
        from zoo.engine.entry_schema import first_problem
        from zoo.files import NotARegularFile, read_regular

        path = self.entry_path(key)
        try:
            data = read_regular(path, entry_schema.ENTRY_MAX_BYTES)
        except FileNotFoundError:
            raise
        except NotARegularFile as e:
            raise MalformedEntry(f"the cache entry {path} is {e.strerror}") from None
        except OSError as e:
            raise MalformedEntry(f"the cache entry {path} cannot be read: {e.strerror or e}") from None
        if len(data) > entry_schema.ENTRY_MAX_BYTES:
            raise MalformedEntry(f"the cache entry {path} is larger than {entry_schema.bound()}")
        try:
            entry = Entry.from_json(json.loads(data))
        except (ValueError, RecursionError) as e:
            raise MalformedEntry(f"the cache entry {path} is not a valid entry ({first_problem(e)})") from None
        if entry.key != key:
            raise MalformedEntry(f"the cache entry {path} describes another key ({entry.key[:16]}…)")
        # installed from a forged remote entry by an older zoo (one that lacks an output is read,
        # and never a hit: `lookup`)
        lies = [] if missing_outputs(entry.outputs, entry.files) else misdeclared_outputs(entry)
        if lies:
            raise MalformedEntry(f"the cache entry {path} declares output {lies[0]}")
        return entry

    def iter_entries(self) -> Iterator[Entry]:
        for p in self._entry_files():
            entry = self.read_entry(p.stem)
            if entry is not None:
                yield entry

    def _entry_files(self) -> list[Path]:
        return sorted(self.entries.glob("*/*.json")) if self.entries.exists() else []

    # --- objects ------------------------------------------------------------------------
    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def _store_file(self, src: Path, digest: str) -> None:
        """Move `src` into objects/ under `digest` (rename, so no copy); idempotent."""
        dest = self.object_path(digest)
        if dest.exists():
            src.unlink()
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(src, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(src, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (os.stat(src).st_mode & 0o111))
        os.replace(src, dest)

    def install_object(self, src: Path, digest: str) -> None:
        """Move a file whose blake3 digest the caller has checked into objects/ (a rename; idempotent)."""
        try:
            self._store_file(src, digest)
        except OSError as e:
            if is_no_space(e):
                raise no_space(self.root) from e
            raise StorageError(f"cannot store an object in the cache {self.root}: {e}",
                               hint="check the cache folder's permissions and disk") from e

    def record(self, entry: Entry) -> None:
        """Write `entry` (atomically), every object it names being in objects/ already: the
        last step of taking a stage from a remote cache, as of committing one that ran."""
        absent = [m["digest"] for m in entry.files.values() if not self.object_path(m["digest"]).exists()]
        if absent:
            raise IntegrityError(f"cache entry of stage {entry.stage}: object {absent[0][:16]}… is not in the cache",
                                 hint="run again; zoo will fetch or recompute the stage")
        try:
            atomic_write(self.entry_path(entry.key), json.dumps(entry.to_json(), indent=1, sort_keys=True).encode())
            if entry.parts:
                self._note_record(entry)
        except OSError as e:
            if is_no_space(e):
                raise no_space(self.root) from e
            raise StorageError(f"cannot record stage {entry.stage} in the cache {self.root}: {e}",
                               hint="check the cache folder's permissions and disk") from e

    def _note_record(self, entry: Entry) -> None:
        from zoo.engine.lockfile import record_identity

        identity = record_identity(entry.parts)
        atomic_write(self.records / identity[:2] / identity, entry.key.encode(), fsync=False)  # a hint: may be lost

    def entry_of_record(self, identity: str, *, other_than: str = "") -> Entry | None:
        """The last entry recorded for record `identity` under a key other than `other_than`, if this
        cache still holds it (a hint for explaining a rerun; never a hit)."""
        from zoo.files import NotARegularFile, read_regular

        try:  # a shared cache folder is not the user's own: read a key's worth, never a link or device
            key = read_regular(self.records / identity[:2] / identity, 256).decode("ascii").strip()
        except (OSError, NotARegularFile, UnicodeDecodeError, ValueError):
            return None
        if key == other_than or not re.fullmatch(r"[0-9a-f]{16,128}", key):
            return None
        return self.read_entry(key)

    def lookup_record(self, identity: str) -> Entry | None:
        """`lookup` of the last entry recorded for record `identity` (every object present), or None."""
        entry = self.entry_of_record(identity)
        return self.lookup(entry.key) if entry is not None else None

    def tmp_dir(self, prefix: str) -> Path:
        """A fresh workspace: under the run's lease folder when a run holds one (gc skips it)."""
        self.ensure()
        base = self.lease.tmp if self.lease is not None else self.tmp
        base.mkdir(parents=True, exist_ok=True)
        try:
            return Path(tempfile.mkdtemp(dir=base, prefix=prefix))
        except OSError as e:
            if is_no_space(e):
                raise no_space(self.root) from e
            raise

    # --- leases (what gc leaves alone) --------------------------------------------------
    @contextmanager
    def leased(self) -> Iterator["Cache"]:
        """Hold a run lease on this cache for the duration of the block (see zoo/engine/leases.py)."""
        from zoo.engine.leases import RunLease

        if self.lease is not None:
            yield self
            return
        self.ensure()
        lease = RunLease(self).open()
        self.lease = lease
        try:
            yield self
        finally:
            self.lease = None
            lease.close()

    def hold(self, *, keys=(), digests=()) -> None:
        """Register keys / object digests with this run's lease, before using them (no-op without one)."""
        if self.lease is not None:
            self.lease.hold(keys=keys, digests=digests)

    # --- commit and materialise ---------------------------------------------------------
    def commit(self, *, key: str, stage: str, kind: str, out_dir: Path, outputs: dict[str, str],
               metrics: dict[str, Any], parts: dict[str, Any], duration_s: float, record: bool = True,
               host: dict[str, Any] | None = None) -> Entry:
        """Store a finished stage's out_dir and record its entry (last, atomically).

        `outputs` maps output names to paths relative to out_dir (a file or a folder). With
        record=False (cache policy `disable`) the objects are stored for dependents but no entry
        is written, so the result never counts as a hit.
        """
        files: dict[str, dict[str, Any]] = {}
        for path in tree_files(out_dir) if out_dir.is_dir() else []:
            rel = path.relative_to(out_dir).as_posix()
            files[rel] = {"digest": hash_file_uncached(path), "size": path.stat().st_size,
                          "mode": "x" if os.access(path, os.X_OK) and path.stat().st_mode & 0o111 else ""}
        named = {name: {"path": rel, "digest": digest_of_output(rel, files)} for name, rel in outputs.items()}
        bad = missing_outputs(named, files)
        if bad:
            # an entry without its outputs would be a hit that breaks every dependent, forever
            raise StageFailed(f"stage {stage}: declared output {', '.join(bad)} is missing or empty in {out_dir}; "
                              "nothing was cached", stage_id=stage,
                              hint="the kind must write each output it returns (a folder output needs at least "
                                   "one file); if its workspace was deleted while it ran, run again")
        self.hold(keys=[key], digests=[meta["digest"] for meta in files.values()])  # stored before the entry exists
        try:
            for rel, meta in files.items():
                self._store_file(out_dir / rel, meta["digest"])
            entry = Entry(key=key, stage=stage, kind=kind, outputs=named, files=files, metrics=metrics,
                          parts=parts, duration_s=duration_s, created=time.time(), host=dict(host or {}))
            if record:
                self.record(entry)
        except OSError as e:
            if is_no_space(e):
                raise no_space(self.root) from e
            raise StorageError(f"cannot store stage {stage}'s outputs in the cache {self.root}: {e}",
                               hint="check the cache folder's permissions and disk") from e
        return entry

    def materialize(self, entry: Entry) -> Path:
        """out/<key>/ with the entry's files as hardlinks (copies across filesystems)."""
        self.hold(keys=[entry.key])  # before looking: gc must not remove it under our feet
        dest = self.out / entry.key
        if dest.exists() and all((dest / rel).exists() for rel in entry.files):
            return dest
        staging = self.tmp_dir(f"mat-{entry.key[:12]}-")
        try:
            for rel, meta in entry.files.items():
                obj = self.object_path(meta["digest"])
                if not obj.exists():
                    raise IntegrityError(f"cache object {meta['digest'][:16]}… of stage {entry.stage} is missing",
                                         hint="run again; zoo will recompute the stage")
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                hardlink_or_copy(obj, target)
            if dest.exists():
                shutil.rmtree(dest, ignore_errors=True)
            try:
                os.replace(staging, dest)
            except OSError:
                # a concurrent run materialised it first: theirs is as good as ours
                shutil.rmtree(staging, ignore_errors=True)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
        return dest

    def output_paths(self, entry: Entry) -> dict[str, Path]:
        """Materialise the entry and return {output name: absolute path}."""
        base = self.materialize(entry)
        return {name: base / out["path"] for name, out in entry.outputs.items()}

    # --- logs and locks -----------------------------------------------------------------
    def log_path(self, key: str) -> Path:
        return self.logs / f"{key}.log"

    def lock(self, key: str):
        """An inter-process lock for computing `key` (filelock; released if the process dies)."""
        from filelock import FileLock

        self.locks.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.locks / f"{key}.lock"))

    # --- garbage collection -------------------------------------------------------------
    def gc(self, keep_records: set[str] | None = None, *, dry_run: bool = False) -> dict[str, Any]:
        """Remove tmp leftovers, materialisations, and objects no kept entry references.

        With `keep_records` (record identities, `zoo.engine.lockfile.record_identity`), entries whose
        record is not among them are removed first (e.g. keep only what the current recipes' lockfiles
        record). Whatever a live run holds (zoo/engine/leases.py) is skipped and counted
        in "skipped"; gc waits only for the brief moments a run registers, never for a run.
        Returns counts and bytes freed.
        """
        from zoo.engine.leases import gc_mutex, live_holdings

        if not self.root.exists():
            return {"bytes_freed": 0, "objects_removed": 0, "entries_removed": 0,
                    "skipped": {"runs": [], "entries": 0, "workspaces": 0, "materialised": 0, "objects": 0}}
        with gc_mutex(self):
            held = live_holdings(self, clean=not dry_run)
            return self._gc_locked(keep_records, held, dry_run)

    def _gc_locked(self, keep_records: set[str] | None, held, dry_run: bool) -> dict[str, Any]:
        from zoo.engine.lockfile import record_identity

        freed = removed_entries = removed_objects = 0
        skipped = {"runs": sorted(held.pids), "entries": 0, "workspaces": 0, "materialised": 0, "objects": 0}
        kept_entries = []
        for path in self._entry_files():
            try:
                entry = self.load_entry(path.stem)
            except FileNotFoundError:
                continue
            except MalformedEntry:  # never a hit, so of no use to anyone: garbage (a poisoned cache heals)
                entry = None
            if entry is not None and (keep_records is None or record_identity(entry.parts) in keep_records):
                kept_entries.append(entry)
            elif path.stem in held.keys:
                skipped["entries"] += 1
                if entry is not None:
                    kept_entries.append(entry)
            else:
                removed_entries += 1
                if not dry_run:
                    _remove(path)
                    self.log_path(path.stem).unlink(missing_ok=True)
        referenced = {meta["digest"] for e in kept_entries for meta in e.files.values()}
        if self.tmp.exists():
            for child in self.tmp.iterdir():
                if child.name in held.ids:
                    skipped["workspaces"] += 1
                    continue
                freed += _tree_size(child)
                if not dry_run:
                    _remove(child)
        partial = self.root / "partial"
        if partial.exists() and not held.pids:  # a live run may be downloading into it
            for child in partial.iterdir():
                freed += _tree_size(child)
                if not dry_run:
                    _remove(child)
        if self.out.exists():
            # materialisations are hardlinks to objects: removing them frees the objects' bytes below
            for child in self.out.iterdir():
                if child.name in held.keys:
                    skipped["materialised"] += 1
                elif not dry_run:
                    _remove(child)
        if self.objects.exists():
            for obj in self.objects.glob("*/*"):
                digest = obj.parent.name + obj.name
                if digest in referenced:
                    continue
                if digest in held.digests:
                    skipped["objects"] += 1
                    continue
                removed_objects += 1
                try:
                    freed += obj.stat().st_size
                except FileNotFoundError:
                    continue
                if not dry_run:
                    obj.unlink(missing_ok=True)
        return {"bytes_freed": freed, "objects_removed": removed_objects, "entries_removed": removed_entries,
                "skipped": skipped}


def missing_outputs(outputs: dict[str, dict[str, Any]], files: dict[str, Any]) -> list[str]:
    """The declared outputs (as "name (path)") that are not a non-empty file or a folder with files."""
    bad = []
    for name, out in outputs.items():
        rel = out.get("path", "")
        meta = files.get(rel)
        present = (meta.get("size", 1) > 0) if meta is not None else bool(_inside(rel, files))
        if not present:
            bad.append(f"{name!r} ({rel})")
    return bad


def _inside(rel: str, files: dict[str, Any]) -> dict[str, str]:
    """{path inside the folder output `rel`: digest} ("." is the whole out_dir)."""
    prefix = "" if rel in (".", "") else rel.rstrip("/") + "/"
    return {k[len(prefix):]: v["digest"] for k, v in files.items() if k.startswith(prefix)}


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _tree_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def digest_of_output(rel: str, files: dict[str, dict[str, Any]]) -> str:
    """The digest of the output at `rel` among a stage's `files` ({path: {"digest", ...}}): a file's
    own blake3, or a folder's `tree_digest` of the files under it. What `Cache.commit` records and
    lockfiles pin; a remote entry's declared output digests are recomputed with it
    (zoo/engine/remote_cache.py)."""
    if rel in files:
        return files[rel]["digest"]
    prefix = rel.rstrip("/") + "/"  # a folder (the same digest as ever: lockfiles pin it)
    return tree_digest({k[len(prefix):]: v["digest"] for k, v in files.items() if k.startswith(prefix)})


def misdeclared_outputs(entry: "Entry") -> list[str]:
    """The outputs of `entry` whose declared digest is not the one its files make (`digest_of_output`),
    each as "'name' as DECLARED, but the files it brings make MADE"; [] for an honest entry."""
    bad = []
    for name, out in sorted(entry.outputs.items()):
        made = digest_of_output(out["path"], entry.files)
        if made != out["digest"]:
            bad.append(f"{name!r} as {out['digest']}, but the files it brings make {made}")
    return bad


def tree_digest(files: dict[str, str]) -> str:
    """The digest of a folder output from {relative path: blake3} of its files (lockfiles pin it)."""
    return digest_json({"tree": files})


def output_digest(path: Path) -> str:
    """The digest `Cache.commit` gives an output at `path`: a file's blake3, or its folder's `tree_digest`."""
    path = Path(path)
    if path.is_file():
        return hash_file_uncached(path)
    return tree_digest({p.relative_to(path).as_posix(): hash_file_uncached(p) for p in tree_files(path)})
