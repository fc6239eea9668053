"""The file layer: atomic writes and copies, hard links and reflinks, the sha256 of a file.

Every write goes to a temp file in the target's folder under a per-process unique name
(``.NAME.PID.RANDOM.tmp``), is fsynced, renamed over the target, and the folder is fsynced: a
reader sees the old file or the new one, never half of one, and a crash leaves at most a temp
file. A failed write removes its temp file and leaves the old file as it was.

``fsync=False`` skips both fsyncs, for files that may be lost without harm (a memo, a live
run's lease, the fast path's stamp) or that a later step fsyncs (a stage's outputs: the run
cache fsyncs each one when it commits it, and an fsync per write made a stage wait for 233 MB
of writeback the kernel does while the stage goes on).

Errors: an OSError while writing raises StorageError naming the path; a full disk raises
`zoo.errors.NoSpace` naming the file system that filled up ("no space left on MOUNT (writing
PATH)"), since the OS message alone does not say which disk it was.

Only the standard library and `zoo.errors` are imported here, so any module may use this one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

from zoo.errors import IntegrityError, StorageError, is_no_space, no_space

CHUNK = 8 << 20
FICLONE = 0x40049409  # linux/fs.h: share the source's extents (copy-on-write) on btrfs, xfs, ...


# ---------------------------------------------------------------------------------------------
# errors


def storage_error(path: Path, e: OSError, verb: str = "write") -> StorageError:
    """The StorageError for an OSError while writing `path` (a full disk is `errors.NoSpace`)."""
    if is_no_space(e):
        return no_space(_mount_of(Path(path)), detail=f"writing {path}")
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


# ---------------------------------------------------------------------------------------------
# temp files


def temp_path(path: Path) -> Path:
    """A fresh name next to `path` for its temp file: ``.NAME.PID.RANDOM.tmp`` (not created)."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")


def _create_temp(path: Path) -> tuple[int, Path]:
    """(fd, name) of a new, empty temp file next to `path` (mode 0600), creating the folder."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            tmp = temp_path(path)
            try:
                return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), tmp
            except FileExistsError:  # another writer drew the same name: draw again
                continue
    except OSError as e:
        raise storage_error(path, e) from e


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (file systems that cannot fsync a folder are skipped)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as e:
        if is_no_space(e):
            raise
    finally:
        os.close(fd)


def _install(tmp: Path, path: Path, fsync: bool) -> None:
    """Rename the finished temp file `tmp` over `path` (and fsync the folder)."""
    os.replace(tmp, path)
    if fsync:
        _fsync_folder(path.parent)


@contextmanager
def _replacing(path: Path, *, fsync: bool, mode: int | None, verb: str = "write") -> Iterator[BinaryIO]:
    """An open temp file next to `path`; when the block ends it is fsynced, given `mode` and renamed
    over `path`. On any exception it is removed (the old `path` stays) and an OSError becomes a
    StorageError naming `path`: the one shape of every write and copy below."""
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        _install(tmp, path, fsync)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise storage_error(path, e, verb) from e
        raise


# ---------------------------------------------------------------------------------------------
# writes


def atomic_write(path: Path, data: bytes, *, fsync: bool = True, mode: int | None = None) -> Path:
    """Write `data` to `path` through a temp file + fsync + rename; returns `path`.

    `mode` sets the file's permissions (default 0600, the temp file's). On any failure the temp
    file is removed and whatever was at `path` stays as it was.
    """
    path = Path(path)
    with _replacing(path, fsync=fsync, mode=mode) as f:
        f.write(data)
    return path


def atomic_write_text(path: Path, text: str, *, fsync: bool = True, mode: int | None = None) -> Path:
    """`atomic_write` of `text` encoded as UTF-8."""
    return atomic_write(path, text.encode("utf-8"), fsync=fsync, mode=mode)


def atomic_write_json(path: Path, obj: Any, *, fsync: bool = True, mode: int | None = None) -> Path:
    """`atomic_write` of `obj` as indented JSON with sorted keys and a final newline: equal data
    gives equal bytes. NaN and infinities are refused (ValueError): JSON has no such numbers."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
    return atomic_write_text(path, text, fsync=fsync, mode=mode)


