"""Byte-level access to one remote location through fsspec: local folder, S3, WebDAV, HTTP(S).

One class, `FsBackend`, with the few operations the remote zoo needs. Each scheme gets the
atomic primitive it supports:

- local folder: temp file + rename; create-exclusive by hard link (fails if the name exists);
- S3: PUT is atomic; create-exclusive is ``PUT If-None-Match: *`` (412 → already there); reads
  through botocore, writes through s3fs (backend_s3.py);
- WebDAV (webdav4): upload to a temp name, then ``MOVE`` with ``Overwrite: F`` for create-exclusive;
- HTTP(S) (fsspec's HTTPFileSystem): read-only;
- S3, Google Cloud Storage, Azure Blob and SSH/SFTP: subclasses in backend_s3.py, backend_gcs.py,
  backend_azure.py and backend_ssh.py, named in SCHEME_BACKENDS.

fsspec and the scheme's driver are imported when a backend is opened, never at module import.
Errors are sorted with `zoo.download.refusal_reason` and `zoo.download.is_connection_error`, the
same rules every download uses.
"""

from __future__ import annotations

import contextlib
import errno
import posixpath
import os
import uuid
from pathlib import Path
from typing import Callable, Iterator

from zoo.download import is_connection_error, refusal_reason
from zoo.errors import AccessDenied, InvalidInput, SourceUnreachable, StorageError, UnsafePath
from zoo.storage.urls import scheme_of

CHUNK = 32 << 20  # ranged requests (WebDAV, HTTP) and local reads


def credentials_hint(scheme: str, options: dict) -> str:
    """Where the credentials for a remote of `scheme` come from (zoo never stores them)."""
    if scheme == "s3":
        return ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) in the environment, or name a "
                "profile with `zoo remote add NAME URL --replace -o profile=PROFILE`; for a public bucket, "
                "`-o anon=true`; --offline uses only the local zoo")
    if scheme == "webdav":
        env = options.get("password_env") or "ZOO_WEBDAV_PASSWORD"
        user = options.get("user")
        who = f"user {user}" if user else "a user (`zoo remote add NAME URL --replace -o user=NAME`)"
        return f"set the WebDAV password of {who} in ${env} (remote option `-o password_env=VAR`); --offline uses only the local zoo"
    if scheme == "ssh":
        return ("zoo logs in with your ssh-agent or ~/.ssh keys (or `-o key_filename=PATH`) as the URL's user "
                "(or `-o username=NAME`); check that `ssh -p PORT user@host` works without a prompt; a password "
                "only from the variable named by `-o password_env=VAR`; --offline uses only the local zoo")
    if scheme == "gcs":
        if options.get("credentials_file"):
            return (f"check that the service account in {options['credentials_file']} (option credentials_file) may "
                    "read and write the bucket; --offline uses only the local zoo")
        return ("set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file (or name one with "
                "`zoo remote add NAME URL --replace -o credentials_file=PATH`), or sign in with "
                "`gcloud auth application-default login` (zoo uses Google's default credentials); for a public bucket, "
                "`zoo remote add NAME URL --replace -o anon=true`; --offline uses only the local zoo")
    if scheme == "azure":
        env = options.get("connection_string_env") or "AZURE_STORAGE_CONNECTION_STRING"
        return (f"set ${env} to the storage account's connection string, or AZURE_STORAGE_ACCOUNT_NAME with "
                "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN (or sign in with `az login`; name the account with "
                "`-o account_name=NAME`); for a public container, `-o anon=true`; --offline uses only the local zoo")
    if scheme == "file":
        return "check the folder's permissions; --offline uses only the local zoo"
    return "this server needs credentials zoo cannot send to a plain HTTP remote; --offline uses only the local zoo"


def _mtime(info: dict) -> float | None:
    """A listing entry's modification time (s3fs: LastModified, webdav4: modified, local: mtime)."""
    from datetime import datetime
    from email.utils import parsedate_to_datetime

    for key in ("mtime", "LastModified", "modified", "last_modified", "Last-Modified"):
        v = info.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
        if isinstance(v, datetime):
            return v.timestamp()
        if isinstance(v, str):
            with contextlib.suppress(ValueError, TypeError):
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
            with contextlib.suppress(ValueError, TypeError):
                return parsedate_to_datetime(v).timestamp()
    return None


