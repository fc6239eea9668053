"""The one downloader (`zoo.download`, mutation area registry-blobs) states its invariants
directly: bytes become visible under their name only when sha256 and size match; a broken transfer
resumes from its temporary file (also one a finished process left), never from one a live download
is writing; a failure other than an interruption leaves no temporary file; sources are tried in
order and the error class says why. Sources here are in-process generators (`_source`), except
where a process or a full disk is the point. The HTTP and Hugging Face sources are tested against
real servers in test_sources.py and the remote suites."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zoo import download as dl
from zoo.download import Source, download
from zoo.errors import AccessDenied, IntegrityError, NotFound, SourceUnreachable, StorageError
from zoo.registry.blobs import BlobStore
from zoo.registry.manifest import FileRef
from zoo.registry.remote import fetch_blob

DATA = b"zoo blob " * 1000  # 9000 bytes
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def _source(data: bytes, log: list | None = None, *, fail_after: int | None = None, exc=SourceUnreachable,
            label: str = "a") -> Source:
    """Serves `data` from an offset in 1000-byte chunks; records the offsets asked for; optionally
    breaks off (raises `exc`) after `fail_after` bytes of one transfer."""
    def open_from(offset: int):
        if log is not None:
            log.append(offset)
        sent = 0
        for i in range(offset, len(data), 1000):
            if fail_after is not None and sent >= fail_after:
                raise exc("connection reset")
            chunk = data[i:i + 1000]
            sent += len(chunk)
            yield chunk
        if fail_after is not None and sent >= fail_after and offset + sent < len(data):
            raise exc("connection reset")
    return Source(label, open_from)


def _refusing(exc, label: str = "a") -> Source:
    def open_from(offset):
        raise exc
        yield b""  # a generator, like the real sources (never reached)
    return Source(label, open_from)


def _get(store: BlobStore, *sources: Source, size: int = len(DATA), what: str = "x") -> Path:
    return download(list(sources), store.path(SHA), sha256=SHA, size=size, what=what, tmp_dir=store.partial_dir)


def _temps(store: BlobStore) -> list[Path]:
    return sorted(store.partial_dir.glob("*.incomplete")) if store.partial_dir.exists() else []


def _leftover(store: BlobStore, data: bytes, *, host: str = dl._HOST, pid: int | None = None) -> Path:
    """A temporary file as a download by process `pid` of `host` (default: this process, finished) left it."""
    store.partial_dir.mkdir(parents=True, exist_ok=True)
    p = store.partial_dir / f"{SHA}.{host}.{os.getpid() if pid is None else pid}.0123456789ab.incomplete"
    p.write_bytes(data)
    return p


# ---- placing verified bytes ----------------------------------------------------------------
def test_a_download_places_verified_bytes_read_only_and_leaves_no_temporary_file(store):
    log: list[int] = []
    assert _get(store, _source(DATA, log)) == store.path(SHA)
    assert store.path(SHA).read_bytes() == DATA and log == [0]
    assert stat.S_IMODE(store.path(SHA).stat().st_mode) == 0o444
    assert _temps(store) == []


def test_fetch_blob_asks_no_source_for_a_blob_that_is_there(store):
    ref = FileRef(path="m.onnx", sha256=SHA, size=len(DATA))
    fetch_blob(store, ref, [_source(DATA)], "x")
    assert store.check(SHA, rehash=True) == "ok"
    fetch_blob(store, ref, [_refusing(AssertionError("asked"))], "x")  # present and good: no source is asked
    store.remove(SHA)  # its folder stays: fetched again into it
    fetch_blob(store, ref, [_source(DATA)], "x")
    assert store.check(SHA, rehash=True) == "ok"


@pytest.mark.parametrize("bad", [DATA[:-1] + b"!", DATA + b"more", DATA[:-1]], ids=["changed", "appended", "short"])
def test_bytes_that_do_not_match_are_refused_and_nothing_is_left(store, bad):
    with pytest.raises(IntegrityError, match="checksum mismatch") as e:
        _get(store, _source(bad, label="evil"), what="m.onnx")
    assert e.value.message.startswith(f"m.onnx from evil: checksum mismatch (expected sha256 {SHA} and "
                                      f"{len(DATA)} bytes, got sha256 ")
    if len(bad) <= len(DATA):  # (appended bytes: the download stops at the first chunk too many)
        assert e.value.message.endswith(f"got sha256 {hashlib.sha256(bad).hexdigest()} and {len(bad)} bytes)")
    assert "nothing was installed" in e.value.hint
    assert not store.present(SHA) and _temps(store) == []


@pytest.mark.parametrize("claimed", [len(DATA) + 1, len(DATA) - 1])
def test_a_claimed_size_other_than_the_bytes_is_refused_even_when_the_digest_matches(store, claimed):
    with pytest.raises(IntegrityError, match=f"and {claimed} bytes, got sha256 ") as e:
        _get(store, _source(DATA), size=claimed)
    if claimed > len(DATA):
        assert e.value.message.endswith(f"got sha256 {SHA} and {len(DATA)} bytes)")
    assert not store.present(SHA) and _temps(store) == []


def test_an_unknown_size_is_allowed_and_only_the_digest_decides(tmp_path):
    dest = tmp_path / "out" / SHA
    assert download([_source(DATA)], dest, sha256=SHA, size=None, what="x") == dest
    assert dest.read_bytes() == DATA and list(dest.parent.glob("*.incomplete")) == []
    with pytest.raises(IntegrityError):
        download([_source(DATA + b"!")], tmp_path / "other" / SHA, sha256=SHA, size=None, what="x")


def _blake3(data: bytes) -> str:
    from blake3 import blake3

    return blake3(data).hexdigest()


def test_a_file_pinned_by_blake3_is_checked_by_blake3_and_not_remembered_as_sha256_checked(tmp_path):
    """The run cache's objects are pinned by blake3 only: the bytes must hash to it, and the
    download records no sha256 it did not compute."""
    from zoo import files

    dest = tmp_path / "obj"
    assert download([_source(DATA)], dest, blake3=_blake3(DATA), size=len(DATA), what="x") == dest
    assert dest.read_bytes() == DATA and files._remembered_sha256(dest.stat()) is None
    with pytest.raises(IntegrityError) as e:
        download([_source(DATA[:-1] + b"!", label="evil")], tmp_path / "bad", blake3=_blake3(DATA), size=len(DATA),
                 what="obj")
    assert e.value.message == (f"obj from evil: checksum mismatch (expected blake3 {_blake3(DATA)} and {len(DATA)} "
                               f"bytes, got blake3 {_blake3(DATA[:-1] + b'!')} and {len(DATA)} bytes)")
    assert not (tmp_path / "bad").exists() and list(tmp_path.glob("bad.*")) == []


def test_every_digest_given_is_checked(tmp_path):
    with pytest.raises(IntegrityError, match=f"expected sha256 {SHA} and blake3 {'0' * 64} and "):
        download([_source(DATA)], tmp_path / "x", sha256=SHA, blake3="0" * 64, size=len(DATA), what="x")
    download([_source(DATA)], tmp_path / "y", sha256=SHA, blake3=_blake3(DATA), size=len(DATA), what="x")
    with pytest.raises(ValueError, match="sha256 or the blake3"):
        download([_source(DATA)], tmp_path / "z", size=len(DATA), what="x")


def test_a_broken_transfer_pinned_by_blake3_resumes_and_is_checked_over_the_whole_file(tmp_path):
    log: list[int] = []
    dest = tmp_path / "obj"
    download([_source(DATA, log, fail_after=3000)], dest, blake3=_blake3(DATA), size=len(DATA), what="x")
    assert log == [0, 3000, 6000] and dest.read_bytes() == DATA


def test_sources_are_tried_in_order_past_bad_bytes(store):
    first, second, third = [], [], []
    _get(store, _source(DATA[::-1], first), _source(DATA, second), _source(DATA, third))
    assert store.check(SHA, rehash=True) == "ok"
    assert (first, second, third) == ([0], [0], [])


def test_a_source_sending_more_than_the_file_is_cut_off_not_read_to_its_end(store):
    sent = []

    def endless(offset):
        for _ in range(1000):  # a hostile or broken server: far more than the file (bounded, so a bug fails, not hangs)
            sent.append(1)
            yield DATA[:1000]
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        _get(store, Source("endless", endless))
    assert len(sent) < 2 * (len(DATA) // 1000 + 1)  # one chunk too many, and what the prefetch had queued


# ---- resuming ------------------------------------------------------------------------------
def test_a_broken_transfer_resumes_from_where_it_stopped(store):
    log: list[int] = []
    _get(store, _source(DATA, log, fail_after=3000))
    assert log == [0, 3000, 6000] and store.path(SHA).read_bytes() == DATA


def test_a_transfer_that_broke_after_one_byte_is_resumed(store):
    log: list[int] = []

    def one_byte_then_the_rest(offset):
        log.append(offset)
        yield DATA[offset:offset + 1]
        if offset == 0:
            raise SourceUnreachable("reset")
        yield DATA[offset + 1:]
    _get(store, Source("flaky", one_byte_then_the_rest))
    assert log == [0, 1] and store.path(SHA).read_bytes() == DATA


def test_a_source_is_given_up_after_its_retries_and_the_file_kept_for_the_next_download(store):
    log: list[int] = []
    with pytest.raises(SourceUnreachable):
        _get(store, _source(DATA, log, fail_after=1000))
    assert log == [i * 1000 for i in range(dl.RETRIES + 1)]
    [kept] = _temps(store)
    assert kept.stat().st_size == (dl.RETRIES + 1) * 1000  # an interruption: kept to be resumed
    log.clear()
    _get(store, _source(DATA, log))  # a later download (a finished one of this process left it) resumes it
    assert log == [(dl.RETRIES + 1) * 1000] and store.check(SHA, rehash=True) == "ok"
    assert _temps(store) == []


def test_a_source_that_breaks_without_progress_is_not_retried(store):
    log: list[int] = []
    with pytest.raises(SourceUnreachable, match="connection reset"):
        _get(store, _source(DATA, log, fail_after=0))
    assert log == [0] and _temps(store) == []  # nothing received: nothing kept


def test_a_broken_transfer_is_retried_only_while_the_temporary_file_grows(store):
    _leftover(store, DATA[:3000])  # a good prefix from an earlier download
    log: list[int] = []
    with pytest.raises(SourceUnreachable):
        _get(store, _source(DATA, log, fail_after=0))
    assert log == [3000]  # no progress: not retried
    [kept] = _temps(store)
    assert kept.read_bytes() == DATA[:3000]  # the prefix kept
    kept.write_bytes(DATA + b"junk")  # longer than the file: discarded, so the file shrinks
    log.clear()
    with pytest.raises(SourceUnreachable):
        _get(store, _source(DATA, log, fail_after=1000))
    assert log == [0]  # shorter than before the attempt: not progress, not retried


def test_a_temporary_file_longer_than_the_file_is_restarted(store):
    _leftover(store, DATA + b"junk")
    log: list[int] = []
    _get(store, _source(DATA, log))
    assert log == [0] and store.path(SHA).read_bytes() == DATA


def test_a_temporary_file_holding_the_whole_file_is_verified_not_fetched_again(store):
    _leftover(store, DATA)
    log: list[int] = []
    _get(store, _source(DATA, log))
    assert log == [len(DATA)] and store.path(SHA).read_bytes() == DATA


def test_bad_bytes_resumed_from_are_dropped_and_the_file_fetched_from_the_start(store):
    _leftover(store, b"X" * 4000)
    log: list[int] = []
    _get(store, _source(DATA, log))
    assert log == [4000, 0] and store.path(SHA).read_bytes() == DATA and _temps(store) == []


def test_a_leftover_of_a_process_that_is_gone_is_resumed(store):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    _leftover(store, DATA[:2000], pid=int(gone.stdout))
    log: list[int] = []
    _get(store, _source(DATA, log))
    assert log == [2000] and _temps(store) == []


def test_the_temporary_file_of_a_live_download_is_never_taken(store):
    """A real second process stands for a download in progress: its file is left alone."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        theirs = _leftover(store, DATA[:2000], pid=live.pid)
        log: list[int] = []
        _get(store, _source(DATA, log))
        assert log == [0] and theirs.read_bytes() == DATA[:2000]
    finally:
        live.kill()
        live.wait()


