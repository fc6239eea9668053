"""The one downloader: a file pinned by its digest, resumable, verified while it streams.

A file is pinned by sha256 (the registry's blobs, upstream sources) or blake3 (the run cache's
objects, `zoo.engine.remote_cache`), or both; every digest given is checked.

`download` takes `Source`s (a label and ``open_from(offset)``, which yields the file's bytes
from that offset: a ranged read) and tries them in order (a remote's primary and mirrors; the
one URL of an upstream source). Sources come from:

- `http_source`: an http(s) URL, streamed through fsspec's HTTPFileSystem (a ranged GET to resume);
- `hf_source`: a file of a Hugging Face Hub repo (``hf_hub_url`` over the same HTTP reads,
  with huggingface_hub's headers: HF_TOKEN, HF_ENDPOINT; HF_HUB_OFFLINE refuses to connect);
- `zoo.storage.fsbackend.FsBackend.iter_from`: a folder, S3 or WebDAV remote.

How a download runs:

- it writes to a temporary name of its own, ``<tmp_dir>/<dest name>.<host>.<pid>.<random>.incomplete``
  (per process, as huggingface_hub does, because file locks are unreliable on network
  filesystems), hashing every byte as it is written;
- when the transfer breaks off after some progress (`SourceUnreachable`), it resumes from
  what it has with a ranged read, up to `RETRIES` times per source, then tries the next
  source; a later download adopts (renames to its own name) a temporary file that a finished
  process left, so an interrupted download resumes across runs too;
- only when the digests (and size, when known) match is the file made read-only and renamed into
  place: an unverified byte is never visible under `dest`. Two processes downloading the same
  file each write their own temporary file; both renames put the same bytes in place;
- the temporary file is removed on every failure except an interrupted transfer (kept to be
  resumed): a mismatch, a missing file, a refusal, a full disk;
- processes of one host downloading the same file take turns (a flock on ``<dest name>.lock``
  beside the temporary files): the first downloads, the others then find the file in place,
  hash it, and use it without fetching it again (`_one_download`).

Errors: nothing answers → `SourceUnreachable`; no source has the file → `NotFound`; wrong
bytes → `IntegrityError`; HTTP 401/403 or no credentials → `AccessDenied`.
fsspec, aiohttp and huggingface_hub are imported only when a source is read.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import glob
import hashlib
import os
import queue
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

from zoo.errors import AccessDenied, IntegrityError, NotFound, SourceUnreachable, StorageError, ZooError
from zoo.files import remember_sha256

RETRIES = 3  # resumptions per source after a transfer broke off mid-way (only while it progresses)
HTTP_TIMEOUT = float(os.environ.get("ZOO_HTTP_TIMEOUT", "10"))  # seconds to connect, and per read
HTTP_CHUNK = 8 << 20  # bytes per read from an HTTP stream
STALE_S = 3600  # a temporary file of another host is adopted only after this long untouched
_HASH_CHUNK = 8 << 20
# who wants to see bytes arrive (a progress display): set around a pull by `observe_bytes`. A context
# variable, not a parameter, because downloads are reached through every remote class's `fetch`
# (folder, S3, WebDAV, Hugging Face...): the display must not widen each of their signatures
_BYTES_SEEN: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar("zoo_download_bytes",
                                                                                          default=None)


@contextlib.contextmanager
def observe_bytes(callback: Callable[[int], None]) -> Iterator[None]:
    """Within the block, `callback(n)` is called with the length of every chunk a download of this
    thread writes (resumed prefixes are not counted again). For progress displays only: the
    callback must be cheap, and an exception it raises stops the download."""
    token = _BYTES_SEEN.set(callback)
    try:
        yield
    finally:
        _BYTES_SEEN.reset(token)


@dataclass(frozen=True)
class Source:
    """One place to download a file from: `label` names it in messages; ``open_from(offset)``
    yields the file's bytes from `offset` on (raising `zoo.errors` classes, or FileNotFoundError
    when the file is not there)."""

    label: str
    open_from: Callable[[int], Iterable[bytes]]


def download(sources: Sequence[Source], dest: Path, *, sha256: str | None = None, size: int | None, what: str,
             tmp_dir: Path | None = None, blake3: str | None = None) -> Path:
    """Make `dest` hold the file whose sha256 is `sha256` and/or whose blake3 is `blake3` (at least
    one; and whose length is `size`, when known), from the first of `sources` that delivers it;
    temporary files go in `tmp_dir` (default: beside `dest`; it must be on the same filesystem).
    See the module docstring."""
    expected = {name: value for name, value in (("sha256", sha256), ("blake3", blake3)) if value is not None}
    if not expected:
        raise ValueError("download: give the sha256 or the blake3 digest of the file")
    dest = Path(dest)
    tmp_dir = Path(tmp_dir) if tmp_dir is not None else dest.parent
    tmp_dir.mkdir(parents=True, exist_ok=True)
    with _one_download(tmp_dir, dest.name):
        if _holds(dest, expected, size):
            return dest  # another process (or thread) downloaded it while we waited: verified, not fetched again
        return _download(sources, dest, expected, size, what, tmp_dir)


def _download(sources: Sequence[Source], dest: Path, expected: dict[str, str], size: int | None, what: str,
              tmp_dir: Path) -> Path:
    tmp = _claim(tmp_dir, dest.name)
    errors: list[ZooError] = []
    keep = False
    try:
        for src in sources:
            for attempt in range(RETRIES + 1):
                before = _length(tmp)
                try:
                    _transfer(src, tmp, dest, expected, size, f"{what} from {src.label}")
                    _drop_leftovers(tmp_dir, dest.name)
                    return dest
                except IntegrityError as e:  # _transfer removed the bad bytes
                    if before and attempt < RETRIES:
                        continue  # the bytes we resumed from may be what was wrong: once more from the start
                    errors.append(e)
                except FileNotFoundError:
                    errors.append(NotFound(f"{what}: not found on {src.label}"))
                except SourceUnreachable as e:
                    errors.append(e)  # the temporary file stays: a retry or the next source resumes it
                    if _length(tmp) > before:
                        continue  # the connection broke mid-way: resume from where it stopped
                except (NotFound, AccessDenied, StorageError) as e:
                    errors.append(e)
                break
        keep = _length(tmp) > 0 and any(isinstance(e, SourceUnreachable) for e in errors)
        raise _combined(errors, what)
    except Exception:
        if not keep:
            tmp.unlink(missing_ok=True)  # bad bytes, a refusal, a full disk: give the space back
        raise
    finally:  # a BaseException (Ctrl-C, a killed worker) leaves the file to be resumed
        _release(tmp)


@contextlib.contextmanager
def _one_download(tmp_dir: Path, stem: str) -> Iterator[None]:
    """One download of `stem` at a time on this host: an exclusive flock on ``<tmp_dir>/<stem>.lock``
    (beside the temporary files), so of several processes pulling the same file one downloads and
    the others wait, then find it in place. The holder removes the lock file before releasing it;
    a waiter that then gets the lock of a removed file tries again with the current one. Only an
    economy: where flock does not hold (some network file systems), each downloads and verifies
    its own copy, as before."""
    path = tmp_dir / f"{stem}.lock"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # still ours (under the lock): no lock file is left behind
        os.close(fd)


def _holds(dest: Path, expected: dict[str, str], size: int | None) -> bool:
    """Whether `dest` is a regular file with every expected digest (hashed now: a file another
    process placed is verified like a download, never trusted for being there)."""
    try:
        if dest.is_symlink() or not dest.is_file() or (size is not None and dest.stat().st_size != size):
            return False
        hashers = {name: _hasher(name) for name in expected}
        with open(dest, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                for h in hashers.values():
                    h.update(chunk)
    except OSError:
        return False
    return {name: h.hexdigest() for name, h in hashers.items()} == expected


def _combined(errors: list[ZooError], what: str) -> ZooError:
    """One error for a download that failed on every source, most telling first."""
    if len(errors) == 1:
        return errors[0]
    bad = [e for e in errors if isinstance(e, IntegrityError)]
    if bad:
        return bad[0]
    if errors and all(isinstance(e, NotFound) for e in errors):
        return NotFound(f"{what}: not found on any source ({'; '.join(e.message for e in errors)})", hint=errors[0].hint)
    refused = [e for e in errors if isinstance(e, AccessDenied)]
    if refused and all(isinstance(e, (SourceUnreachable, AccessDenied, NotFound)) for e in errors):
        return AccessDenied(refused[0].message, hint=refused[0].hint)
    if errors and all(isinstance(e, (SourceUnreachable, NotFound)) for e in errors):
        last = [e for e in errors if isinstance(e, SourceUnreachable)][-1]
        return SourceUnreachable(last.message, hint=last.hint)
    return StorageError(f"{what}: could not be downloaded ({'; '.join(e.message for e in errors) or 'no source'})")


def _transfer(src: Source, tmp: Path, dest: Path, expected: dict[str, str], size: int | None, what: str) -> None:
    """Append what `src` serves past the end of `tmp`, hashing as it goes; place it if it matches
    `expected` ({algorithm: hex digest}) and `size`."""
    hashers = {name: _hasher(name) for name in expected}
    offset = _length(tmp)
    if size is not None and offset > size:
        tmp.unlink()
        offset = 0
    if offset:
        with open(tmp, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                for h in hashers.values():
                    h.update(chunk)
    n = offset
    seen = _BYTES_SEEN.get()
    with open(tmp, "ab") as out:
        for chunk in _prefetch(src.open_from(offset)):
            n += len(chunk)
            if size is not None and n > size:
                break  # longer than the manifest says: refused below, never cut to size
            out.write(chunk)
            for h in hashers.values():
                h.update(chunk)
            if seen is not None:
                seen(len(chunk))
        out.flush()
        os.fsync(out.fileno())
    got = {name: h.hexdigest() for name, h in hashers.items()}
    if got != expected or (size is not None and n != size):
        tmp.unlink(missing_ok=True)
        wanted = " and ".join(f"{name} {value}" for name, value in expected.items())
        wanted += f" and {size} bytes" if size is not None else ""
        seen = " and ".join(f"{name} {value}" for name, value in got.items())
        raise IntegrityError(f"{what}: checksum mismatch (expected {wanted}, got {seen} and {n} bytes)",
                             hint="the remote copy is corrupt, was changed upstream or was tampered with; "
                                  "nothing was installed")
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o444)
    os.replace(tmp, dest)
    if "sha256" in expected:
        remember_sha256(dest, expected["sha256"])  # placing it again in this process (a hard link) need not re-hash it


def _hasher(algorithm: str):
    """A new hasher for `algorithm` (``sha256`` or ``blake3``, the run cache's content digest)."""
    if algorithm == "blake3":
        from zoo.engine.hashing import content_hasher

        return content_hasher()
    return hashlib.sha256()


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
                close()  # releases the response of a stream left early

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


# ---- temporary files: one per download, adopted from finished processes to resume ---------------
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname()) or "host"
_ACTIVE: set[str] = set()  # temporary files this process is writing now (other threads must not adopt them)
_ACTIVE_LOCK = threading.Lock()
_SUFFIX = ".incomplete"


