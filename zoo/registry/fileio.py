"""Small file primitives: atomic writes, create-exclusive writes, verified copies, sha256.

Every failed write raises StorageError naming the path; a full disk says so ("no space left
on <path>"), since the OS message alone does not say which file system filled up.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable

from zoo.errors import IntegrityError, StorageError, is_no_space

CHUNK = 8 << 20


def storage_error(path: Path, e: OSError, verb: str = "write") -> StorageError:
    """The StorageError for an OSError while writing `path` (a full disk is `errors.NoSpace`)."""
    from zoo.errors import no_space

    if is_no_space(e):
        return no_space(_mount_of(Path(path)), detail=f"writing {path}",
                        hint="free some space (`zoo gc`, `zoo rm` old versions) or point ZOO_HOME at a "
                             "larger disk, then retry")
    return StorageError(f"cannot {verb} {path}: {e.strerror or e}")


def _mount_of(path: Path) -> Path:
    """The mount point holding `path` (the nearest existing ancestor's file system)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        dev = os.stat(p).st_dev
        while p != p.parent and os.stat(p.parent).st_dev == dev:
            p = p.parent
    except OSError:
        pass
    return p


def _tmp_near(path: Path) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise storage_error(path, e) from e
    os.close(fd)
    return Path(name)


def atomic_write_bytes(path: Path, data: bytes, *, sync: bool = True, mode: int | None = None) -> None:
    """Write `data` to `path` via a temp file + rename, so readers never see half a file.

    `mode` sets the file's permissions (default: mkstemp's 0600); `sync=False` skips the fsync
    for caches that may be lost without harm.
    """
    path = Path(path)
    tmp = _tmp_near(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise storage_error(path, e) from e


def create_exclusive_bytes(path: Path, data: bytes) -> bool:
    """Write `data` at `path` only if nothing is there; True if we created it.

    The content is complete before it becomes visible (temp file + hard link, which fails
    atomically when the target exists), so two writers can never both win.
    """
    path = Path(path)
    tmp = _tmp_near(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as e:
            if is_no_space(e):
                raise
            # file systems without hard links: O_EXCL create, then fill (readers tolerate via re-read)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
    except OSError as e:
        raise storage_error(path, e) from e
    finally:
        tmp.unlink(missing_ok=True)


def sha256_file(path: Path) -> tuple[str, int]:
    """(sha256 hex, size) of a file, read in large chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def copy_verified(src: Path | BinaryIO | Iterable[bytes], dest: Path, sha256: str, size: int, what: str) -> None:
    """Copy bytes into `dest` (atomically) only if they hash to `sha256` and are `size` long.

    On mismatch nothing is left at `dest` and IntegrityError names `what`.
    """
    dest = Path(dest)
    tmp = _tmp_near(dest)
    h = hashlib.sha256()
    n = 0
    try:
        with open(tmp, "wb") as out:
            for chunk in _chunks(src):
                h.update(chunk)
                n += len(chunk)
                if n > size:
                    break
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        if n != size or h.hexdigest() != sha256:
            raise IntegrityError(f"{what}: content does not match the manifest "
                                 f"(expected sha256 {sha256[:12]}… and {size} bytes, got "
                                 f"{h.hexdigest()[:12]}… and {n}{'+' if n > size else ''} bytes)",
                                 hint="the file was modified or corrupted; rebuild or re-download it")
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
    except OSError as e:
        raise storage_error(dest, e) from e
    finally:
        tmp.unlink(missing_ok=True)


def _chunks(src) -> Iterable[bytes]:
    if isinstance(src, (str, Path)):
        with open(src, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
    elif hasattr(src, "read"):
        while chunk := src.read(CHUNK):
            yield chunk
    else:
        yield from src


def link_or_copy(src: Path, dest: Path) -> None:
    """Place `src` at `dest` atomically: a hard link when possible (no extra space), else a copy."""
    dest = Path(dest)
    tmp = _tmp_near(dest)
    tmp.unlink()
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
            os.chmod(tmp, 0o444)
        os.replace(tmp, dest)
    except OSError as e:
        raise storage_error(dest, e, "place") from e
    finally:
        tmp.unlink(missing_ok=True)


FICLONE = 0x40049409  # linux/fs.h: share the source's extents (copy-on-write) on btrfs, xfs, ...


def private_copy(src: Path, dest: Path, sha256: str, size: int, what: str, mode: int = 0o644) -> None:
    """Place an independent copy of the verified file `src` at `dest` (atomically, with `mode`).

    A reflink when the file system can (no extra space, and a write to either file never
    reaches the other); else a copy hashed on the way, so a copy that does not match `sha256`
    is never placed. Never a hard link: editing the copy must not edit the source.
    """
    dest = Path(dest)
    tmp = _tmp_near(dest)
    try:
        if not _reflink(src, tmp):
            tmp.unlink(missing_ok=True)
            copy_verified(src, tmp, sha256, size, what)
        os.chmod(tmp, mode & ~_umask())
        os.replace(tmp, dest)
    except OSError as e:
        raise storage_error(dest, e, "place") from e
    finally:
        tmp.unlink(missing_ok=True)


def _reflink(src: Path, dest: Path) -> bool:
    import fcntl

    try:
        with open(src, "rb") as s, open(dest, "wb") as d:
            fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
        return True
    except OSError as e:
        if is_no_space(e):
            raise
        return False


def _umask() -> int:
    """The process umask (read, never set)."""
    try:  # read, not set: setting it to probe would race with other threads creating files
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022
