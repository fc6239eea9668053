"""A remote on S3 or an S3-compatible store (``s3://bucket/prefix``): reads through botocore,
writes through s3fs.

The primitives the store promises rest on (zoo/engine/cache_store.py), from `ObjectStoreBackend`:
a single PUT is atomic (absent-or-complete) and create-exclusive is ``PUT If-None-Match: *``
(s3fs's ``pipe_file(..., mode="create")``; 412 → someone else created it first).

Why reads bypass s3fs: what a machine does most with a remote is read from it (an entry, its
objects), and a process that only reads should not pay for s3fs's import (aiobotocore, aiohttp:
≈ 0.2 s) nor hop to its event-loop thread for every chunk of a stream. Reads (`read`, `size`,
`stat`, `iter_from`) go through one botocore client per option set, with the same endpoint,
region, profile and anonymous settings; s3fs is opened only when something lists, writes or
deletes. Both read the same environment (AWS_ENDPOINT_URL, AWS_PROFILE, credentials), so they
see the same bucket.
"""

from __future__ import annotations

import os
import threading
from typing import Iterator

from zoo.errors import InvalidInput
from zoo.storage.fsbackend import ObjectStoreBackend

_clients: dict[tuple, object] = {}  # option set + AWS_* environment -> botocore S3 client (thread-safe, ~0.1 s to make)
_clients_lock = threading.Lock()
STREAM_CHUNK = 8 << 20  # reads from one streaming GET
_MISSING = ("NoSuchKey", "404", "NotFound", "NoSuchBucket")


class S3Backend(ObjectStoreBackend):
    """A `FsBackend` on one S3 bucket and prefix."""

    def _open(self):
        self._s3fs = None
        return None, self.url[len("s3://"):].rstrip("/")

    @property
    def fs(self):
        """s3fs, opened on first use (listing, writing, deleting)."""
        if self._s3fs is None:
            self._s3fs = _open_s3fs(self.options)
        return self._s3fs

    @fs.setter
    def fs(self, value) -> None:
        self._s3fs = value

    # ---- reading (botocore) --------------------------------------------------------------
    def _client(self):
        o = self.options
        settings = (o.get("endpoint_url"), o.get("region"), o.get("profile"), bool(o.get("anon", False)))
        # credentials and endpoints come from the environment when the client is made: a client
        # made before they changed must not be reused (a long-lived process, a test)
        environment = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
        with _clients_lock:
            client = _clients.get((settings, environment))
            if client is None:
                client = _clients[(settings, environment)] = _make_client(*settings)
        return client

    def _bucket_key(self, rpath: str) -> tuple[str, str]:
        bucket, _, key = rpath.partition("/")
        return bucket, key

    def _get(self, operation: str, rpath: str, what: str, **extra):
        """One botocore call on `rpath`'s object, its errors sorted as every backend's are; a missing
        object (or bucket) is FileNotFoundError."""
        bucket, key = self._bucket_key(rpath)
        with self._errors(f"{what} {rpath}"):
            try:
                return getattr(self._client(), operation)(Bucket=bucket, Key=key, **extra)
            except Exception as e:
                if _missing(e):
                    raise FileNotFoundError(rpath) from e
                raise

    def _head(self, rpath: str) -> dict | None:
        try:
            return self._get("head_object", rpath, "stat")
        except FileNotFoundError:
            return None

    def read(self, rpath: str, limit: int | None = None) -> bytes | None:
        """The whole (small) object, or None if it does not exist; with `limit`, at most `limit` + 1 bytes."""
        try:
            body = self._get("get_object", rpath, "read")["Body"]
            with self._errors(f"read {rpath}"), body:
                return body.read() if limit is None else body.read(limit + 1)
        except FileNotFoundError:
            return None

    def size(self, rpath: str) -> int | None:
        head = self._head(rpath)
        return None if head is None else int(head["ContentLength"])

    def stat(self, rpath: str) -> tuple[int, float | None] | None:
        head = self._head(rpath)
        if head is None:
            return None
        modified = head.get("LastModified")
        return int(head["ContentLength"]), (modified.timestamp() if modified is not None else None)

    def _chunks(self, rpath: str, start: int, size: int) -> Iterator[bytes]:
        """See FsBackend.iter_from: one streaming GET with ``Range: bytes=start-size`` (servers
        such as moto re-read an object for every ranged request, so many small ranges are slow)."""
        # up to byte `size` inclusive: one past the expected end, never the rest of a huge object
        # (an empty object has no byte range: read it whole, the caller stops after size + 1)
        extra = {"Range": f"bytes={start}-{size}"} if size > 0 else {}
        body = self._get("get_object", rpath, "download", **extra)["Body"]
        try:
            chunks = body.iter_chunks(STREAM_CHUNK)
            while True:
                with self._errors(f"download {rpath}"):
                    chunk = next(chunks, b"")
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()


def _missing(exc: BaseException) -> bool:
    """botocore's "no such object" (a HEAD answers a bare 404)."""
    error = (getattr(exc, "response", None) or {}).get("Error", {}) if isinstance(getattr(exc, "response", None), dict) else {}
    return str(error.get("Code")) in _MISSING


def _make_client(endpoint_url: str | None, region: str | None, profile: str | None, anon: bool):
    try:
        import botocore.session
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError as e:
        raise InvalidInput("S3 remotes need s3fs (and botocore)", hint="pip install 'zoo-onnx[s3]'") from e
    session = botocore.session.Session(profile=profile)
    # an unreachable remote should fall back to the cache in about a second: few retries, and
    # our own transfers resume anyway
    config = Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 2},
                    max_pool_connections=16, signature_version=UNSIGNED if anon else None)
    return session.create_client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def _open_s3fs(options: dict):
    try:
        import s3fs
    except ImportError as e:
        raise InvalidInput("S3 remotes need s3fs", hint="pip install 'zoo-onnx[s3]'") from e
    client_kwargs = {}
    if options.get("endpoint_url"):
        client_kwargs["endpoint_url"] = options["endpoint_url"]
    if options.get("region"):
        client_kwargs["region_name"] = options["region"]
    # fsspec reuses one instance per argument set: creating an S3 client costs ~0.3 s
    fs = s3fs.S3FileSystem(anon=bool(options.get("anon", False)), profile=options.get("profile"),
                           client_kwargs=client_kwargs, use_listings_cache=False,
                           config_kwargs={"connect_timeout": 10, "retries": {"max_attempts": 2}})
    # s3fs retries failed calls 5 times with back-off; an unreachable remote should fall back to
    # the cache in about a second, and our own transfers resume anyway
    fs.retries = 2
    return fs