def _length(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _claim(tmp_dir: Path, stem: str) -> Path:
    """A temporary file name for this download: a left-over one of a finished download of the same
    file renamed to our name (so we resume from its bytes), else a fresh name."""
    mine = tmp_dir / f"{stem}.{_HOST}.{os.getpid()}.{secrets.token_hex(6)}{_SUFFIX}"
    with _ACTIVE_LOCK:
        _ACTIVE.add(mine.name)
        leftovers = [p for p in sorted(tmp_dir.glob(glob.escape(stem) + ".*" + _SUFFIX)) if _abandoned(p, stem)]
    for old in leftovers:
        try:
            os.rename(old, mine)  # atomic: of two processes adopting it, one gets FileNotFoundError
            return mine
        except FileNotFoundError:
            continue
    return mine


def _abandoned(path: Path, stem: str) -> bool:
    """True if no download is writing `path`: one of this process that ended, one of a process of
    this host that is gone, or one of another host untouched for `STALE_S`. (Under _ACTIVE_LOCK.)"""
    fields = path.name[len(stem) + 1:-len(_SUFFIX)].split(".")
    if len(fields) != 3 or path.name in _ACTIVE:
        return False
    host, pid, _ = fields
    if host == _HOST and pid.isdigit():
        return int(pid) == os.getpid() or not _alive(int(pid))
    try:
        return time.time() - path.stat().st_mtime > STALE_S
    except OSError:
        return False


def _drop_leftovers(tmp_dir: Path, stem: str) -> None:
    """Remove the abandoned temporary files of a file now in place (nothing will resume them)."""
    with _ACTIVE_LOCK:
        leftovers = [p for p in tmp_dir.glob(glob.escape(stem) + ".*" + _SUFFIX) if _abandoned(p, stem)]
    for p in leftovers:
        p.unlink(missing_ok=True)


def remove_abandoned(tmp_dir: Path, *, dry_run: bool = False) -> tuple[int, int]:
    """Delete every temporary file in `tmp_dir` that no download is writing (an interrupted one
    that nothing resumed: `zoo gc`); returns (files, bytes) removed (`dry_run`: that would be).
    Files being written are left alone."""
    if not tmp_dir.is_dir():
        return 0, 0
    with _ACTIVE_LOCK:
        names = sorted(tmp_dir.glob("*" + _SUFFIX))
        # <stem>.<host>.<pid>.<random>.incomplete: the stem may hold dots of its own
        leftovers = [p for p in names if p.name.count(".") >= 4
                     and _abandoned(p, p.name[:-len(_SUFFIX)].rsplit(".", 3)[0])]
    files = size = 0
    for p in leftovers:
        try:
            length = p.stat().st_size
            if not dry_run:
                p.unlink()
        except FileNotFoundError:  # adopted and renamed by a download that just started
            continue
        files, size = files + 1, size + length
    if not dry_run:
        _drop_unheld_locks(tmp_dir)
    return files, size


def _drop_unheld_locks(tmp_dir: Path) -> None:
    """Remove the lock files (`_one_download`) of downloads killed while they held them: empty
    files that no process holds (taken without waiting, so a download in progress is left alone)."""
    for path in tmp_dir.glob("*.lock"):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                os.unlink(path)  # under its lock, as a download's holder does
        except OSError:
            pass  # held by a download, or already gone
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _release(tmp: Path) -> None:
    with _ACTIVE_LOCK:
        _ACTIVE.discard(tmp.name)


# ---- telling transport errors apart (every backend: botocore, httpx, aiohttp, the OS) ------------
_CONNECT_WORDS = ("connect", "timeout", "unreachable", "networkerror", "remotedisconnected", "gaierror",
                  "serverdisconnected", "clientpayloaderror", "remoteprotocolerror", "incompleteread")


def is_connection_error(exc: BaseException) -> bool:
    """True if `exc` (or what caused it) means the server could not be reached or the transfer
    broke off: worth a retry, or a fallback to the local cache."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return True
        if any(w in cls.__name__.lower() for cls in type(exc).__mro__ for w in _CONNECT_WORDS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# botocore / S3 error codes that mean "not with these credentials", not "not there" or "down"
_REFUSED_NAMES = ("nocredentialserror", "partialcredentialserror", "credentialretrievalerror",
                  "unauthorizedssotokenerror", "tokenretrievalerror")
_REFUSED_CODES = ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
                  "AllAccessDisabled", "AccountProblem", "InvalidClientTokenId", "UnrecognizedClientException",
                  "401", "403")


def refusal_reason(exc: BaseException) -> str | None:
    """Why a server refused the request (no or bad credentials, HTTP 401/403, AccessDenied), or None.

    One place for every transport (S3 through botocore/s3fs, WebDAV through webdav4/httpx, HTTP
    through aiohttp, a folder through the OS): walks the exception and its causes.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        name = type(exc).__name__.lower()
        if any(n in name for n in _REFUSED_NAMES):
            return "no credentials were found" if "nocredentials" in name else f"{type(exc).__name__}: {exc}"
        code = (getattr(exc, "response", None) or {}).get("Error", {}).get("Code") \
            if isinstance(getattr(exc, "response", None), dict) else None
        if code in _REFUSED_CODES:
            return f"{code}: {exc}"
        status = getattr(getattr(exc, "response", None), "status_code", None)
        status = status if isinstance(status, int) else getattr(exc, "status", None)
        if status in (401, 403):
            return f"HTTP {status} ({'not authorized' if status == 401 else 'forbidden'})"
        if isinstance(exc, PermissionError):
            return f"access denied ({exc})"
        exc = exc.__cause__ or exc.__context__
    return None


# ---- http(s) and Hugging Face sources -------------------------------------------------------------
_HTTP_REFUSED_HINT = "this server needs credentials zoo cannot send to a plain HTTP URL"


@contextlib.contextmanager
def http_errors(url: str, what: str, refused_hint: str = _HTTP_REFUSED_HINT):
    """Sort what fsspec's HTTPFileSystem (aiohttp) raises into zoo errors."""
    try:
        yield
    except ZooError:
        raise
    except FileNotFoundError as e:
        raise NotFound(f"{url}: not found (HTTP 404)", hint="check the URL") from e
    except Exception as e:
        reason = refusal_reason(e)
        if reason is not None:
            raise AccessDenied(f"{url} refused access: {reason}", hint=refused_hint) from e
        status = getattr(e, "status", None)
        if status == 410:
            raise NotFound(f"{url}: gone (HTTP 410)", hint="check the URL") from e
        if is_connection_error(e) or (isinstance(status, int) and status >= 500):
            raise SourceUnreachable(f"cannot reach {url} ({what}): {type(e).__name__}: {e}",
                                    hint="check the network; run again to resume") from e
        raise StorageError(f"{url}: {what} failed: {type(e).__name__}: {e}") from e


def _http_fs(headers: dict[str, str] | None):
    import aiohttp
    from fsspec.implementations.http import HTTPFileSystem

    timeout = aiohttp.ClientTimeout(total=None, connect=HTTP_TIMEOUT, sock_connect=HTTP_TIMEOUT, sock_read=HTTP_TIMEOUT)
    # identity: the bytes hashed are the file's, never a compressed representation of it
    return HTTPFileSystem(skip_instance_cache=True, use_listings_cache=False, client_kwargs={"timeout": timeout},
                          headers={**(headers or {}), "Accept-Encoding": "identity"})


def http_source(url: str, *, headers: dict[str, str] | None = None, label: str | None = None,
                refused_hint: str = _HTTP_REFUSED_HINT) -> Source:
    """An http(s) URL as a `Source`: one streaming GET through fsspec's HTTPFileSystem, with
    ``Range: bytes=<offset>-`` when resuming. A server that ignores Range (answers 200 with the
    whole file) has the bytes we already hold skipped; 416 (nothing past the offset) ends it."""
    state: dict = {}

    def open_from(offset: int) -> Iterator[bytes]:
        fs = state.get("fs") or state.setdefault("fs", _http_fs(headers))
        asked = {**fs.kwargs.get("headers", {}), **({"Range": f"bytes={offset}-"} if offset else {})}
        try:
            # block_size=0: a stream; a size given: no HEAD first, so one request is all it takes
            f = fs.open(url, "rb", block_size=0, size=-1, headers=asked)
        except Exception as e:
            if offset and getattr(e, "status", None) == 416:
                return  # we hold the whole file already (or more): the digest decides
            with http_errors(url, "download", refused_hint):
                raise
        try:
            skip = 0
            if offset and f.r.status != 206:
                skip = offset  # the server ignored Range: it sends the whole file from its start
            elif offset and not str(f.r.headers.get("Content-Range", "")).startswith(f"bytes {offset}-"):
                raise StorageError(f"{url}: asked for bytes from {offset}, the server sent "
                                   f"{f.r.headers.get('Content-Range')!r}")
            while True:
                with http_errors(url, "download", refused_hint):
                    chunk = f.read(HTTP_CHUNK)
                if not chunk:
                    return
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                if chunk:
                    yield chunk
        finally:
            f.close()

    return Source(label or url, open_from)


def hf_source(repo_id: str, filename: str, *, revision: str | None = None, endpoint: str | None = None,
              token: str | None = None, label: str | None = None,
              refused_hint: str = "set HF_TOKEN (or log in with `hf auth login`)") -> Source:
    """A file of a Hugging Face Hub model repo as a `Source` (``endpoint`` None: HF_ENDPOINT or
    huggingface.co; ``token`` None: HF_TOKEN or the saved login). With HF_HUB_OFFLINE set it
    raises SourceUnreachable instead of connecting."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=endpoint)
    if constants.HF_HUB_OFFLINE:
        def offline(offset: int) -> Iterator[bytes]:
            raise SourceUnreachable(f"{label or url}: not downloaded, HF_HUB_OFFLINE is set",
                                    hint="unset HF_HUB_OFFLINE to download")
        return Source(label or url, offline)
    return http_source(url, headers=build_hf_headers(token=token), label=label, refused_hint=refused_hint)