def test_abandoned_temporary_files_of_a_file_now_in_place_are_removed(store):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    first = _leftover(store, DATA[:1000])
    second = store.partial_dir / first.name.replace(f".{os.getpid()}.", f".{int(gone.stdout)}.")
    second.write_bytes(DATA[:2000])
    fresh = _leftover(store, DATA[:3000], host="other-host", pid=1)  # maybe still being written: kept
    _get(store, _source(DATA))
    assert _temps(store) == [fresh]


def test_another_hosts_temporary_file_is_taken_only_once_it_is_stale(store):
    theirs = _leftover(store, DATA[:2000], host="other-host", pid=1)
    log: list[int] = []
    _get(store, _source(DATA, log))
    assert log == [0] and theirs.exists()  # it may still be writing (a network filesystem)
    store.remove(SHA)
    old = time.time() - dl.STALE_S - 60
    os.utime(theirs, (old, old))
    log.clear()
    _get(store, _source(DATA, log))
    assert log == [2000] and not theirs.exists()


def test_concurrent_downloads_write_their_own_temporary_files_stand_in_no_flock(store, monkeypatch):
    """Two downloads of one file in flight at once (the second starts inside the first's
    transfer), where downloads cannot take turns (a stand-in for a file system whose flock does
    not hold: `_one_download` lets everyone through): each writes its own temporary file, and
    both end with the verified file."""
    monkeypatch.setattr(dl, "_one_download", lambda tmp_dir, stem: contextlib.nullcontext())
    names: list[set[str]] = []

    def nested(offset):
        yield DATA[:1000]
        names.append({p.name for p in _temps(store)})
        _get(store, _source(DATA))  # the other download, start to finish
        yield DATA[1000:]
    _get(store, Source("outer", nested))
    assert len(names) == 1 and len(names[0]) == 1  # the outer download's file, not taken by the inner one
    assert store.path(SHA).read_bytes() == DATA and _temps(store) == []


