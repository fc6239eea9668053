"""Helpers to build a staging folder for `LocalZoo.publish` (used by the deploy stage and tests)."""

from __future__ import annotations

from pathlib import Path

from zoo.registry.codec import dump_manifest
from zoo.registry.fileio import atomic_write_bytes, sha256_file
from zoo.registry.manifest import MANIFEST_FILE, FileRef, Manifest
from zoo.registry.safety import safe_join


def file_ref(staging_dir: Path, relative: str) -> FileRef:
    """A FileRef (path, sha256, size) for the file at `relative` inside `staging_dir`."""
    path = safe_join(Path(staging_dir), relative)
    digest, size = sha256_file(path)
    return FileRef(path=relative, sha256=digest, size=size)


def write_manifest(staging_dir: Path, manifest: Manifest) -> Path:
    """Write `manifest` (with created=None) as the staging folder's MANIFEST_FILE."""
    path = Path(staging_dir) / MANIFEST_FILE
    atomic_write_bytes(path, dump_manifest(manifest.model_copy(update={"created": None})))
    return path
