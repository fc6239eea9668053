"""LocalZoo: the local model zoo (publish, resolve, list, tag, remove, materialize).

See `zoo.registry` for the on-disk layout. Every write is atomic; a version becomes visible
only when its manifest is written, after all of its blobs. Manifests and tag files are the
truth: every change to them happens under the model's lock between a pending mark and the
index update (see `zoo.registry.index`), so a writer killed half-way never leaves the index
out of date for the next reader.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

from zoo.errors import Conflict, IntegrityError, InvalidInput, NotFound, StorageError, UnsafePath, ZooError
from zoo.registry.blobs import BlobStore
from zoo.registry.codec import dump_manifest, load_manifest, read_manifest_file, same_content, utc_now
from zoo.files import atomic_write, create_exclusive, current_umask, hardlink_or_copy, reflink_or_copy
from zoo.registry.index import Index, VersionInfo
from zoo.registry.manifest import MANIFEST_FILE, Build, FileRef, Manifest
from zoo.registry.refs import (LATEST, Ref, check_name, check_tag, check_version, import_hint, latest_of,
                               moves_latest, parse_ref)
from zoo.pathsafety import check_external_data, safe_join

PUBLISH_THREADS = max(1, min(4, os.cpu_count() or 1))  # files of a version hashed and stored side by side
# an unreferenced blob younger than this may belong to a publish in flight (blobs before manifest)
BLOB_GC_GRACE_S = 3600.0
PENDING_DIR = "index-pending"  # <model name>: a writer of that model has not finished updating the index


class LocalZoo:
    """The zoo under `root` (default: `zoo.paths.zoo_home()`)."""

    def __init__(self, root: Path | None = None):
        if root is None:
            from zoo.paths import zoo_home

            root = zoo_home()
        self.root = Path(root)
        self.blobs = BlobStore(self.root / "blobs")
        self.index = Index(self.root / "index.sqlite", source=self)

    # ---- paths --------------------------------------------------------------------------
    def model_dir(self, name: str) -> Path:
        return self.root / "models" / check_name(name)

    def version_dir(self, name: str, version: str) -> Path:
        return self.model_dir(name) / "versions" / check_version(version)

    def manifest_path(self, name: str, version: str) -> Path:
        return self.version_dir(name, version) / MANIFEST_FILE

    def attachments_dir(self, name: str, version: str) -> Path:
        return self.model_dir(name) / "attachments" / check_version(version)

    # ---- attachments (zoo.registry.attachments: signature, bill of materials) -------------
    def attachments(self, name: str, version: str) -> dict[str, bytes]:
        """The attachments of `name@version` held here ({} when none)."""
        from zoo.registry.attachments import MAX_BYTES, NAMES

        folder = self.attachments_dir(name, version)
        out = {}
        for n in NAMES:
            p = folder / n
            if p.is_file() and not p.is_symlink() and p.stat().st_size <= MAX_BYTES:
                out[n] = p.read_bytes()
        return out

    def add_attachment(self, name: str, version: str, filename: str, data: bytes) -> bool:
        """Store attachment `filename` of a version this zoo holds, create-exclusive: False when
        the same bytes are already there, Conflict when other bytes are."""
        from zoo.registry.attachments import check, differs

        ref = f"{name}@{version}"
        check(filename, data, ref)
        if self.get(name, version) is None:
            raise self._not_found(Ref(name, version=version))
        path = self.attachments_dir(name, version) / filename
        with self.storing():
            path.parent.mkdir(parents=True, exist_ok=True)
            if create_exclusive(path, data):
                return True
        if path.read_bytes() == data:
            return False
        raise differs(filename, ref, "the local zoo")

    def tmp_dir(self) -> Path:
        p = self.root / "tmp"
        p.mkdir(parents=True, exist_ok=True)
        return p

    def _lock(self, name: str, timeout: float = 120):
        from filelock import FileLock

        d = self.model_dir(name)
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            from zoo.files import storage_error

            raise storage_error(d, e) from e
        return FileLock(str(d / ".lock"), timeout=timeout)

    # ---- keeping the index true to the files ----------------------------------------------
    def _pending(self, name: str) -> Path:
        return self.root / PENDING_DIR / name

    @contextmanager
    def _changing(self, name: str):
        """Mark `name` pending for the index while its files change (the caller holds its lock).

        The mark is cleared only when the body finished, index update included; if the process
        dies or the body raises, the next read of the index re-syncs the model from its files.
        """
        atomic_write(self._pending(name), b"")
        yield
        self._pending(name).unlink(missing_ok=True)

    def _model_entries(self, name: str) -> list[tuple[Manifest, str]]:
        """(manifest, sha256 of its bytes) of each version of `name` on disk; unreadable ones are skipped
        here (the index lists what can be served) and reported by `zoo fsck`."""
        from zoo.errors import ZooError

        out = []
        for mpath in sorted((self.root / "models" / name).glob(f"versions/*/{MANIFEST_FILE}")):
            try:
                data = mpath.read_bytes()
                m = load_manifest(data, str(mpath))
            except (OSError, ZooError):
                continue
            if (m.name, m.version) == (name, mpath.parent.name):
                out.append((m, hashlib.sha256(data).hexdigest()))
        return out

    def _tag_files(self, name: str) -> dict[str, str]:
        """tag -> version as the tag files say (unreadable or malformed ones are left out)."""
        from zoo.errors import ZooError

        d = self.root / "models" / name / "tags"
        out = {}
        for p in sorted(d.iterdir()) if d.is_dir() else []:
            if p.name.startswith("."):
                continue
            try:
                v = p.read_text().strip()
            except OSError:
                continue
            try:
                out[check_tag(p.name) if p.name != LATEST else p.name] = check_version(v)
            except ZooError:
                continue
        return out

    def _model_names(self) -> list[str]:
        from zoo.errors import ZooError

        d = self.root / "models"
        names = []
        for p in sorted(d.iterdir()) if d.is_dir() else []:
            try:
                names.append(check_name(p.name))
            except ZooError:
                continue
        return names

    def index_entries(self):
        """Every version and tag on disk, for `Index.rebuild` (the manifests are the truth)."""
        entries, tags = [], {}
        for name in self._model_names():
            entries += self._model_entries(name)
            tags[name] = self._tag_files(name)
        return entries, tags

    def reconcile_pending(self, index: Index, wait: bool = False) -> None:
        """Re-sync the models a writer marked pending and did not finish (it died, or failed).

        A model whose lock is held is being written right now: its writer updates the index
        itself, so a read skips it; `wait` (used before freeing blobs) waits for it instead.
        """
        from filelock import Timeout

        try:
            names = os.listdir(self.root / PENDING_DIR)
        except OSError:
            return
        for name in names:
            if name.startswith("."):
                continue
            try:
                lock = self._lock(name, timeout=120 if wait else 0)
                lock.acquire()
            except (Timeout, ZooError):
                continue
            try:
                if self._pending(name).exists():
                    entries = self._model_entries(name)
                    self._repair_latest(name, [m.version for m, _ in entries])
                    index.sync_model(name, entries, self._tag_files(name))
                    self._pending(name).unlink(missing_ok=True)
            finally:
                lock.release()

    def _repair_latest(self, name: str, versions: list[str]) -> bool:
        """Point the `latest` tag file where the zoo's rule says (`refs.latest_of`) if it does not:
        a writer killed between a version's manifest and its `latest` leaves it behind. The caller
        holds the model's lock and updates the index; True if the file was written."""
        want = latest_of(versions)
        if want is None:
            return False
        path = self.root / "models" / name / "tags" / LATEST
        try:
            current = path.read_text().strip()
        except OSError:
            current = None
        if current == want:
            return False
        atomic_write(path, f"{want}\n".encode())
        return True

    def ensure_latest(self, name: str) -> None:
        """Make `latest` follow the rule for `name`'s versions on disk (a no-op when it does)."""
        with self._lock(name), self._changing(name):
            if self._repair_latest(name, [m.version for m, _ in self._model_entries(name)]):
                self.index.set_tag(name, LATEST, self._tag_files(name)[LATEST])

    # ---- reading ------------------------------------------------------------------------
    def get(self, name: str, version: str) -> Manifest | None:
        """The manifest of `name@version`, or None if this zoo does not have it."""
        try:
            return read_manifest_file(self.manifest_path(name, version))
        except FileNotFoundError:
            return None

    def read_tag(self, name: str, tag: str) -> str | None:
        """The version a tag points at, or None."""
        try:
            text = (self.model_dir(name) / "tags" / check_tag(tag)).read_text().strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"cannot read tag {name}@{tag}: {e}") from e
        return check_version(text)

    def tags(self, name: str) -> dict[str, str]:
        """tag -> version for one model."""
        d = self.model_dir(name) / "tags"
        if not d.is_dir():
            return {}
        out = {}
        for p in sorted(d.iterdir()):
            if not p.name.startswith("."):
                v = self.read_tag(name, p.name)
                if v:
                    out[p.name] = v
        return out

    def resolve(self, ref: str | Ref) -> Manifest:
        """The manifest for ``name``, ``name@1.2.0`` or ``name@tag``; NotFound with suggestions."""
        r = parse_ref(ref) if isinstance(ref, str) else ref
        if r.tag is not None:
            # a writer killed mid-way may have left a tag behind its manifests: caught up first
            # (one listdir when no mark is pending)
            self.reconcile_pending(self.index)
        version = r.version or self.read_tag(r.name, r.tag)
        if version is None:
            raise self._not_found(r)
        manifest = self.get(r.name, version)
        if manifest is None:
            raise self._not_found(r)
        return manifest

    def _not_found(self, r: Ref) -> NotFound:
        versions = self.index.version_names(r.name)
        if versions:
            tags = sorted(self.tags(r.name))
            known = ", ".join(versions[:5] + tags)
            return NotFound(f"{r} is not in the local zoo", hint=f"{r.name} has: {known}")
        close = difflib.get_close_matches(r.name, self.index.model_names(), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else import_hint(r.name)
        return NotFound(f"no model called {r.name!r} in the local zoo", hint=hint)

    def list(self, name: str | None = None) -> list[VersionInfo]:
        """Every version in the zoo (of one model, or all), newest first per model, with its tags."""
        return self.index.versions(name)

    def missing(self, files: list[FileRef]) -> list[FileRef]:
        return [f for f in files if not self.blobs.has(f.sha256, f.size)]

    @contextmanager
    def storing(self, *, only_inside: bool = False):
        """A full disk while writing this zoo is a NoSpace that names the zoo's folder and what frees
        space in it (not the run cache's remedy); nothing was half-written (see `publish`).
        `only_inside`: the body also writes elsewhere (`zoo pull --to`), so only an error that names
        a path inside the zoo is the zoo's; others pass unchanged."""
        from zoo.errors import NoSpace, is_no_space, no_space, zoo_no_space_hint
        from zoo.files import _mount_of

        root = os.path.abspath(self.root)

        def ours(text: str | None) -> bool:
            return not only_inside or bool(text) and ((root + os.sep) in text or text == root)

        def full() -> NoSpace:
            return no_space(f"{_mount_of(self.root)}, the disk of the local zoo {self.root}", detail=detail,
                            hint=zoo_no_space_hint(self.root))

        try:
            yield
        except NoSpace as e:
            if not ours(e.message):
                raise
            detail = e.message.partition(" (")[2].removesuffix(")")
            raise full() from e
        except OSError as e:
            if not is_no_space(e) or not ours(e.filename and os.path.abspath(e.filename)):
                raise
            detail = f"writing {e.filename}" if e.filename else ""
            raise full() from e

    # ---- publishing ---------------------------------------------------------------------
    def publish(self, staging_dir: Path, *, link: bool = False) -> Manifest:
        """Publish a staging folder as a new version (see `_publish`); a full disk says it is the zoo's."""
        with self.storing():
            return self._publish(staging_dir, link=link)

    def _publish(self, staging_dir: Path, *, link: bool = False) -> Manifest:
        """Publish a staging folder (MANIFEST_FILE + every file it lists) as a new version.

        `link`: the folder's files are read-only run cache objects (a cached deploy's release),
        stored as hard links rather than copies; a user's folder is always copied, since a later
        write to a linked file would change the zoo's blob too.

        Verifies every file's sha256 and size (IntegrityError), refuses unsafe paths and ONNX
        external data outside the version (UnsafePath), writes blobs first and the manifest last
        (atomically, create-exclusive), then moves `latest`. Republishing the same content returns the
        stored manifest and only restores blobs that went missing or bad; different content under the
        same version raises Conflict.
        """
        staging_dir = Path(staging_dir)
        mpath = staging_dir / MANIFEST_FILE
        try:
            data = mpath.read_bytes()
        except FileNotFoundError:
            raise InvalidInput(f"{staging_dir} has no {MANIFEST_FILE}", hint="the stage that publishes writes it (see zoo.registry.staging)") from None
        manifest = load_manifest(data, str(mpath))
        _check_consistent(manifest)
        sources = {ref.path: safe_join(staging_dir, ref.path, what="manifest file") for ref in manifest.all_files()}
        for path, src in sources.items():
            if not src.is_file():
                raise IntegrityError(f"{manifest.ref}: {path} is listed in the manifest but missing from {staging_dir}")
        existing = self.get(manifest.name, manifest.version)
        if existing is not None:
            kept = self._same_or_conflict(existing, manifest)
            # the same release again: put back any blob lost or corrupted since (e.g. removed by
            # `zoo fsck --repair`), so republishing heals the version instead of leaving it unpullable
            for ref in manifest.all_files():
                if not self.blobs.has(ref.sha256, ref.size):
                    self.blobs.add(sources[ref.path], ref.sha256, ref.size, f"{manifest.ref}: {ref.path}")
            current = self.read_tag(manifest.name, LATEST)
            if current is None or self.get(manifest.name, current) is None or \
                    (current != manifest.version and moves_latest(current, manifest.version)):
                self.ensure_latest(manifest.name)  # a first attempt killed before it moved `latest`
            return kept
        # blobs first (each verified while copied); an unreferenced blob left by a failure is harmless.
        # A blob already stored unreferenced is kept as it is, so none may be freed until the
        # manifest names them (`BlobStore.adding`)
        with self.blobs.adding():
            self._add_blobs(manifest, sources, link)
            self._check_onnx(manifest, lambda ref: self.blobs.path(ref.sha256))
            return self._commit(manifest.model_copy(update={"created": utc_now()}))

    def _add_blobs(self, manifest: Manifest, sources: dict[str, Path], link: bool) -> None:
        """Store every file of `manifest` as a blob, verified; the files side by side (hashing
        releases the GIL, and a release is often a few large builds). Every add finishes before
        the first error, if any, is raised: nothing is left half-written either way."""
        from concurrent.futures import ThreadPoolExecutor

        refs = manifest.all_files()

        def add(ref: FileRef) -> None:
            self.blobs.add(sources[ref.path], ref.sha256, ref.size, f"{manifest.ref}: {ref.path}", link=link)

        workers = max(1, min(PUBLISH_THREADS, len(refs)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zoo-publish") as pool:
            futures = [pool.submit(add, ref) for ref in sorted(refs, key=lambda r: -r.size)]  # largest first
        for future in futures:  # every add has finished (the pool's exit waits): raise the first error
            error = future.exception()
            if error is not None:
                raise error

    def adopt(self, manifest: Manifest) -> Manifest:
        """Record a manifest fetched from a remote (its blobs may arrive later, per build)."""
        _check_consistent(manifest)
        existing = self.get(manifest.name, manifest.version)
        if existing is not None:
            return self._same_or_conflict(existing, manifest)
        if manifest.created is None:
            manifest = manifest.model_copy(update={"created": utc_now()})
        return self._commit(manifest)

    def _same_or_conflict(self, existing: Manifest, new: Manifest) -> Manifest:
        if same_content(existing, new):
            return existing
        raise Conflict(f"{new.ref} is already published with different content",
                       hint="versions are immutable: bump the version (or `zoo rm` the local one first)")

    def _commit(self, manifest: Manifest) -> Manifest:
        data = dump_manifest(manifest)
        path = self.manifest_path(manifest.name, manifest.version)
        with self._lock(manifest.name), self._changing(manifest.name):
            if not create_exclusive(path, data):
                # another publisher won the race: fine if it published the same content
                return self._same_or_conflict(read_manifest_file(path), manifest)
            try:
                self.index.add(manifest, hashlib.sha256(data).hexdigest())
                current = self.read_tag(manifest.name, LATEST)
                if moves_latest(current, manifest.version) or self.get(manifest.name, current) is None:
                    self._write_tag(manifest.name, LATEST, manifest.version)
            except BaseException:
                # nothing half-installed: without its index row and `latest` the version is withdrawn
                # (the pending mark stays, so the next reader re-syncs the index with the files)
                path.unlink(missing_ok=True)
                raise
        return manifest

    def _check_onnx(self, manifest: Manifest, locate) -> None:
        version_files = {f.path for f in manifest.all_files()}
        for build in manifest.builds.values():
            if build.format == "onnx":
                check_external_data(locate(build.file), build.file.path, version_files)

    # ---- tags ---------------------------------------------------------------------------
    def _write_tag(self, name: str, tag: str, version: str) -> None:
        atomic_write(self.model_dir(name) / "tags" / tag, f"{version}\n".encode())
        self.index.set_tag(name, tag, version)

    def tag(self, name: str, version: str, tag: str) -> None:
        """Point `tag` at `name@version` (moving it if it exists); `latest` cannot be set by hand."""
        check_tag(tag)
        if tag == LATEST:
            raise latest_is_automatic(name)
        if self.get(name, version) is None:
            raise self._not_found(Ref(name, version=version))
        with self._lock(name), self._changing(name):
            self._write_tag(name, tag, version)

    def untag(self, name: str, tag: str) -> None:
        check_tag(tag)
        if tag == LATEST:
            raise latest_is_automatic(name)
        p = self.model_dir(name) / "tags" / tag
        if not p.exists():
            raise NotFound(f"{name} has no tag {tag!r}", hint=f"tags: {', '.join(self.tags(name)) or 'none'}")
        with self._lock(name), self._changing(name):
            p.unlink()
            self.index.set_tag(name, tag, None)

    # ---- removing -----------------------------------------------------------------------
    def remove(self, name: str, version: str) -> int:
        """Remove a version, its tags, its snapshot and the blobs no other version uses; returns blobs freed."""
        return self.remove_version(name, version)["blobs_freed"]

    def remove_version(self, name: str, version: str) -> dict:
        """Remove a version like `remove`; returns blobs_freed, tags_dropped (the tags that pointed at
        it, `latest` included) and latest (where `latest` points now, None when no version is left)."""
        manifest = self.get(name, version)
        if manifest is None:
            raise self._not_found(Ref(name, version=version))
        with self._lock(name), self._changing(name):
            vdir = self.version_dir(name, version)
            # the manifest goes first, so an interrupted removal never leaves a version without blobs
            self.manifest_path(name, version).unlink()
            dropped = sorted(t for t, v in self._tag_files(name).items() if v == version)
            for tag in dropped:
                (self.model_dir(name) / "tags" / tag).unlink(missing_ok=True)
            self.index.remove(name, version)
            _rmtree(vdir)
            _rmtree(self.attachments_dir(name, version))
            remaining = [m.version for m, _ in self._model_entries(name)]
            if remaining and self.read_tag(name, LATEST) is None:
                self._write_tag(name, LATEST, latest_of(remaining))
            latest = self.read_tag(name, LATEST) if remaining else None
        freed = self._free_unused(manifest.all_files())
        return {"blobs_freed": freed, "tags_dropped": dropped, "latest": latest}

    def _free_unused(self, files: list[FileRef]) -> int:
        # reference counts come from an index reconciled with the manifests first (waiting for
        # writers in flight), never from one a killed writer left behind
        # (under `freeing`: a publish or pull that is about to name one of them has committed first)
        freed = 0
        with self.blobs.freeing():
            self.reconcile_pending(self.index, wait=True)
            for sha in {f.sha256 for f in files}:
                if not self.index.blob_in_use(sha) and self.blobs.present(sha):
                    self.blobs.remove(sha)
                    freed += 1
        return freed

    def reindex(self) -> int:
        """Rebuild the index from the manifests and tag files on disk; returns the version count."""
        return self.index.rebuild()

    # ---- materializing ------------------------------------------------------------------
    def build_files(self, manifest: Manifest, build: str | Build) -> list[FileRef]:
        """The files a build needs on disk: its model, sidecars, test vectors, the model card, and the
        version-level files (lockfile, provenance statement) that describe every build."""
        b = self.get_build(manifest, build)
        files = {f.path: f for f in b.all_files()}
        for ref in ([manifest.card] if manifest.card else []) + list(manifest.files):
            files.setdefault(ref.path, ref)
        return list(files.values())

    @staticmethod
    def get_build(manifest: Manifest, build: str | Build) -> Build:
        if isinstance(build, Build):
            return build
        if build not in manifest.builds:
            raise NotFound(f"{manifest.ref} has no build {build!r}", hint=f"builds: {', '.join(sorted(manifest.builds))}")
        return manifest.builds[build]

    def check_files(self, manifest: Manifest, files: list[FileRef], build: str) -> None:
        """Every file present with the content its sha256 says (memoised: a stat each once checked).

        IntegrityError (exit 4) for a stored file whose bytes went bad, NotFound for a missing one.
        """
        states = {f.path: self.blobs.check(f.sha256, f.size) for f in files}
        corrupt = [p for p, s in states.items() if s == "corrupt"]
        if corrupt:
            raise IntegrityError(f"{manifest.ref}: the stored copy of {', '.join(corrupt)} does not match its sha256 "
                                 "(corrupted on disk); refusing to serve it",
                                 hint=f"`zoo fsck --repair` removes the bad copy; then `zoo pull {manifest.ref} "
                                      f"--build {build}` from a remote fetches it again, or rerunning the recipe that built it republishes it")
        missing = [p for p, s in states.items() if s == "missing"]
        if missing:
            raise NotFound(f"{manifest.ref} build {build} is not downloaded ({len(missing)} file(s) missing)",
                           hint=f"run `zoo pull {manifest.ref} --build {build}`")

    def check_onnx_files(self, manifest: Manifest, builds: list[str] | None = None) -> list[str]:
        """Check the external-data locations of the ONNX model of each build in `builds` (default: every
        build whose model is stored here); UnsafePath if one points outside the version or at a file
        it does not list. Returns the version-relative paths of the external data files named."""
        version_files = {f.path for f in manifest.all_files()}
        needed: list[str] = []
        for name in builds if builds is not None else sorted(manifest.builds):
            b = manifest.builds[name]
            if b.format != "onnx" or not self.blobs.present(b.file.sha256):
                continue
            needed += check_external_data(self.blobs.path(b.file.sha256), b.file.path, version_files)
        return needed

    def materialize(self, manifest: Manifest, build: str | Build, dest: Path | None = None) -> Path:
        """Place one build's files under `dest` (default: the version's snapshot folder); return the model path.

        In the snapshot folder files are hard links to the read-only blobs (copies across
        devices); anywhere else (`zoo pull --to`) they are independent copies (reflinks where the
        file system can), so editing them never touches the zoo. Every check runs before the
        first file is placed: blobs present with the right content, paths inside `dest`, and
        ONNX external data pointing only at files of this version. Nothing is imported or executed.
        """
        b = self.get_build(manifest, build)
        snapshot = self.version_dir(manifest.name, manifest.version)
        own = dest is None or Path(dest).resolve() == snapshot.resolve()
        dest = snapshot if dest is None else Path(dest)
        files = self.build_files(manifest, b)
        version_files = {f.path: f for f in manifest.all_files()}
        self.check_files(manifest, files, b.name)
        if b.format == "onnx":
            extra = [version_files[rel] for rel in self.check_onnx_files(manifest, [b.name])
                     if rel not in {f.path for f in files}]
            for f in extra:
                if not self.blobs.present(f.sha256):
                    raise NotFound(f"{manifest.ref}: external data {f.path} is not downloaded",
                                   hint=f"run `zoo pull {manifest.ref} --build {b.name}`")
            self.check_files(manifest, extra, b.name)
            files += extra
        dest.mkdir(parents=True, exist_ok=True)
        targets = [(f, safe_join(dest, f.path, what="manifest file")) for f in files]
        mode = 0o444 if own else 0o644 & ~current_umask()
        for f, target in targets:
            blob = self.blobs.path(f.sha256)
            if target.is_symlink() or (target.exists() and not target.is_file()):
                raise UnsafePath(f"{target} exists and is not a regular file", hint="remove it or pull to another folder")
            if own and _same_inode(target, blob):
                continue
            if _holds(target, f):
                _set_mode(target, mode)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if own:
                before = os.stat(blob)
                hardlink_or_copy(blob, target)
                self.blobs.relinked(f.sha256, before)  # a new link moves the blob's ctime, not its bytes
            else:
                reflink_or_copy(blob, target, f.sha256, f.size, f"{manifest.ref}: {f.path}", mode)
        mpath = dest / MANIFEST_FILE
        data = dump_manifest(manifest)
        if not mpath.is_file() or mpath.read_bytes() != data:
            atomic_write(mpath, data, mode=mode)
        else:
            _set_mode(mpath, mode)
        return dest / b.file.path

    def is_materialized(self, manifest: Manifest, build: str | Build, dest: Path | None = None) -> Path | None:
        """The model path if the build is already in the snapshot folder with the right content, else None.

        A few stats: each file must be a link to its blob, and the blob's content check is
        memoised. Folders outside the zoo (`--to`) always go through `materialize`.
        """
        b = self.get_build(manifest, build)
        snapshot = self.version_dir(manifest.name, manifest.version)
        if dest is not None and Path(dest).resolve() != snapshot.resolve():
            return None
        for f in self.build_files(manifest, b):
            if not _same_inode(safe_join(snapshot, f.path), self.blobs.path(f.sha256)) or not self.blobs.has(f.sha256, f.size):
                return None
        return snapshot / b.file.path

    def gc(self, *, dry_run: bool = False, grace_s: float = BLOB_GC_GRACE_S) -> dict[str, int]:
        """Delete blobs no version references (an interrupted publish or `zoo rm` leaves them) and
        the partial downloads nothing is writing (an interrupted pull's, which only a pull of the
        same blob would resume): {"blobs", "partials", "bytes"} removed (`dry_run`: would be).

        A publish stores its blobs before its manifest names them, so an unreferenced blob stored
        (or linked: that too sets the inode's ctime) in the last `grace_s` seconds is kept: it may
        be a publish in flight."""
        from zoo.download import remove_abandoned

        with self.blobs.freeing():  # a publish that re-uses an old unreferenced blob commits first
            self.reconcile_pending(self.index, wait=True)
            partials, freed = remove_abandoned(self.blobs.partial_dir, dry_run=dry_run)
            blobs = 0
            root = self.blobs.root / "sha256"
            young = time.time() - grace_s
            for p in sorted(root.glob("*/*")) if root.is_dir() else []:
                if not self.index.blob_in_use(p.name):
                    st = p.stat()
                    if st.st_ctime > young:
                        continue
                    freed += st.st_size
                    if not dry_run:
                        self.blobs.remove(p.name)
                    blobs += 1
        return {"blobs": blobs, "partials": partials, "bytes": freed}


def latest_is_automatic(name: str) -> InvalidInput:
    """The error for setting or removing `latest` by hand."""
    return InvalidInput(f"`latest` cannot be set by hand: it always points at the newest release of {name}",
                        hint="use another tag (e.g. `zoo tag NAME@VERSION stable`) and pull NAME@stable; "
                             "`zoo rm` a newer version to move latest back")


def _check_consistent(manifest: Manifest) -> None:
    seen: dict[str, str] = {}
    refs = [f for b in manifest.builds.values() for f in b.all_files()] + ([manifest.card] if manifest.card else []) + manifest.files
    for ref in refs:
        if ref.path == MANIFEST_FILE:
            raise InvalidInput(f"{manifest.ref}: a file may not be called {MANIFEST_FILE}", hint="rename it")
        if seen.setdefault(ref.path, ref.sha256) != ref.sha256:
            raise InvalidInput(f"{manifest.ref}: {ref.path} is listed twice with different content",
                               hint="give each distinct file its own path")
    for key, build in manifest.builds.items():
        if key != build.name:
            raise InvalidInput(f"{manifest.ref}: builds.{key} has name {build.name!r}", hint="the key must equal the build name")


def _same_inode(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev)


def _holds(target: Path, ref: FileRef) -> bool:
    """True if the regular file at `target` already has exactly `ref`'s bytes (hashed, not guessed)."""
    from zoo.files import sha256_and_size

    try:
        if target.is_symlink() or not target.is_file() or target.stat().st_size != ref.size:
            return False
        return sha256_and_size(target) == (ref.sha256, ref.size)
    except OSError:
        return False


def _set_mode(path: Path, mode: int) -> None:
    try:
        if (os.stat(path).st_mode & 0o777) != mode:
            os.chmod(path, mode)
    except OSError:
        pass


def _rmtree(path: Path) -> None:
    def onerror(func, p, exc):
        os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
        func(p)

    if path.exists():
        shutil.rmtree(path, onerror=onerror)
