"""Helpers to build a staging folder for `LocalZoo.publish` (used by tests and the importer); a kind
writing a release uses `zoo.manifest.file_ref`, re-exported here."""

from __future__ import annotations

from pathlib import Path

from zoo.files import atomic_write
from zoo.manifest import file_ref
from zoo.registry.codec import dump_manifest
from zoo.registry.manifest import MANIFEST_FILE, Manifest

__all__ = ["file_ref", "write_manifest"]


def write_manifest(staging_dir: Path, manifest: Manifest) -> Path:
    """Write `manifest` (with created=None) as the staging folder's MANIFEST_FILE."""
    path = Path(staging_dir) / MANIFEST_FILE
    atomic_write(path, dump_manifest(manifest.model_copy(update={"created": None})))
    return path