# schemes whose backend lives in a module of its own (a subclass of FsBackend): module, class
SCHEME_BACKENDS: dict[str, tuple[str, str]] = {
    "s3": ("zoo.storage.backend_s3", "S3Backend"),
    "ssh": ("zoo.storage.backend_ssh", "SshBackend"),
    "gcs": ("zoo.storage.backend_gcs", "GcsBackend"),
    "azure": ("zoo.storage.backend_azure", "AzureBackend"),
}


def open_backend(url: str, options: dict | None = None) -> "FsBackend":
    """The backend for `url`: a scheme's own subclass where SCHEME_BACKENDS names one, else FsBackend."""
    import importlib

    scheme = scheme_of(url)
    if scheme in SCHEME_BACKENDS:
        module, name = SCHEME_BACKENDS[scheme]
        return getattr(importlib.import_module(module), name)(url, options)
    return FsBackend(url, options)


def byte_callback(progress: Callable[[int], None] | None):
    """An fsspec Callback that passes each increase of an upload's byte count to `progress(n)`
    (fsspec's drivers report chunks as they go up); fsspec's no-op one without `progress`."""
    from fsspec.callbacks import DEFAULT_CALLBACK, Callback

    if progress is None:
        return DEFAULT_CALLBACK

    class Bytes(Callback):
        def __init__(self):
            super().__init__()
            self.reported = 0

        def call(self, *args, **kwargs):
            if self.value > self.reported:  # absolute or relative updates alike: report what is new
                progress(self.value - self.reported)
                self.reported = self.value

    return Bytes()


def copy_with_progress(src: Path, dest: Path, progress: Callable[[int], None] | None) -> None:
    """`shutil.copyfile`, chunk by chunk when someone wants to see the bytes go (`progress(n)`)."""
    import shutil

    if progress is None:
        shutil.copyfile(src, dest)
        return
    with open(src, "rb") as s, open(dest, "wb") as d:
        while chunk := s.read(CHUNK):
            d.write(chunk)
            progress(len(chunk))


_LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _refuse_plain_http_password(base: str, user: str, env: str) -> None:
    """Basic auth over plain HTTP shows the password to anyone on the way: only to this machine."""
    from urllib.parse import urlsplit

    parts = urlsplit(base)
    if parts.scheme == "http" and (parts.hostname or "") not in _LOOPBACK:
        raise InvalidInput(f"webdav+{base}: zoo would send the password of {user} (${env}) over plain HTTP, "
                           "readable on the way; refused",
                           hint=f"use webdav+https://{parts.netloc}{parts.path} (plain HTTP with a password only "
                                "to 127.0.0.1 or localhost)")


