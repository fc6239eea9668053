"""The completeness check of a release folder (what the engine publishes to the local zoo):
every file its manifest lists, with the recorded bytes, and nothing else.

The files are written with `zoo.files` (atomic copies and writes) and described with
`zoo.manifest.file_ref`.
"""

from __future__ import annotations

from pathlib import Path

from zoo.errors import StageFailed
from zoo.manifest import MANIFEST_FILE, Manifest, file_ref


def check_complete(release: Path, manifest: Manifest) -> None:
    """The release folder holds exactly the manifest's files (besides the manifest), with the recorded bytes."""
    listed = {ref.path: ref for ref in manifest.all_files()}
    present = {p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file()}
    present.discard(MANIFEST_FILE)
    if present != set(listed):
        raise StageFailed(f"release folder and manifest disagree: unlisted {sorted(present - set(listed))}, "
                          f"missing {sorted(set(listed) - present)}")
    for path, ref in listed.items():
        actual = file_ref(release, path)
        if (actual.sha256, actual.size) != (ref.sha256, ref.size):
            raise StageFailed(f"release file {path} changed while deploy was writing it")