def test_a_full_disk_gives_the_space_back(tmp_path, tmpfs):
    small = tmpfs("64k")
    big = os.urandom(256 * 1024)
    with pytest.raises(OSError) as e:
        download([_source(big)], small / "file", sha256=hashlib.sha256(big).hexdigest(), size=len(big), what="x")
    assert e.value.errno == 28
    assert list(small.iterdir()) == []


# ---- error classes -------------------------------------------------------------------------
def test_error_classes_say_why(store):
    denied, unreachable = AccessDenied("401", hint="set the token"), SourceUnreachable("refused", hint="network")
    with pytest.raises(AccessDenied, match="401") as e:
        _get(store, _refusing(denied))
    assert e.value.hint == "set the token"
    with pytest.raises(AccessDenied) as e:  # every mirror refuses: the first refusal is reported
        _get(store, _refusing(denied), _refusing(AccessDenied("403", hint="other")))
    assert (e.value.message, e.value.hint) == ("401", "set the token")
    with pytest.raises(AccessDenied):  # refused somewhere, unreachable elsewhere: the refusal is the news
        _get(store, _refusing(unreachable), _refusing(denied))
    with pytest.raises(SourceUnreachable) as e:  # every source unreachable: the last one's error
        _get(store, _refusing(unreachable), _refusing(SourceUnreachable("down", hint="retry later")))
    assert type(e.value) is SourceUnreachable and e.value.message == "down" and e.value.hint == "retry later"
    with pytest.raises(SourceUnreachable):  # missing on one, unreachable on the other: it may be there
        _get(store, _refusing(FileNotFoundError("x")), _refusing(unreachable))
    with pytest.raises(NotFound, match="not found on a"):
        _get(store, _refusing(FileNotFoundError("x")))
    with pytest.raises(NotFound, match="not found on any source"):
        _get(store, _refusing(FileNotFoundError("x")), _refusing(NotFound("gone"), label="b"))
    with pytest.raises(StorageError, match="could not be downloaded") as e:  # denied + plain storage error
        _get(store, _refusing(denied), _refusing(StorageError("disk")))
    assert type(e.value) is StorageError and "401" in e.value.message and "disk" in e.value.message
    with pytest.raises(StorageError, match="no source") as e:
        _get(store)
    assert type(e.value) is StorageError
    with pytest.raises(IntegrityError, match="checksum mismatch"):  # bad bytes anywhere outrank the rest
        _get(store, _refusing(unreachable), _source(DATA[::-1]), _refusing(denied))
    assert _temps(store) == []


