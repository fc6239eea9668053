"""Where a remote run cache keeps its bytes: the `CacheStore` interface and its fsspec backend.

A store holds two kinds of thing, both addressed by what they are, never by who wrote them:

- objects: file contents, named by sha256 (so `zoo.download` verifies them while they stream);
- entries: one small JSON document per cache key, created once and never overwritten.

Layout of `FsCacheStore` (any location `zoo.storage.fsbackend.FsBackend` reaches: a folder,
S3, WebDAV; read-only HTTP(S) for readers)::

    <root>/zoo-run-cache.json                {"schema_version": 1}
    <root>/objects/sha256/<aa>/<sha256>      an output file's bytes
    <root>/entries/<aa>/<key>.json           a stage run (zoo/engine/remote_cache.py says what is in it)

The promises every store keeps (checked for each backend by tests/test_cache_store_contract.py):
`put_object` leaves the object absent or complete, never partial; `create_entry` is
create-exclusive (of two writers of one key exactly one creates it; the other gets False and the
entry stays as the first wrote it); reads of an absent entry or object say so (None, False,
FileNotFoundError from a source) rather than raising; an unreachable or refusing store raises
`SourceUnreachable` / `AccessDenied` (both StorageError, exit 3).
"""

from __future__ import annotations

import abc
import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from zoo.download import Source

STORE_SCHEMA_VERSION = 1
MARKER = "zoo-run-cache.json"


class CacheStore(abc.ABC):
    """A remote run cache's storage. `url` names it in messages; `read_only` stores refuse writes."""

    url: str
    read_only: bool = False

    @abc.abstractmethod
    def read_entry(self, key: str) -> bytes | None:
        """The entry document stored under `key`, or None when there is none. Read with a bound:
        `zoo.errors.MalformedEntry` when it is larger than any entry
        (`zoo.engine.entry_schema.ENTRY_MAX_BYTES`) or, where the store can tell, not a regular
        file (a link on a folder remote)."""

    @abc.abstractmethod
    def create_entry(self, key: str, data: bytes) -> bool:
        """Store `data` under `key` unless an entry is there already; True if this call created it."""

    @abc.abstractmethod
    def has_object(self, sha256: str, size: int) -> bool:
        """True when an object named `sha256` of `size` bytes is stored (its bytes are checked on download)."""

    @abc.abstractmethod
    def put_object(self, local: Path, sha256: str) -> None:
        """Upload `local` as object `sha256`: afterwards it is there complete, or not at all."""

    @abc.abstractmethod
    def object_source(self, sha256: str, size: int) -> "Source":
        """A `zoo.download.Source` serving object `sha256` (ranged reads, so downloads resume)."""

    @abc.abstractmethod
    def keys(self) -> Iterator[str]:
        """Every key that has an entry (order unspecified)."""


class FsCacheStore(CacheStore):
    """A `CacheStore` on one fsspec location, through the remote zoo's byte-level backend."""

    def __init__(self, url: str, options: dict | None = None):
        from zoo.storage.fsbackend import open_backend

        self.backend = open_backend(url, options)
        self.url = url
        self.read_only = self.backend.read_only
        self._marked = False

    def _entry_path(self, key: str) -> str:
        _check_key(key)
        return self.backend.path(*entry_name(key).split("/"))

    def _object_path(self, sha256: str) -> str:
        _check_key(sha256)
        return self.backend.path("objects", "sha256", sha256[:2], sha256)

    def read_entry(self, key: str) -> bytes | None:
        from zoo.engine import entry_schema
        from zoo.errors import MalformedEntry, UnsafePath
        from zoo.files import NotARegularFile

        rpath = self._entry_path(key)
        try:
            data = self.backend.read(rpath, limit=entry_schema.ENTRY_MAX_BYTES)
        except NotARegularFile as e:
            raise MalformedEntry(f"remote cache {self.url}: the entry {entry_name(key)} is {e.strerror}") from None
        except UnsafePath as e:  # its folder is a link out of the remote: never read, a miss like any bad entry
            raise MalformedEntry(f"remote cache {self.url}: the entry {entry_name(key)} is not read: {e.message}") from None
        if data is not None and len(data) > entry_schema.ENTRY_MAX_BYTES:
            raise MalformedEntry(f"remote cache {self.url}: the entry {entry_name(key)} is larger than "
                                 f"{entry_schema.bound()}")
        return data

    def create_entry(self, key: str, data: bytes) -> bool:
        self._mark()
        return self.backend.create(self._entry_path(key), data)

    def has_object(self, sha256: str, size: int) -> bool:
        return self.backend.size(self._object_path(sha256)) == size

    def put_object(self, local: Path, sha256: str) -> None:
        self._mark()
        self.backend.put_file(local, self._object_path(sha256))

    def object_source(self, sha256: str, size: int) -> "Source":
        from zoo.download import Source

        rpath = self._object_path(sha256)
        return Source(self.url, lambda offset: self.backend.iter_from(rpath, offset, size))

    def keys(self) -> Iterator[str]:
        b = self.backend
        for prefix in b.listdir(b.path("entries")):
            for name in b.listdir(b.path("entries", prefix)):
                if name.endswith(".json") and not name.startswith("."):
                    yield name[:-5]

    def _mark(self) -> None:
        """Write the layout marker once (so the folder says what it is and which schema it holds)."""
        if self._marked:
            return
        from zoo.errors import StorageError

        b = self.backend
        marker = b.path(MARKER)
        if b.read(marker) is None:
            try:  # created, never overwritten: the first writer's marker stands
                b.create(marker, json.dumps({"schema_version": STORE_SCHEMA_VERSION}).encode())
            except (StorageError, FileNotFoundError):
                # the first users of a new remote race to write it, and a server may fail the
                # loser's request instead of refusing it (wsgidav answers racing MOVEs with a 500):
                # fine when the marker is there now
                if b.read(marker) is None:
                    raise
        self._marked = True


def entry_name(key: str) -> str:
    """Where a store keeps the entry of `key`, relative to its root (for messages)."""
    return f"entries/{key[:2]}/{key}.json"


def _check_key(value: str) -> None:
    """Keys and digests are lowercase hex: nothing else may become a remote path."""
    from zoo.errors import InvalidInput

    if len(value) < 8 or any(c not in "0123456789abcdef" for c in value):
        raise InvalidInput(f"not a cache key or digest: {value!r}")


def open_store(url: str, options: dict | None = None) -> CacheStore:
    """The store at `url` (fsspec through the remote zoo's backend; its driver imported now)."""
    return FsCacheStore(url, options)
