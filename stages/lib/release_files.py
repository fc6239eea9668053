"""Files of a release folder: atomic copies, FileRefs (path, sha256, size), the completeness check.

A release folder is what `zoo.registry.store.LocalZoo.publish` reads: every file listed in its
manifest, with the recorded bytes, and nothing else. Files are written through a temp file and a
rename so a crash never leaves a half-written one behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from zoo.errors import StageFailed
from zoo.registry.manifest import MANIFEST_FILE, FileRef, Manifest


def copy_file(src: Path, dst: Path) -> Path:
    """Copy `src` to `dst` atomically (temp file in dst's folder, then rename)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return dst


def file_ref(root: Path, path: Path) -> FileRef:
    """`path`'s FileRef: its path relative to `root`, its sha256 and its size."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return FileRef(path=path.relative_to(root).as_posix(), sha256=h.hexdigest(), size=path.stat().st_size)


def check_complete(release: Path, manifest: Manifest) -> None:
    """The release folder holds exactly the manifest's files (besides the manifest), with the recorded bytes."""
    listed = {ref.path: ref for ref in manifest.all_files()}
    present = {p.relative_to(release).as_posix() for p in release.rglob("*") if p.is_file()}
    present.discard(MANIFEST_FILE)
    if present != set(listed):
        raise StageFailed(f"release folder and manifest disagree: unlisted {sorted(present - set(listed))}, "
                          f"missing {sorted(set(listed) - present)}")
    for path, ref in listed.items():
        actual = file_ref(release, release / path)
        if (actual.sha256, actual.size) != (ref.sha256, ref.size):
            raise StageFailed(f"release file {path} changed while deploy was writing it")