def test_transport_errors_are_sorted_by_their_causes():
    class ClientPayloadError(Exception):  # aiohttp's name for a body cut off mid-way
        pass

    class Resp:
        status_code = 403
    refused = Exception("boom")
    refused.response = Resp()
    assert dl.is_connection_error(ClientPayloadError("cut"))
    assert dl.is_connection_error(RuntimeError("wrapped").with_traceback(None)) is False
    wrapped = RuntimeError("outer")
    wrapped.__cause__ = ConnectionResetError()
    assert dl.is_connection_error(wrapped)
    assert dl.refusal_reason(refused) == "HTTP 403 (forbidden)"
    assert dl.refusal_reason(ValueError("x")) is None


# ---- prefetch -----------------------------------------------------------------------------
def test_prefetch_yields_every_chunk_in_order_and_closes_a_stream_left_early():
    closed = []

    def chunks():
        try:
            yield from (bytes([i]) for i in range(10))
        finally:
            closed.append(True)
    assert list(dl._prefetch(chunks())) == [bytes([i]) for i in range(10)]
    assert closed == [True]
    closed.clear()
    it = dl._prefetch(chunks())
    assert next(it) == b"\x00"
    it.close()  # the consumer stops early (too many bytes): the producer's stream is closed
    assert closed == [True]


