"""The content-addressed blob store: ``blobs/sha256/<aa>/<sha256>``, read-only files.

A blob is written only after its bytes were hashed and matched, but a blob on disk can still
change later (a write through a hard link, a bad disk, root ignoring the 0444 mode). So a blob
counts as present only when its content matches its name: `has` hashes it, and remembers the
result in ``verified/<aa>/<sha256>`` keyed by the file's identity (device, inode, size,
mtime_ns, ctime_ns). Any write moves ctime, which the user cannot set back, so a recorded
identity that still matches proves the bytes were not touched since they were hashed: a
re-check costs a stat and a small read. Downloads in progress write to temporary files in
``partial/`` (see `zoo.download`), renamed into place once verified.

Storing a blob and naming it in a manifest are two steps, so a blob that is already stored but
unreferenced (left by `zoo rm` or an interrupted publish) and about to be named again must not
be freed in between. ``.gc.lock`` settles it: whoever stores blobs that a manifest will name
holds it shared (`adding`) until the manifest is committed; whoever frees unreferenced blobs
(`zoo rm`, `zoo gc`) holds it exclusive (`freeing`) while it decides and deletes. Writers do
not wait for each other, only for a freer.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Literal

from zoo.files import copy_verified, link_verified

State = Literal["ok", "missing", "corrupt"]


def _identity(st: os.stat_result) -> str:
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


class BlobStore:
    """Blobs of one zoo (local store or a cache), addressed by sha256."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, sha256: str) -> Path:
        return self.root / "sha256" / sha256[:2] / sha256

    @property
    def partial_dir(self) -> Path:
        """Where downloads write their temporary files (same filesystem as the blobs: renamed into place)."""
        return self.root / "partial"

    @contextmanager
    def adding(self):
        """Held (shared) from storing blobs to committing the manifest that names them: no blob
        is freed meanwhile. Nested or concurrent `adding`s do not wait for each other."""
        with self._gc_lock(fcntl.LOCK_SH):
            yield

    @contextmanager
    def freeing(self):
        """Held (exclusive) while unreferenced blobs are chosen and deleted: waits for every
        `adding` in flight, so a blob about to be named by a manifest is seen as referenced."""
        with self._gc_lock(fcntl.LOCK_EX):
            yield

    @contextmanager
    def _gc_lock(self, mode: int):
        path = self.root / ".gc.lock"
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            try:  # a zoo this user may only read (flock works on a read-only descriptor too)
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                yield  # no lock file and none can be made: nobody frees blobs here either
                return
        try:
            fcntl.flock(fd, mode)  # released by the close, also when the process dies
            yield
        finally:
            os.close(fd)

    def _memo_path(self, sha256: str) -> Path:
        return self.root / "verified" / sha256[:2] / sha256

    def present(self, sha256: str) -> bool:
        """True if a file is stored under `sha256`, whatever its content (one stat)."""
        return self.path(sha256).is_file()

    def check(self, sha256: str, size: int | None = None, *, rehash: bool = False) -> State:
        """"ok" when the blob exists and its content hashes to `sha256` (and is `size` long),
        "missing" when it does not exist, "corrupt" when its bytes differ from its name.

        The hash is memoised per file identity, so a blob checked before costs a stat;
        `rehash` ignores the memo (`zoo fsck`).
        """
        try:
            st = os.stat(self.path(sha256))
        except OSError:
            return "missing"
        if size is not None and st.st_size != size:
            return "corrupt"
        try:
            if not rehash and self._memo_path(sha256).read_text() == _identity(st):
                return "ok"
        except OSError:
            pass
        from zoo.files import sha256_and_size

        try:
            got, _ = sha256_and_size(self.path(sha256))
        except FileNotFoundError:
            return "missing"
        if got != sha256:
            self._memo_path(sha256).unlink(missing_ok=True)
            return "corrupt"
        self.mark_verified(sha256, st)
        return "ok"

    def has(self, sha256: str, size: int | None = None) -> bool:
        """True if the blob is present with the right content (see `check`); a corrupt blob is not had."""
        return self.check(sha256, size) == "ok"

    def mark_verified(self, sha256: str, st: os.stat_result | None = None) -> None:
        """Record that the blob's current bytes were just verified by the caller (hashed while written),
        so its first `check` is a stat (best effort: a lost memo costs a re-hash)."""
        from zoo.files import atomic_write

        try:
            st = st or os.stat(self.path(sha256))
            atomic_write(self._memo_path(sha256), _identity(st).encode(), fsync=False)
        except Exception:  # noqa: BLE001 - the memo is an optimisation, never a reason to fail
            pass

    def relinked(self, sha256: str, before: os.stat_result) -> None:
        """After a hard link to a verified blob (which moves its ctime), keep the memo valid if the
        content cannot have changed in between (same size and mtime as when it was verified)."""
        try:
            st = os.stat(self.path(sha256))
        except OSError:
            return
        if (st.st_ino, st.st_size, st.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns):
            self.mark_verified(sha256, st)

    def add(self, src: Path | BinaryIO | Iterable[bytes], sha256: str, size: int, what: str, *,
            link: bool = False) -> Path:
        """Store bytes as a blob after checking them against (sha256, size); IntegrityError otherwise.

        The source is always hashed, even when the blob exists, so a wrong source file is
        never accepted just because a blob with the claimed digest is already present. A
        stored blob whose bytes went bad is replaced by the (verified) new bytes. `link`: the
        source is a read-only file of zoo's own run cache, stored as a hard link to it rather
        than a copy (`zoo.files.link_verified`).
        """
        dest = self.path(sha256)
        if self.has(sha256, size):
            from zoo.files import sha256_and_size

            if isinstance(src, (str, Path)):
                got, n = sha256_and_size(Path(src))
                if (got, n) != (sha256, size):
                    from zoo.errors import IntegrityError

                    raise IntegrityError(f"{what}: content does not match the manifest "
                                         f"(expected sha256 {sha256[:12]}…, got {got[:12]}…)",
                                         hint="the file was modified after the manifest was written")
                return dest
        if link and isinstance(src, (str, Path)):
            link_verified(Path(src), dest, sha256, size, what)
        else:
            copy_verified(src, dest, sha256, size, what)
        self.mark_verified(sha256)
        return dest

    def remove(self, sha256: str) -> None:
        self._memo_path(sha256).unlink(missing_ok=True)
        p = self.path(sha256)
        try:
            p.unlink()  # no chmod first: the blob may be a hard link to a run cache object, which stays read-only
        except FileNotFoundError:
            pass
        except PermissionError:  # file systems that refuse to remove a read-only file
            os.chmod(p, 0o644)
            p.unlink(missing_ok=True)
