"""Small file primitives: atomic writes, create-exclusive writes, verified copies, sha256."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO, Iterable

from zoo.errors import IntegrityError, StorageError

CHUNK = 8 << 20


def _tmp_near(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temp file + rename, so readers never see half a file."""
    path = Path(path)
    tmp = _tmp_near(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise StorageError(f"cannot write {path}: {e}") from e


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
        except OSError:
            # file systems without hard links: O_EXCL create, then fill (readers tolerate via re-read)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            return True
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
        raise StorageError(f"cannot write {dest}: {e}") from e
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
        raise StorageError(f"cannot place {dest}: {e}") from e
    finally:
        tmp.unlink(missing_ok=True)