class FsBackend:
    """One remote location (URL) and the filesystem that reaches it."""

    def __init__(self, url: str, options: dict | None = None):
        self.url = url
        self.scheme = scheme_of(url)
        self.options = dict(options or {})
        self.read_only = self.scheme == "http"
        self.fs, self.root = self._open()

    # ---- opening ------------------------------------------------------------------------
    def _open(self):
        o = self.options
        if self.scheme == "file":
            from fsspec.implementations.local import LocalFileSystem

            return LocalFileSystem(), str(Path(self.url.removeprefix("file://")).expanduser().resolve())
        if self.scheme == "webdav":
            try:
                from webdav4.fsspec import WebdavFileSystem
            except ImportError as e:
                raise InvalidInput("WebDAV remotes need webdav4", hint="pip install 'zoo-onnx[webdav]'") from e
            auth = None
            base = self.url[len("webdav+"):].rstrip("/")
            if o.get("user"):
                env = o.get("password_env") or "ZOO_WEBDAV_PASSWORD"
                _refuse_plain_http_password(base, str(o["user"]), env)
                auth = (o["user"], os.environ.get(env, ""))
            fs = WebdavFileSystem(base, auth=auth, verify=bool(o.get("verify_ssl", True)), timeout=30)
            return fs, ""
        if self.scheme == "http":
            from fsspec.implementations.http import HTTPFileSystem

            fs = HTTPFileSystem(skip_instance_cache=True, use_listings_cache=False)
            return fs, self.url.rstrip("/")
        raise InvalidInput(f"{self.url}: not a filesystem remote")

    def path(self, *parts: str) -> str:
        rel = "/".join(parts)
        return f"{self.root}/{rel}" if self.root else rel

    def _inside(self, rpath: str) -> str:
        """A folder remote: `rpath` unless it resolves outside the remote's folder (a symbolic
        link someone put in the remote, e.g. ``objects/sha256/ab`` -> /elsewhere): UnsafePath.
        Every read and write of a folder remote goes through it; other schemes have no links."""
        if self.scheme == "file":
            from zoo.pathsafety import inside_folder

            inside_folder(self.root, rpath, what="the folder of remote")
        return rpath

    @contextlib.contextmanager
    def _errors(self, what: str):
        try:
            yield
        except (FileNotFoundError, FileExistsError, InvalidInput):
            raise
        except (StorageError, UnsafePath):
            raise
        except Exception as e:  # drivers raise many types; sort them into refused, unreachable, storage errors
            reason = refusal_reason(e)
            if reason is not None:
                raise AccessDenied(f"{self.url} refused access: {reason} ({what})",
                                   hint=credentials_hint(self.scheme, self.options)) from e
            if is_connection_error(e):
                raise SourceUnreachable(f"remote {self.url} is unreachable ({what}): {type(e).__name__}: {e}",
                                        hint="check the network, or use --offline to pull from the local cache") from e
            if type(e).__name__ in ("ResourceNotFound",) or (isinstance(e, OSError) and e.errno == 2):
                raise FileNotFoundError(what) from e
            raise StorageError(f"remote {self.url}: {what} failed: {type(e).__name__}: {e}") from e

    def _writable(self) -> None:
        if self.read_only:
            raise InvalidInput(f"remote {self.url} is read-only (plain HTTP)",
                               hint="push to the S3, WebDAV or folder location behind it")

    # ---- reading ------------------------------------------------------------------------
    def read(self, rpath: str, limit: int | None = None) -> bytes | None:
        """The whole (small) file, or None if it does not exist. With `limit`, at most `limit` + 1
        bytes (the caller sees a file that is too large without reading all of it), and on a
        folder remote only a regular file: a symbolic link or a device is
        `zoo.files.NotARegularFile` (a link to /dev/zero would never end)."""
        try:
            if limit is not None and self.scheme == "file":
                return self._read_local(rpath, limit)
            with self._errors(f"read {rpath}"):
                if limit is None:
                    return self.fs.cat_file(self._inside(rpath))
                with self.fs.open(self._inside(rpath), "rb") as f:
                    return f.read(limit + 1)
        except FileNotFoundError:
            return None

    def _read_local(self, rpath: str, limit: int) -> bytes:
        from zoo.files import NotARegularFile, read_regular

        try:
            # the folder must stay inside the remote; the file itself is opened without following
            # a link (a link is NotARegularFile, which a caller may take as a malformed entry)
            self._inside(posixpath.dirname(rpath))
            return read_regular(rpath, limit)
        except (FileNotFoundError, NotARegularFile):
            raise
        except OSError as e:
            if e.errno == errno.ENOTDIR:  # a path component is a file: there is no such entry
                raise FileNotFoundError(rpath) from None
            raise StorageError(f"remote {self.url}: read {rpath} failed: {e}") from e

    def size(self, rpath: str) -> int | None:
        """Size in bytes, or None if missing."""
        try:
            with self._errors(f"stat {rpath}"):
                info = self.fs.info(self._inside(rpath))
        except FileNotFoundError:
            return None
        size = info.get("size")
        return int(size) if size is not None else None

    def listdir(self, rpath: str) -> list[str]:
        """Base names under a folder ([] if missing). Plain HTTP cannot list: callers use index files."""
        if self.scheme == "http":
            return []
        try:
            with self._errors(f"list {rpath}"):
                entries = self.fs.ls(self._inside(rpath), detail=False)
        except FileNotFoundError:
            return []
        return sorted({str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries} - {""})

    def walk(self, rpath: str) -> list[tuple[str, int, float | None]]:
        """(path, size, modification time as a POSIX timestamp or None) of every file under a folder."""
        if self.scheme == "http":
            return []
        if self.scheme == "file":
            out = []
            with self._errors(f"list {rpath}"):
                for folder, _, names in os.walk(self._inside(rpath)):  # links to folders are not followed
                    for n in names:
                        p = os.path.join(folder, n)
                        with contextlib.suppress(FileNotFoundError):
                            st = os.stat(p)
                            out.append((p, st.st_size, st.st_mtime))
            return out
        try:
            with self._errors(f"list {rpath}"):
                found = self.fs.find(rpath, detail=True)
        except FileNotFoundError:
            return []
        return [(str(name), int(info.get("size") or 0), _mtime(info)) for name, info in found.items()
                if info.get("type", "file") == "file"]

    def stat(self, rpath: str) -> tuple[int, float | None] | None:
        """(size, modification time or None) of a file, or None if it does not exist."""
        if self.scheme == "file":
            try:
                st = os.stat(self._inside(rpath))
            except FileNotFoundError:
                return None
            except OSError as e:
                raise StorageError(f"cannot stat {rpath}: {e}") from e
            return st.st_size, st.st_mtime
        try:
            with self._errors(f"stat {rpath}"):
                info = self.fs.info(rpath)
        except FileNotFoundError:
            return None
        return int(info.get("size") or 0), _mtime(info)

    def iter_from(self, rpath: str, offset: int, size: int) -> Iterator[bytes]:
        """The bytes of `rpath` from `offset` up to `size` + 1: one byte past the expected end,
        so that the caller sees a file longer than its manifest says on every backend (a longer
        file is refused, never silently cut to size), and never reads more than that.

        A local folder: seek and read; WebDAV and HTTP: ranged requests of CHUNK bytes (a backend
        reads in its own way by overriding `_chunks`: S3, backend_s3.py).
        """
        if offset > size:
            return
        # a range must start inside the file: to look past the end of a complete prefix, start
        # one byte early and drop that byte
        start, skip = (size - 1, 1) if offset == size and size > 0 else (offset, 0)
        for chunk in self._chunks(rpath, start, size):
            if skip:
                chunk, skip = chunk[skip:], 0
            if chunk:
                yield chunk

    def _chunks(self, rpath: str, start: int, size: int) -> Iterator[bytes]:
        """The bytes of `rpath` from `start` (inside the file) up to byte `size` inclusive."""
        if self.scheme == "file":
            return self._iter_local(rpath, start, size)
        return self._iter_ranges(rpath, start, size)

    def _iter_local(self, rpath: str, start: int, size: int) -> Iterator[bytes]:
        with self._errors(f"download {rpath}"), open(self._inside(rpath), "rb") as f:
            f.seek(start)
            while chunk := f.read(min(CHUNK, size + 1 - f.tell())):
                yield chunk

    def _iter_ranges(self, rpath: str, start: int, size: int) -> Iterator[bytes]:
        if size == 0:  # no range can start inside an empty file: ask its size instead
            if self.size(rpath):
                with self._errors(f"download {rpath}"):
                    yield self.fs.cat_file(rpath, start=0, end=1)
            return
        pos = start
        while pos < size:
            end = pos + CHUNK
            if end >= size:
                end = size + 1  # the last range asks for one byte more than expected
            with self._errors(f"download {rpath}"):
                chunk = self.fs.cat_file(rpath, start=pos, end=end)
            pos += len(chunk)
            yield chunk
            if pos < end:
                return  # the file ends here (shorter than expected: the caller's size check refuses it)

    # ---- writing ------------------------------------------------------------------------
    def _tmp_name(self, rpath: str) -> str:
        head, _, tail = rpath.rpartition("/")
        return f"{head}/.{tail}.{uuid.uuid4().hex[:12]}.tmp" if head else f".{tail}.{uuid.uuid4().hex[:12]}.tmp"

    def _makedirs(self, rpath: str) -> None:
        parent = rpath.rpartition("/")[0]
        if parent and self.scheme in ("file", "webdav"):
            with self._errors(f"mkdir {parent}"):
                self.fs.makedirs(self._inside(parent), exist_ok=True)
        self._inside(rpath)  # and the file itself (a link in its place is replaced, never written through)

    def write(self, rpath: str, data: bytes) -> None:
        """Write (replace) a small file atomically."""
        self._writable()
        self._makedirs(rpath)
        if self.scheme == "file":
            from zoo.files import atomic_write

            atomic_write(Path(self._inside(rpath)), data)
        else:
            tmp = self._tmp_name(rpath)
            with self._errors(f"write {rpath}"):
                self.fs.pipe_file(tmp, data)
                self.fs.client.move(tmp, rpath, overwrite=True)

    def create(self, rpath: str, data: bytes) -> bool:
        """Create `rpath` with `data` only if it does not exist; False if someone else has."""
        self._writable()
        self._makedirs(rpath)
        if self.scheme == "file":
            from zoo.files import create_exclusive

            return create_exclusive(Path(self._inside(rpath)), data)
        from webdav4.client import ResourceAlreadyExists

        tmp = self._tmp_name(rpath)
        with self._errors(f"upload {tmp}"):
            self.fs.pipe_file(tmp, data)
        try:
            try:
                with self._errors(f"create {rpath}"):
                    try:
                        self.fs.client.move(tmp, rpath, overwrite=False)
                    except ResourceAlreadyExists:
                        return False
            except StorageError:
                # a server may fail the losing request of two racing MOVEs (wsgidav answers 500): the
                # target being there decides — our unique temp gone means our move won, else we lost
                if not self.fs.exists(rpath):
                    raise
                return not self.fs.exists(tmp)
            return True
        finally:
            with contextlib.suppress(Exception):
                if self.fs.exists(tmp):
                    self.fs.rm_file(tmp)

    def put_file(self, local: Path, rpath: str, progress: Callable[[int], None] | None = None) -> None:
        """Upload a local file so that `rpath` is either absent or complete, never partial;
        `progress(n)`: n more bytes went up (as the driver reports them)."""
        self._writable()
        self._makedirs(rpath)
        if self.scheme == "file":
            # a copy, not a link: the remote must not share an inode with the local blob
            dest = Path(self._inside(rpath))
            tmp = Path(self._tmp_name(rpath))
            try:
                copy_with_progress(Path(local), tmp, progress)
                os.replace(tmp, dest)
            except OSError as e:
                raise StorageError(f"cannot write {dest}: {e}") from e
            finally:
                tmp.unlink(missing_ok=True)
            return
        tmp = self._tmp_name(rpath)
        with self._errors(f"upload {rpath}"):
            self.fs.put_file(str(local), tmp, callback=byte_callback(progress))
            self.fs.client.move(tmp, rpath, overwrite=True)

    def delete(self, rpath: str) -> None:
        self._writable()
        try:
            with self._errors(f"delete {rpath}"):
                if self.scheme == "file":
                    Path(self._inside(rpath)).unlink()
                else:
                    self.fs.rm_file(rpath)
        except FileNotFoundError:
            pass


