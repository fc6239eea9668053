"""The remote run cache: a local `Cache` backed by a `CacheStore` that machines share.

A run looks in the local cache, then here (`fetch`); a stage found remotely has its outputs
downloaded into the local cache instead of running. What a run computes is `push`ed: objects
first, the entry last with a create-exclusive write, so an entry on the remote always has its
objects there (a push cut off at any point leaves at most unreferenced objects, never a hit).
An entry is never overwritten: the first run to push a key wins; a concurrent push of the same
key finds it there and is fine (same key, same inputs).

An entry document (schema_version 1)::

    {"schema_version": 1, "key": KEY, "entry": <the local cache entry, zoo.engine.cache.Entry>,
     "sha256": {<blake3 digest of a file>: <its sha256>},
     "log": {"sha256": <sha256>, "size": <bytes>}}

``log`` names the stage's captured output, pushed as one more object (content-addressed like the
outputs, uploaded before the entry). It is optional: entries pushed by older zoos, or of a stage
whose log is missing, lack it, and older zoos ignore it, so the schema stays 1. A remote hit
installs it as the local cache's log of the key (sha256-verified); a log that cannot be had or is
not what the entry names is a note, never a failure of the stage, and is not installed.

The local cache names objects by blake3, the remote by sha256 (its objects are shared with the
registry's naming and the entry maps one to the other). A downloaded object is checked against the
entry's blake3 digest while its bytes stream (`zoo.download`: resumable, from a temporary file in
the cache's ``partial/``), so the bytes installed are exactly those the entry and the key's
lockfile record name: a tampered object (or an entry whose sha256 points at other bytes) is an
`IntegrityError` (exit 4) and nothing of that stage is installed in the local cache. One strong
digest is checked, not two: sha256 would add a second pass over every byte and prove nothing the
blake3 check does not (the entry that names both is what the bytes are checked against). Where
sha256 is needed (publishing a build to the zoo, whose blobs are named by it), the publisher
hashes the file.

Trust: a remote entry is hostile input until checked, and is checked before anything is
installed (`parse_document`). It is read with a bound (`entry_schema.ENTRY_MAX_BYTES`; on a
folder remote a regular file only, never a link) and validated by a strict schema
(zoo/engine/entry_schema.py): a document that is not a valid entry is a miss with a one-line note
naming the remote and the entry (the stage runs here, also under `--frozen`, whose comparison
with the lockfile then decides). A valid entry that contradicts what it brings is an
IntegrityError (exit 4, the stage fails, nothing is installed): its declared output digests are
recomputed from its files exactly as a local commit computes them, and each file's blake3 is
checked against its bytes as they download, so what `--frozen` and `zoo release` compare with the
lockfile is always what the fetched bytes are. What the remote can still choose: for a key whose
lockfile record it does not meet, bytes of its own (a remote cache is shared with people you trust
to build for you; `--frozen` is what pins them), and the metrics and log of an entry.

An unreachable or refusing remote (SourceUnreachable, AccessDenied) is noted once and the run
goes on with the local cache only (`notes`).

A fetch is two steps, so a run can overlap the downloads of successive stages (`begin`: read the
entry, whose output digests are all the next stage's key needs, and start installing its objects
in the background; `finish`: wait for them, with `fetch`'s outcomes). The runner begins the fetch
of a stage whose upstream is still downloading and uses it only if the stage's key, once its
upstream is settled, is the key it began with.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from zoo.engine.cache import Cache, Entry, missing_outputs
from zoo.engine.cache_config import RemoteCacheSetting
from zoo.engine.cache_store import CacheStore, open_store
from zoo.errors import AccessDenied, IntegrityError, MalformedEntry, NoSpace, SourceUnreachable, StorageError, ZooError

REMOTE_ENTRY_SCHEMA_VERSION = 1
PARTIAL = "partial"  # under the cache root: downloads in progress (resumed by the next run)
DOWNLOAD_THREADS = 4  # objects of one stage downloaded side by side
STAGE_INSTALLS = 3  # stages whose objects install at once (`begin`)


@dataclass
class PendingFetch:
    """A remote hit under way: its entry was read, its objects are being installed (`future`)."""

    key: str
    entry: Entry
    future: Future


class RemoteCache:
    """A remote run cache for one local `cache`. The store is opened on first use."""

    def __init__(self, cache: Cache, setting: RemoteCacheSetting, store: CacheStore | None = None):
        self.cache = cache
        self.setting = setting
        self.url = setting.url
        self._store = store
        self.offline = False  # found unreachable: the rest of the run is local
        self._installer: ThreadPoolExecutor | None = None  # `begin`'s background installs
        self.notes: list[str] = []
        # called with each object's size once it is uploaded or downloaded (`zoo cache push|pull`
        # show bytes and MB/s); from `begin`'s background threads too
        self.progress: Callable[[int], None] | None = None
        # the same for `zoo run`, which moves both ways: ("fetched" | "pushed", bytes, seconds it took)
        self.on_transfer: Callable[[str, int, float], None] | None = None

    @property
    def store(self) -> CacheStore:
        if self._store is None:
            self._store = open_store(self.url, self.setting.options)
        return self._store

    # --- reading -------------------------------------------------------------------------
    def remote_entry(self, key: str) -> tuple[Entry, dict[str, str]] | None:
        """The remote's entry for `key` and its {blake3: sha256} map, or None (also when the document
        is not a valid entry: noted). IntegrityError when it contradicts its key or its files."""
        try:
            found = self._read_entry(key)
        except MalformedEntry as e:
            self._malformed(e)
            return None
        return None if found is None else found[:2]

    def _read_entry(self, key: str) -> tuple[Entry, dict[str, str], dict[str, object] | None] | None:
        """`remote_entry` and the entry's log reference ({"sha256", "size"}, or None)."""
        data = self.store.read_entry(key)
        if data is None:
            return None
        return parse_document(data, key, self.url)

    def _malformed(self, e: MalformedEntry) -> None:
        """A remote entry that is not a valid document is a miss (the stage runs here): noted once."""
        note = f"{e.message}; taken as a miss"
        if note not in self.notes:
            self.notes.append(note)

    def peek(self, key: str) -> Entry | None:
        """The remote's entry for `key` without downloading its objects (for `zoo plan` / `status`),
        or None when the remote lacks it, cannot be reached, or serves an invalid entry (noted)."""
        if self.offline:
            return None
        try:
            found = self.remote_entry(key)
        except (SourceUnreachable, AccessDenied, StorageError) as e:
            if isinstance(e, NoSpace):
                raise
            self._went_offline(e)
            return None
        except MalformedEntry as e:
            self._malformed(e)
            return None
        except IntegrityError as e:
            self.notes.append(e.message)
            return None
        return None if found is None else found[0]

    def fetch(self, key: str) -> Entry | None:
        """Make `key` a local hit from the remote: download its objects (every one verified before
        any is installed), then record the local entry. None when the remote lacks it or cannot be
        reached (noted); IntegrityError when what it serves is not what its entry names."""
        pending = self.begin(key, background=False)
        return None if pending is None else self.finish(pending)

    def begin(self, key: str, *, background: bool = True) -> PendingFetch | None:
        """Read the remote's entry for `key` and start installing its objects in the background
        (or, not `background`, install them now); None when the remote lacks it or cannot be
        reached (noted). IntegrityError when the entry is not valid for `key`."""
        if self.offline:
            return None
        try:
            found = self._read_entry(key)
        except NoSpace:
            raise
        except MalformedEntry as e:
            self._malformed(e)
            return None
        except (SourceUnreachable, AccessDenied, StorageError) as e:  # carry on without the remote
            self._went_offline(e)
            return None
        if found is None:
            return None
        entry, sha, log = found
        if not background:  # no pool: a one-off fetch (`zoo cache pull`) leaves no threads behind
            done: Future = Future()
            try:
                self._install_found(entry, sha, log)
                done.set_result(None)
            except Exception as e:  # handed to `finish`, which sorts it as a background install's
                done.set_exception(e)
            return PendingFetch(key, entry, done)
        if self._installer is None:
            self._installer = ThreadPoolExecutor(max_workers=STAGE_INSTALLS, thread_name_prefix="zoo-fetch")
        return PendingFetch(key, entry, self._installer.submit(self._install_found, entry, sha, log))

    def finish(self, pending: PendingFetch) -> Entry | None:
        """Wait for `pending`'s objects: the local entry once installed; None when the remote could
        not be reached meanwhile (noted: the stage runs here); IntegrityError when what it served
        is not what its entry names (nothing of the stage installed)."""
        try:
            pending.future.result()
        except NoSpace:
            raise
        except (SourceUnreachable, AccessDenied, StorageError) as e:
            self._went_offline(e)
            return None
        return self.cache.lookup(pending.key)

    def close(self) -> None:
        """Wait for installs under way (a run that ends early leaves none half-done) and drop the
        ones not started."""
        if self._installer is not None:
            self._installer.shutdown(wait=True, cancel_futures=True)
            self._installer = None

    def _install_found(self, entry: Entry, sha: dict[str, str], log: dict | None) -> None:
        self.install(entry, sha)
        if log is not None:
            self._install_log(entry, log)

    def install(self, entry: Entry, sha: dict[str, str], *, record: bool = True) -> None:
        """Download the objects of `entry` the local cache lacks (`sha`: their sha256 by blake3),
        every one verified before any is installed, then record the entry (unless not `record`:
        a stage of cache policy `disable`, whose objects its dependents read). Errors raise."""
        self.cache.hold(keys=[entry.key], digests=[m["digest"] for m in entry.files.values()])
        verified = self._download_all(entry, sha)
        for digest, path in verified.items():
            self.cache.install_object(path, digest)
        if record:
            self.cache.record(entry)

    def _download_all(self, entry: Entry, sha: dict[str, str]) -> dict[str, Path]:
        """{blake3: verified file in partial/} for each object of `entry` the local cache lacks.

        The objects download side by side (`DOWNLOAD_THREADS`: a stage's files are often one large
        model and a few small ones, and one stream rarely fills the link); blake3 is checked while
        the bytes stream (zoo.download: resumable). On any failure the files this
        call verified are removed, so a refused stage installs nothing."""
        from concurrent.futures import ThreadPoolExecutor

        partial = self.cache.root / PARTIAL
        wanted: dict[str, int] = {}
        for meta in entry.files.values():
            digest = meta["digest"]
            if digest not in wanted and not self.cache.object_path(digest).exists():
                wanted[digest] = meta["size"]
        verified: dict[str, Path] = {}
        # the largest first, so the long download starts at once
        order = sorted(wanted, key=lambda d: -wanted[d])
        with ThreadPoolExecutor(max_workers=max(1, min(DOWNLOAD_THREADS, len(order)))) as pool:
            futures = {pool.submit(self._download_verified, entry, d, sha[d], wanted[d], partial): d for d in order}
            failure: BaseException | None = None
            for future, digest in futures.items():
                try:
                    path = future.result()
                except BaseException as e:  # keep collecting: every verified file must be known to remove it
                    failure = failure or e
                    continue
                if path is not None:  # None: a concurrent fetch installed it meanwhile
                    verified[digest] = path
        if failure is not None:
            for path in verified.values():
                path.unlink(missing_ok=True)
            raise failure
        return verified

    def _download_verified(self, entry: Entry, digest: str, sha256: str, size: int, partial: Path) -> Path | None:
        """One object (the remote's name for it: `sha256`) downloaded and checked against the
        entry's blake3 `digest` while it streams, then taken under a name of this process's own, so
        a concurrent fetch of the same bytes (another run on this cache) cannot move it away. None
        when that other fetch installed the object first; IntegrityError (nothing kept) when the
        bytes are not those the entry names."""
        import secrets

        from zoo.download import download

        dest = partial / sha256
        for _ in range(3):
            started = time.monotonic()
            try:
                download([self.store.object_source(sha256, size)], dest, blake3=digest, size=size,
                         what=f"an output of stage {entry.stage}", tmp_dir=partial)
            except IntegrityError as e:
                raise IntegrityError(f"remote cache {self.url}: stage {entry.stage}'s entry names an object whose "
                                     f"bytes disagree with it ({e.message}); nothing was installed",
                                     hint="the remote's object or entry is damaged or was tampered with: remove "
                                          "the entry from the remote, then run again") from None
            self._moved("fetched", size, time.monotonic() - started)
            mine = partial / f"{sha256}.{os.getpid()}.{secrets.token_hex(4)}.verified"
            try:
                os.rename(dest, mine)
                return mine
            except FileNotFoundError:  # another process took the file we both downloaded
                if self.cache.object_path(digest).exists():
                    return None
        raise StorageError(f"remote cache {self.url}: could not keep a download in {partial}",
                           hint="another process keeps removing it; run again")

    def _install_log(self, entry: Entry, log: dict) -> None:
        """Download the stage's log (sha256-verified) to the local cache's log of its key; a log
        that cannot be had or is not the one named is a note (the outputs are installed already)."""
        from zoo.download import download

        try:
            download([self.store.object_source(str(log["sha256"]), int(log["size"]))], self.cache.log_path(entry.key),
                     sha256=str(log["sha256"]), size=int(log["size"]),
                     what=f"remote cache {self.url}: the log of stage {entry.stage}", tmp_dir=self.cache.root / PARTIAL)
        except NoSpace:
            raise
        except ZooError as e:
            self.notes.append(f"stage {entry.stage} was taken from the remote cache {self.url} without its log: "
                              f"{e.message}")

    # --- writing -------------------------------------------------------------------------
    def push(self, entry: Entry) -> dict[str, int]:
        """Upload `entry` (objects the remote lacks, then the entry, create-exclusive).

        Returns {"created", "objects", "bytes"}; created is 0 when the entry was there already
        (it is never overwritten). Unreachable/refusing remotes raise (callers decide)."""
        if self.store.read_entry(entry.key) is not None:
            return {"created": 0, "objects": 0, "bytes": 0}
        sha, uploaded, nbytes = self._upload(entry)
        created = self.create_entry(entry, sha)
        return {"created": int(created), "objects": uploaded, "bytes": nbytes}

    def push_objects(self, entry: Entry) -> dict[str, str]:
        """Upload the objects of `entry` the remote lacks, and no entry; {blake3: sha256} of each.

        How a stage's inputs and outputs travel between the machines of one run
        (zoo/engine/remote_stage.py), whatever its cache policy."""
        return self._upload(entry)[0]

    def create_entry(self, entry: Entry, sha: dict[str, str], *, log: Path | None = None) -> bool:
        """Write the entry document of `entry`, whose objects are on the remote (create-exclusive),
        naming the stage's log: `log`, else the local cache's log of the key, uploaded first when
        there is one."""
        doc = {"schema_version": REMOTE_ENTRY_SCHEMA_VERSION, "key": entry.key, "entry": entry.to_json(), "sha256": sha}
        ref = self._push_log(Path(log) if log is not None else self.cache.log_path(entry.key))
        if ref is not None:
            doc["log"] = ref
        return self.store.create_entry(entry.key, json.dumps(doc, indent=1, sort_keys=True).encode())

    def _push_log(self, path: Path) -> dict[str, object] | None:
        """Upload the log at `path` as an object unless the remote has it; its reference, or None
        when there is no log. The bytes are read once, so the object is named by what is uploaded
        even if a rerun replaces the file meanwhile."""
        import hashlib
        import secrets

        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StorageError(f"cannot read the log {path}: {e}") from e
        ref = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        if not self.store.has_object(ref["sha256"], ref["size"]):
            snapshot = self.cache.root / PARTIAL / f"log.{os.getpid()}.{secrets.token_hex(4)}"
            try:
                snapshot.parent.mkdir(parents=True, exist_ok=True)
                snapshot.write_bytes(data)
                self.store.put_object(snapshot, ref["sha256"])
            except OSError as e:
                raise StorageError(f"cannot stage the log {path} for upload: {e}") from e
            finally:
                snapshot.unlink(missing_ok=True)
        return ref

    def _upload(self, entry: Entry) -> tuple[dict[str, str], int, int]:
        """({blake3: sha256}, objects uploaded, bytes uploaded); each local object is checked first."""
        from zoo.files import sha256_and_size
        from zoo.engine.hashing import hash_file_uncached

        sha: dict[str, str] = {}
        uploaded = nbytes = 0
        for meta in entry.files.values():
            digest = meta["digest"]
            if digest in sha:
                continue
            local = self.cache.object_path(digest)
            sha256, size = sha256_and_size(local)
            if size != meta["size"] or hash_file_uncached(local) != digest:
                raise IntegrityError(f"local cache object {digest[:16]}… of stage {entry.stage} is corrupt; "
                                     "refusing to push it", hint="`zoo gc` it away and run the stage again")
            sha[digest] = sha256
            if not self.store.has_object(sha256, size):
                started = time.monotonic()
                self.store.put_object(local, sha256)
                uploaded += 1
                nbytes += size
                self._moved("pushed", size, time.monotonic() - started)
        return sha, uploaded, nbytes

    def _moved(self, direction: str, size: int, seconds: float) -> None:
        """Tell whoever shows transfers that one object of `size` bytes went `direction` in `seconds`."""
        if self.progress is not None:
            self.progress(size)
        if self.on_transfer is not None:
            self.on_transfer(direction, size, seconds)

    def share(self, entry: Entry) -> None:
        """Push what a run computed, unless pushing is off; an unreachable remote is noted, and a
        local object found corrupt is noted too (the run's own result stands)."""
        if self.offline or not self.setting.push or self.store.read_only:
            return
        try:
            self.push(entry)
        except (SourceUnreachable, AccessDenied) as e:
            self._went_offline(e)
        except MalformedEntry as e:  # the remote holds a bad entry for the key (noted when it was read)
            self._malformed(e)
        except ZooError as e:  # a corrupt local object, a remote error: the stage's result stands
            self.notes.append(f"stage {entry.stage} was not pushed to the remote cache {self.url}: {e.message}")

    def _went_offline(self, e: Exception) -> None:
        if self.offline:  # noted once: fetches under way may fail the same way
            return
        self.offline = True
        what = "refused access" if isinstance(e, AccessDenied) else \
            "is unreachable" if isinstance(e, SourceUnreachable) else "failed"
        self.notes.append(f"remote cache {self.url} {what} ({type(e).__name__}); the rest of this run used "
                          "the local cache only")


