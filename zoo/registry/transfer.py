"""Getting a blob into the local store: resumable, verified, tried across mirrors in order.

A download appends to ``blobs/partial/<sha256>.part``; an interrupted download resumes from
that length with a ranged request. The sha256 is computed while writing (the partial prefix
is hashed once on resume), and the file is renamed into ``blobs/sha256/`` only when digest
and size match: an unverified byte never becomes visible.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Callable, Iterable, Iterator

from zoo.errors import AccessDenied, IntegrityError, SourceUnreachable, StorageError, ZooError
from zoo.registry.blobs import BlobStore
from zoo.files import sha256_and_size

RETRIES = 3  # resumptions per source after a transfer broke off mid-way (only while it progresses)

# (label, open_from(offset) -> chunks) for one source of a blob
Source = tuple[str, Callable[[int], Iterable[bytes]]]


def _prefetch(chunks: Iterable[bytes], depth: int = 2) -> Iterator[bytes]:
    """Read the next chunk from the network while the current one is hashed and written."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    done = object()
    stop = threading.Event()

    def run():
        it = iter(chunks)
        try:
            for c in it:
                if stop.is_set():
                    return
                q.put(c)
            q.put(done)
        except BaseException as e:  # handed to the consumer thread, which re-raises it
            q.put(e)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()  # releases the HTTP response of a stream left early

    t = threading.Thread(target=run, daemon=True, name="zoo-prefetch")
    t.start()
    try:
        while True:
            item = q.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while t.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                t.join(0.05)


def _lock_for(path: Path):
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(path) + ".lock", timeout=600)


def fetch_blob(blobs: BlobStore, sha256: str, size: int, sources: list[Source], what: str) -> Path:
    """Make blob `sha256` present locally from the first source that delivers matching bytes."""
    dest = blobs.path(sha256)
    if blobs.has(sha256, size):
        return dest
    partial = blobs.partial_path(sha256)
    errors: list[ZooError] = []
    with _lock_for(partial):
        if blobs.has(sha256, size):  # another process finished it while we waited
            return dest
        for label, open_from in sources:
            for attempt in range(RETRIES + 1):
                before = partial.stat().st_size if partial.exists() else 0
                try:
                    _download(partial, dest, open_from, sha256, size, f"{what} from {label}")
                    blobs.mark_verified(sha256)  # hashed while downloaded: no second hash on first use
                    return dest
                except IntegrityError as e:
                    partial.unlink(missing_ok=True)  # bad bytes: never resume from them
                    errors.append(e)
                except FileNotFoundError:
                    errors.append(StorageError(f"{what}: not found on {label}"))
                except (SourceUnreachable, StorageError) as e:
                    errors.append(e)  # keep the partial file: a retry or the next mirror resumes it
                    after = partial.stat().st_size if partial.exists() else 0
                    if after > before:
                        continue  # the connection broke mid-way: resume from where it stopped
                break
    if any(isinstance(e, IntegrityError) for e in errors):
        bad = next(e for e in errors if isinstance(e, IntegrityError))
        raise IntegrityError(bad.message, hint="the remote copy is corrupt or was tampered with; nothing was installed")
    refused = [e for e in errors if isinstance(e, AccessDenied)]
    if refused and all(isinstance(e, (SourceUnreachable, AccessDenied)) for e in errors):
        raise AccessDenied(refused[0].message, hint=refused[0].hint)
    if errors and all(isinstance(e, SourceUnreachable) for e in errors):
        raise SourceUnreachable(errors[-1].message, hint=errors[-1].hint)
    raise StorageError(f"{what}: could not be downloaded ({'; '.join(e.message for e in errors) or 'no source'})")


def _download(partial: Path, dest: Path, open_from, sha256: str, size: int, what: str) -> None:
    h = hashlib.sha256()
    offset = partial.stat().st_size if partial.exists() else 0
    if offset > size:
        partial.unlink()
        offset = 0
    if offset:
        with open(partial, "rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
    n = offset
    with open(partial, "ab") as out:
        for chunk in _prefetch(open_from(offset)):
            n += len(chunk)
            if n > size:
                break
            out.write(chunk)
            h.update(chunk)
        out.flush()
        os.fsync(out.fileno())
    _verify_and_place(partial, dest, h.hexdigest(), n, sha256, size, what)


def _verify_and_place(path: Path, dest: Path, got: str, n: int, sha256: str, size: int, what: str) -> None:
    if n != size or got != sha256:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"{what}: checksum mismatch (expected sha256 {sha256[:12]}… and {size} bytes, "
                             f"got {got[:12]}… and {n} bytes)",
                             hint="the remote copy is corrupt or was tampered with; nothing was installed")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o444)
    os.replace(path, dest)


def adopt_file(blobs: BlobStore, path: Path, sha256: str, size: int, what: str) -> Path:
    """Move a downloaded file into the blob store after verifying it (no second copy)."""
    dest = blobs.path(sha256)
    got, n = sha256_and_size(path)
    _verify_and_place(Path(path), dest, got, n, sha256, size, what)
    blobs.mark_verified(sha256)
    return dest
