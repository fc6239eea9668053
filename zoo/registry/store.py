"""LocalZoo: the local model zoo (publish, resolve, list, tag, remove, materialize).

See `zoo.registry` for the on-disk layout. Every write is atomic; a version becomes visible
only when its manifest is written, after all of its blobs.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
from pathlib import Path

from zoo.errors import Conflict, IntegrityError, InvalidInput, NotFound, StorageError, UnsafePath
from zoo.registry.blobs import BlobStore
from zoo.registry.codec import dump_manifest, load_manifest, read_manifest_file, same_content, utc_now
from zoo.registry.fileio import atomic_write_bytes, create_exclusive_bytes, link_or_copy
from zoo.registry.index import Index, VersionInfo
from zoo.registry.manifest import MANIFEST_FILE, Build, FileRef, Manifest
from zoo.registry.refs import LATEST, Ref, check_name, check_tag, check_version, is_prerelease, moves_latest, parse_ref
from zoo.registry.safety import check_external_data, safe_join


class LocalZoo:
    """The zoo under `root` (default: `zoo.paths.zoo_home()`)."""

    def __init__(self, root: Path | None = None):
        if root is None:
            from zoo.paths import zoo_home

            root = zoo_home()
        self.root = Path(root)
        self.blobs = BlobStore(self.root / "blobs")
        self.index = Index(self.root / "index.sqlite")

    # ---- paths --------------------------------------------------------------------------
    def model_dir(self, name: str) -> Path:
        return self.root / "models" / check_name(name)

    def version_dir(self, name: str, version: str) -> Path:
        return self.model_dir(name) / "versions" / check_version(version)

    def manifest_path(self, name: str, version: str) -> Path:
        return self.version_dir(name, version) / MANIFEST_FILE

    def tmp_dir(self) -> Path:
        p = self.root / "tmp"
        p.mkdir(parents=True, exist_ok=True)
        return p

    def _lock(self, name: str):
        from filelock import FileLock

        d = self.model_dir(name)
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / ".lock"), timeout=120)

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
        hint = f"did you mean {', '.join(close)}?" if close else "run `zoo list` (or `zoo pull` from a remote)"
        return NotFound(f"no model called {r.name!r} in the local zoo", hint=hint)

    def list(self, name: str | None = None) -> list[VersionInfo]:
        """Every version in the zoo (of one model, or all), newest first per model, with its tags."""
        return self.index.versions(name)

    def has_files(self, files: list[FileRef]) -> bool:
        return all(self.blobs.has(f.sha256, f.size) for f in files)

    def missing(self, files: list[FileRef]) -> list[FileRef]:
        return [f for f in files if not self.blobs.has(f.sha256, f.size)]

    # ---- publishing ---------------------------------------------------------------------
    def publish(self, staging_dir: Path) -> Manifest:
        """Publish a staging folder (MANIFEST_FILE + every file it lists) as a new version.

        Verifies every file's sha256 and size (IntegrityError), refuses unsafe paths and ONNX
        external data outside the version (UnsafePath), writes blobs first and the manifest last
        (atomically, create-exclusive), then moves `latest`. Republishing the same content is a
        no-op returning the stored manifest; different content under the same version raises Conflict.
        """
        staging_dir = Path(staging_dir)
        mpath = staging_dir / MANIFEST_FILE
        try:
            data = mpath.read_bytes()
        except FileNotFoundError:
            raise InvalidInput(f"{staging_dir} has no {MANIFEST_FILE}", hint="the deploy stage writes it") from None
        manifest = load_manifest(data, str(mpath))
        _check_consistent(manifest)
        sources = {ref.path: safe_join(staging_dir, ref.path, what="manifest file") for ref in manifest.all_files()}
        for path, src in sources.items():
            if not src.is_file():
                raise IntegrityError(f"{manifest.ref}: {path} is listed in the manifest but missing from {staging_dir}")
        existing = self.get(manifest.name, manifest.version)
        if existing is not None:
            return self._same_or_conflict(existing, manifest)
        # blobs first (each verified while copied); an unreferenced blob left by a failure is harmless
        for ref in manifest.all_files():
            self.blobs.add(sources[ref.path], ref.sha256, ref.size, f"{manifest.ref}: {ref.path}")
        self._check_onnx(manifest, lambda ref: self.blobs.path(ref.sha256))
        return self._commit(manifest.model_copy(update={"created": utc_now()}))

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
        with self._lock(manifest.name):
            if not create_exclusive_bytes(path, data):
                # another publisher won the race: fine if it published the same content
                return self._same_or_conflict(read_manifest_file(path), manifest)
            self.index.add(manifest, hashlib.sha256(data).hexdigest())
            current = self.read_tag(manifest.name, LATEST)
            if moves_latest(current, manifest.version) or self.get(manifest.name, current) is None:
                self._write_tag(manifest.name, LATEST, manifest.version)
        return manifest

    def _check_onnx(self, manifest: Manifest, locate) -> None:
        version_files = {f.path for f in manifest.all_files()}
        for build in manifest.builds.values():
            if build.format == "onnx":
                check_external_data(locate(build.file), build.file.path, version_files)

    # ---- tags ---------------------------------------------------------------------------
    def _write_tag(self, name: str, tag: str, version: str) -> None:
        atomic_write_bytes(self.model_dir(name) / "tags" / tag, f"{version}\n".encode())
        self.index.set_tag(name, tag, version)

    def tag(self, name: str, version: str, tag: str) -> None:
        """Point `tag` at `name@version` (moving it if it exists)."""
        check_tag(tag)
        if self.get(name, version) is None:
            raise self._not_found(Ref(name, version=version))
        with self._lock(name):
            self._write_tag(name, tag, version)

    def untag(self, name: str, tag: str) -> None:
        check_tag(tag)
        p = self.model_dir(name) / "tags" / tag
        if not p.exists():
            raise NotFound(f"{name} has no tag {tag!r}", hint=f"tags: {', '.join(self.tags(name)) or 'none'}")
        with self._lock(name):
            p.unlink()
            self.index.set_tag(name, tag, None)

    # ---- removing -----------------------------------------------------------------------
    def remove(self, name: str, version: str) -> int:
        """Remove a version, its tags, its snapshot and the blobs no other version uses; returns blobs freed."""
        manifest = self.get(name, version)
        if manifest is None:
            raise self._not_found(Ref(name, version=version))
        with self._lock(name):
            vdir = self.version_dir(name, version)
            # the manifest goes first, so an interrupted removal never leaves a version without blobs
            self.manifest_path(name, version).unlink()
            for tag, v in self.tags(name).items():
                if v == version:
                    (self.model_dir(name) / "tags" / tag).unlink(missing_ok=True)
            self.index.remove(name, version)
            _rmtree(vdir)
            remaining = self.index.version_names(name)
            if remaining and self.read_tag(name, LATEST) is None:
                releases = [v for v in remaining if not is_prerelease(v)]
                self._write_tag(name, LATEST, (releases or remaining)[0])
        freed = 0
        for ref in manifest.all_files():
            if not self.index.blob_in_use(ref.sha256) and self.blobs.has(ref.sha256):
                self.blobs.remove(ref.sha256)
                freed += 1
        return freed

    def reindex(self) -> int:
        """Rebuild the index from the manifests and tag files on disk; returns the version count."""
        self.index.clear()
        count = 0
        models = self.root / "models"
        for mdir in sorted(models.iterdir()) if models.is_dir() else []:
            for mpath in sorted(mdir.glob(f"versions/*/{MANIFEST_FILE}")):
                data = mpath.read_bytes()
                self.index.add(load_manifest(data, str(mpath)), hashlib.sha256(data).hexdigest())
                count += 1
            for tag, version in self.tags(mdir.name).items():
                self.index.set_tag(mdir.name, tag, version)
        return count

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

    def materialize(self, manifest: Manifest, build: str | Build, dest: Path | None = None) -> Path:
        """Place one build's files under `dest` (default: the version's snapshot folder); return the model path.

        Files are hard links to the read-only blobs (copies across devices). Every check runs
        before the first file is placed: blobs present, paths inside `dest`, and ONNX external
        data pointing only at files of this version. Nothing is imported or executed.
        """
        b = self.get_build(manifest, build)
        dest = Path(dest) if dest is not None else self.version_dir(manifest.name, manifest.version)
        files = self.build_files(manifest, b)
        version_files = {f.path: f for f in manifest.all_files()}
        missing = self.missing(files)
        if missing:
            raise NotFound(f"{manifest.ref} build {b.name} is not downloaded ({len(missing)} file(s) missing)",
                           hint=f"run `zoo pull {manifest.ref} --build {b.name}`")
        if b.format == "onnx":
            for rel in check_external_data(self.blobs.path(b.file.sha256), b.file.path, set(version_files)):
                if rel not in {f.path for f in files}:
                    files.append(version_files[rel])
                    if not self.blobs.has(version_files[rel].sha256, version_files[rel].size):
                        raise NotFound(f"{manifest.ref}: external data {rel} is not downloaded",
                                       hint=f"run `zoo pull {manifest.ref} --build {b.name}`")
        dest.mkdir(parents=True, exist_ok=True)
        targets = [(f, safe_join(dest, f.path, what="manifest file")) for f in files]
        for f, target in targets:
            blob = self.blobs.path(f.sha256)
            if _same_file(target, blob):
                continue
            if target.is_symlink() or target.is_dir():
                raise UnsafePath(f"{target} exists and is not a regular file", hint="remove it or pull to another folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(blob, target)
        mpath = dest / MANIFEST_FILE
        if not mpath.exists() or mpath.read_bytes() != dump_manifest(manifest):
            atomic_write_bytes(mpath, dump_manifest(manifest))
        return dest / b.file.path

    def is_materialized(self, manifest: Manifest, build: str | Build, dest: Path | None = None) -> Path | None:
        """The model path if the build is already in place (a few stats), else None."""
        b = self.get_build(manifest, build)
        dest = Path(dest) if dest is not None else self.version_dir(manifest.name, manifest.version)
        for f in self.build_files(manifest, b):
            if not _same_file(safe_join(dest, f.path), self.blobs.path(f.sha256)):
                return None
        return dest / b.file.path

    def gc(self) -> int:
        """Delete blobs no version references and stale partial downloads; returns files removed."""
        removed = 0
        root = self.blobs.root / "sha256"
        for p in root.glob("*/*") if root.is_dir() else []:
            if not self.index.blob_in_use(p.name):
                self.blobs.remove(p.name)
                removed += 1
        return removed


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


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    if (sa.st_ino, sa.st_dev) == (sb.st_ino, sb.st_dev):
        return True
    # a copy (cross-device) counts when size and mtime say it was made from the blob
    return sa.st_size == sb.st_size and sa.st_mtime_ns >= sb.st_mtime_ns and not (sa.st_mode & 0o222)


def _rmtree(path: Path) -> None:
    def onerror(func, p, exc):
        os.chmod(p, 0o755 if os.path.isdir(p) else 0o644)
        func(p)

    if path.exists():
        shutil.rmtree(path, onerror=onerror)