def parse_document(data: bytes, key: str, url: str) -> tuple[Entry, dict[str, str], dict[str, object] | None]:
    """A remote entry document read for `key`: (entry, {blake3: sha256}, log reference or None).

    Two kinds of refusal, both before anything is installed:

    - `MalformedEntry` (a miss with a note: the stage runs here): the document is not an entry of
      this schema: not JSON, another schema_version, or any field of the wrong type or form
      (zoo/engine/entry_schema.py, strict);
    - `IntegrityError` (exit 4): a well-formed entry that contradicts what it is filed under or
      what it brings: another key, a path outside the stage's folder, an object without a sha256,
      a declared output missing, or a declared output digest that is not the one its files make.
      The output digests are recomputed from the files' blake3 digests exactly as `Cache.commit`
      computes them for a local run (`misdeclared_outputs`); each file's blake3 is then checked
      against its bytes while they download. So what `--frozen` and `zoo release` compare with
      the lockfile is what the fetched bytes are, never what the entry claims.
    """
    from pydantic import ValidationError

    from zoo.engine.cache import misdeclared_outputs
    from zoo.engine.cache_store import entry_name
    from zoo.engine.entry_schema import RemoteEntryDoc, first_problem
    from zoo.pathsafety import EscapingPath, check_relative_path

    where = f"remote cache {url}: the entry {entry_name(key)}"

    def malformed(why: str) -> MalformedEntry:
        return MalformedEntry(f"{where} is not a valid entry ({why})",
                              hint="remove that entry from the remote (it is damaged, was tampered with, or was "
                                   "written by an incompatible zoo)")

    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise malformed(f"not JSON: {type(e).__name__}") from None
    if not isinstance(raw, dict):
        raise malformed(f"a JSON {type(raw).__name__}, not an object")
    if raw.get("schema_version") != REMOTE_ENTRY_SCHEMA_VERSION:
        raise malformed(f"schema_version {raw.get('schema_version')!r}; this zoo reads {REMOTE_ENTRY_SCHEMA_VERSION}")
    try:
        doc = RemoteEntryDoc.model_validate(raw)
        entry = Entry.from_json(doc.entry)
    except ValidationError as e:
        problem = first_problem(e)
        raise malformed(problem if problem.startswith(("key", "sha256", "log", "entry")) else f"entry.{problem}") \
            from None
    except ValueError as e:
        raise malformed(f"entry: {e}") from None

    def lying(why: str) -> IntegrityError:
        return IntegrityError(f"{where} (stage {entry.stage}) {why}; nothing was installed",
                              hint="the remote's entry is damaged or was tampered with: remove it from the remote, "
                                   "then run again")

    if doc.key != key or entry.key != key:
        raise lying("describes another key")
    for rel, meta in entry.files.items():
        try:
            check_relative_path(rel)
        except EscapingPath:
            raise lying(f"names a file {rel!r} outside the stage's folder") from None
        if not _hex(meta["digest"]) or len(meta["digest"]) != 64 or meta["digest"] not in doc.sha256:
            raise lying(f"lacks a valid digest for {rel!r}")
    if missing_outputs(entry.outputs, entry.files):
        raise lying("lacks a declared output")
    lies = misdeclared_outputs(entry)
    if lies:
        raise lying(f"declares output {lies[0]}")
    log = None if doc.log is None else {"sha256": doc.log.sha256, "size": doc.log.size}
    return entry, dict(doc.sha256), log


def parse_entry(data: bytes, key: str, url: str) -> tuple[Entry, dict[str, str]]:
    """`parse_document` without the log reference."""
    return parse_document(data, key, url)[:2]


def parse_log_ref(data: bytes, key: str, url: str) -> dict[str, object] | None:
    """The ``log`` reference of a remote entry document ({"sha256", "size"}), or None when it names
    none (an entry pushed by an older zoo). MalformedEntry when it is malformed."""
    from pydantic import ValidationError

    from zoo.engine.entry_schema import LogRef

    log = json.loads(data).get("log")
    if log is None:
        return None
    try:
        ref = LogRef.model_validate(log)
    except ValidationError:
        raise MalformedEntry(f"remote cache {url}: the entry for key {key[:16]}… names a malformed log",
                             hint="remove that entry from the remote (it is damaged or was tampered with)") from None
    return {"sha256": ref.sha256, "size": ref.size}


def _hex(value: str) -> bool:
    return bool(value) and all(c in "0123456789abcdef" for c in value)