class ObjectStoreBackend(FsBackend):
    """An object store (S3; GCS and Azure Blob subclass it) whose single upload is atomic: an
    object appears when its PUT, last chunk or block list commits, never in part; and whose
    driver turns `pipe_file(..., mode="create")` into a conditional create (S3 and Azure
    ``If-None-Match: *``, GCS ``ifGenerationMatch=0``), raising FileExistsError when the object
    exists. So no temporary names are needed, unlike on a folder, WebDAV or SFTP."""

    def write(self, rpath: str, data: bytes) -> None:
        """Write (replace) a small object: one upload, visible only when complete."""
        self._writable()
        with self._errors(f"write {rpath}"):
            self.fs.pipe_file(rpath, data)

    def create(self, rpath: str, data: bytes) -> bool:
        """Create `rpath` only if absent (the store's conditional create); False when it exists."""
        self._writable()
        try:
            with self._errors(f"create {rpath}"):
                self.fs.pipe_file(rpath, data, mode="create")
        except FileExistsError:
            return False
        return True

    def put_file(self, local: Path, rpath: str, progress: Callable[[int], None] | None = None) -> None:
        """Upload a local file; the object appears when its upload completes, never in part;
        `progress(n)`: n more bytes went up."""
        self._writable()
        with self._errors(f"upload {rpath}"):
            self.fs.put_file(str(local), rpath, callback=byte_callback(progress))
