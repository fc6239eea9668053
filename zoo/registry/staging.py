"""Helpers to build a staging folder for `LocalZoo.publish` (used by the deploy stage and tests)."""

from __future__ import annotations

import os
from pathlib import Path

from zoo.files import atomic_write, sha256_and_size
from zoo.pathsafety import safe_join
from zoo.registry.codec import dump_manifest
from zoo.registry.manifest import MANIFEST_FILE, FileRef, Manifest


def file_ref(staging_dir: Path, path: str | Path) -> FileRef:
    """The FileRef (relative POSIX path, sha256, size) of a file inside `staging_dir`.

    `path` is either a manifest path (a str, relative to `staging_dir`) or the file's Path (a
    path inside `staging_dir`, as the deploy stage has them); UnsafePath for a file outside it.
    """
    relative = Path(os.path.relpath(path, staging_dir)).as_posix() if isinstance(path, Path) else path
    digest, size = sha256_and_size(safe_join(Path(staging_dir), relative))
    return FileRef(path=relative, sha256=digest, size=size)


def write_manifest(staging_dir: Path, manifest: Manifest) -> Path:
    """Write `manifest` (with created=None) as the staging folder's MANIFEST_FILE."""
    path = Path(staging_dir) / MANIFEST_FILE
    atomic_write(path, dump_manifest(manifest.model_copy(update={"created": None})))
    return path