def test_prefetch_closes_a_stream_that_is_not_a_generator():
    """An HTTP response: iterable, with close(), and still referenced by its owner (so nothing
    but an explicit close releases it)."""
    class Response:
        def __init__(self):
            self.chunks, self.closed = [b"a", b"b"], 0

        def __iter__(self):
            return self

        def __next__(self):
            if not self.chunks:
                raise StopIteration
            return self.chunks.pop(0)

        def close(self):
            self.closed += 1
    r = Response()
    assert list(dl._prefetch(r)) == [b"a", b"b"]
    assert r.closed == 1
    assert list(dl._prefetch([b"x"])) == [b"x"]  # a list iterator has no close(): fine


def test_prefetch_hands_the_producers_exception_to_the_consumer():
    def chunks():
        yield b"a"
        raise SourceUnreachable("reset")
    it = dl._prefetch(chunks())
    assert next(it) == b"a"
    with pytest.raises(SourceUnreachable, match="reset"):
        next(it)


def test_the_downloader_and_the_remotes_import_no_transport_library():
    """fsspec, aiohttp and huggingface_hub load only when something is downloaded (zoo --help,
    validate, plan and a cached run import these modules)."""
    code = ("import sys, zoo.download, zoo.sources, zoo.registry.remote, zoo.registry.fsremote, zoo.registry.hf, "
            "zoo.storage.fsbackend, zoo.registry.pull, zoo.registry.api; "
            "print(sorted(m for m in ('fsspec', 'aiohttp', 'huggingface_hub', 's3fs', 'webdav4') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
