"""The content-addressed blob store: ``blobs/sha256/<aa>/<sha256>``, read-only files.

A blob becomes visible only after its bytes were hashed and matched, so a present blob is a
verified blob; checking presence costs one stat. Partial downloads live in ``partial/`` and
are resumed from their current length.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Iterable

from zoo.registry.fileio import copy_verified


class BlobStore:
    """Blobs of one zoo (local store or a cache), addressed by sha256."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    def partial_path(self, sha256: str) -> Path:
        return self.root / "partial" / f"{sha256}.part"

    def has(self, sha256: str, size: int | None = None) -> bool:
        """True if the blob is present (and `size` long, when given): one stat."""
        try:
            st = os.stat(self.path(sha256))
        except OSError:
            return False
        return size is None or st.st_size == size

    def add(self, src: Path | BinaryIO | Iterable[bytes], sha256: str, size: int, what: str) -> Path:
        """Store bytes as a blob after checking them against (sha256, size); IntegrityError otherwise.

        The source is always hashed, even when the blob exists, so a wrong source file is
        never accepted just because a blob with the claimed digest is already present.
        """
        dest = self.path(sha256)
        if self.has(sha256, size):
            from zoo.registry.fileio import sha256_file

            if isinstance(src, (str, Path)):
                got, n = sha256_file(Path(src))
                if (got, n) != (sha256, size):
                    from zoo.errors import IntegrityError

                    raise IntegrityError(f"{what}: content does not match the manifest "
                                         f"(expected sha256 {sha256[:12]}…, got {got[:12]}…)",
                                         hint="the file was modified after the manifest was written")
                return dest
        copy_verified(src, dest, sha256, size, what)
        return dest

    def remove(self, sha256: str) -> None:
        p = self.path(sha256)
        try:
            os.chmod(p, 0o644)
            p.unlink()
        except FileNotFoundError:
            pass