@contextmanager
def atomic_output(path: Path, *, fsync: bool = True) -> Iterator[Path]:
    """A temp path for a writer that wants a file name (a library's ``save(path)``), renamed
    over `path` when the block ends without an exception, removed when it raises.

    ``with atomic_output(target) as tmp: save_file(state, str(tmp))``
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise storage_error(path, e) from e
    tmp = temp_path(path)
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        _install(tmp, path, fsync)
    except OSError as e:
        raise storage_error(path, e) from e
    finally:
        tmp.unlink(missing_ok=True)


def create_exclusive(path: Path, data: bytes) -> bool:
    """Write `data` at `path` only if nothing is there; True if we created it.

    The content is complete before it becomes visible (temp file + hard link, which fails
    atomically when the target exists), so two writers can never both win.
    """
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
            _fsync_folder(path.parent)
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


# ---------------------------------------------------------------------------------------------
# copies and links


def atomic_copy(src: Path, dest: Path, *, fsync: bool = True, mode: int | None = None) -> Path:
    """Copy the bytes of `src` to `dest` through a temp file + rename (`atomic_write`'s rules)."""
    dest = Path(dest)
    with _replacing(dest, fsync=fsync, mode=mode, verb="copy to") as d, open(src, "rb") as s:
        shutil.copyfileobj(s, d, CHUNK)
    return dest


def copy_verified(src: Path | BinaryIO | Iterable[bytes], dest: Path, sha256: str, size: int, what: str) -> None:
    """Copy bytes (a file, a stream or chunks) to `dest` (atomically, read-only) only if they hash
    to `sha256` and are `size` long. On mismatch nothing is left at `dest` and IntegrityError
    names `what`."""
    with _replacing(Path(dest), fsync=True, mode=0o444) as out:
        _fill_verified(out, src, sha256, size, what)


# (device, inode, size, mtime_ns) -> sha256 of the files this process verified while downloading
# them (`remember_sha256`), so placing one of them again (`link_verified`) need not hash it again.
# ctime is left out on purpose: every hard link moves it. In memory only: a later process hashes.
# Bounded, least recently used first out: a download is placed right after it is verified, so a
# few thousand entries cover every file in flight, and a long-lived worker does not grow forever.
VERIFIED_MEMO_SIZE = 4096
_VERIFIED_SHA256: OrderedDict[tuple[int, int, int, int], str] = OrderedDict()
_VERIFIED_LOCK = threading.Lock()  # downloads run in a thread pool


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def remember_sha256(path: Path, sha256: str) -> None:
    """Record that this process just verified the read-only file at `path` to hash to `sha256`
    (the last VERIFIED_MEMO_SIZE files are remembered)."""
    try:
        identity = _identity(os.stat(path))
    except OSError:
        return
    with _VERIFIED_LOCK:
        _VERIFIED_SHA256[identity] = sha256
        _VERIFIED_SHA256.move_to_end(identity)
        while len(_VERIFIED_SHA256) > VERIFIED_MEMO_SIZE:
            _VERIFIED_SHA256.popitem(last=False)


def _remembered_sha256(st: os.stat_result) -> str | None:
    """The sha256 `remember_sha256` recorded for the file `st` describes, if it is still remembered."""
    identity = _identity(st)
    with _VERIFIED_LOCK:
        sha = _VERIFIED_SHA256.get(identity)
        if sha is not None:
            _VERIFIED_SHA256.move_to_end(identity)
        return sha


def link_verified(src: Path, dest: Path, sha256: str, size: int, what: str) -> None:
    """Place read-only `src` at `dest` as a hard link, only if its bytes hash to `sha256` and are
    `size` long (IntegrityError naming `what` otherwise, nothing left at `dest`); a copy
    (`copy_verified`) where the file system cannot link.

    For a file nobody writes to, whose owner keeps it read-only: zoo's own run cache objects. The
    link is made first and the bytes hashed through it, so what was checked is what `dest` holds;
    a file this process downloaded and verified (`remember_sha256`: same inode, size and mtime)
    is not hashed again.
    The source was fsynced when it was stored; only the folder entry is synced here.
    """
    dest = Path(dest)
    tmp = temp_path(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(src, tmp)
    except OSError as e:
        if is_no_space(e):
            raise storage_error(dest, e, "place") from e
        copy_verified(src, dest, sha256, size, what)  # another device, or no hard links here
        return
    try:
        st = os.stat(tmp)
        if _remembered_sha256(st) != sha256 or st.st_size != size:
            with open(tmp, "rb") as f:
                _fill_verified(_Discard(), f, sha256, size, what)
        _install(tmp, dest, fsync=True)
    except OSError as e:
        raise storage_error(dest, e, "place") from e
    finally:
        tmp.unlink(missing_ok=True)


class _Discard:
    """A sink for `_fill_verified` when the bytes are checked in place rather than copied."""

    def write(self, data: bytes) -> int:
        return len(data)


def _fill_verified(out: BinaryIO, src, sha256: str, size: int, what: str) -> None:
    """Write the bytes of `src` to the empty file `out`; IntegrityError unless they hash
    to `sha256` and are `size` long (reading stops one chunk past `size`)."""
    h = hashlib.sha256()
    n = 0
    for chunk in _chunks(src):
        h.update(chunk)
        n += len(chunk)
        if n > size:
            break
        out.write(chunk)
    if n != size or h.hexdigest() != sha256:
        raise IntegrityError(f"{what}: content does not match the manifest "
                             f"(expected sha256 {sha256[:12]}… and {size} bytes, got "
                             f"{h.hexdigest()[:12]}… and {n}{'+' if n > size else ''} bytes)",
                             hint="the file was modified or corrupted; rebuild or re-download it")


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


def hardlink_or_copy(src: Path, dest: Path) -> None:
    """Place `src` at `dest` atomically: a hard link (no extra space, the same file), or where the
    file system cannot link (another device, no hard links) a copy with `src`'s mode and times.

    Only for files nobody writes to (cache objects, blobs, a model a tool only reads): through a
    link, a write to either name changes both. `reflink_or_copy` places an independent copy.
    Not fsynced: what is placed here can be placed again from `src`.
    """
    dest = Path(dest)
    tmp = temp_path(dest)
    try:
        try:
            os.link(src, tmp)
        except OSError as e:
            if is_no_space(e):
                raise
            shutil.copy2(src, tmp)
        os.replace(tmp, dest)
    except OSError as e:
        raise storage_error(dest, e, "place") from e
    finally:
        tmp.unlink(missing_ok=True)  # left when dest already was a link to src (rename does nothing)


def reflink_or_copy(src: Path, dest: Path, sha256: str, size: int, what: str, mode: int = 0o644) -> None:
    """Place an independent copy of the verified file `src` at `dest` (atomically, with `mode`).

    A reflink when the file system can (no extra space, and a write to either file never
    reaches the other); else a copy hashed on the way, so a copy that does not match `sha256`
    is never placed. Never a hard link: editing the copy must not edit the source.
    """
    with _replacing(Path(dest), fsync=True, mode=mode & ~current_umask(), verb="place") as out:
        if not _reflink(src, out):
            _fill_verified(out, src, sha256, size, what)


def _reflink(src: Path, out: BinaryIO) -> bool:
    """Make the empty file `out` share the extents of `src`; False where the file system cannot."""
    import fcntl

    try:
        with open(src, "rb") as s:
            fcntl.ioctl(out.fileno(), FICLONE, s.fileno())
        return True
    except OSError as e:
        if is_no_space(e):
            raise
        return False


def current_umask() -> int:
    """The process umask (read, never set)."""
    try:  # read, not set: setting it to probe would race with other threads creating files
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


# ---------------------------------------------------------------------------------------------
# digests


def sha256_and_size(path: Path) -> tuple[str, int]:
    """(sha256 hex, size) of a file's bytes, the size counted while reading (so both describe the
    same bytes even if the file changes meanwhile)."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file's bytes."""
    return sha256_and_size(path)[0]


class NotARegularFile(OSError):
    """A path that names a symbolic link, a device, a FIFO or a folder where a file was expected."""


def read_regular(path: str | Path, limit: int) -> bytes:
    """The first `limit` + 1 bytes at most of the regular file at `path` (one byte more than
    allowed, so the caller sees a file that is too large without reading all of it).

    Never follows a symbolic link at `path` itself and never blocks on a FIFO or reads a device
    (a link to /dev/zero would otherwise be read without end): those are `NotARegularFile`.
    FileNotFoundError when there is nothing at `path`; other OSErrors as the system reports them."""
    import errno
    import stat as statmod

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotARegularFile(errno.ELOOP, "a symbolic link, not a regular file", str(path)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not statmod.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise NotARegularFile(errno.EINVAL, "not a regular file", str(path))
        return f.read(limit + 1)
