"""Upstream sources: download against a real local HTTP server, verify, cache, resume, fail fast.
The downloader's own invariants (temporary files, retries, error precedence) are in test_download.py."""

from __future__ import annotations

import hashlib
import os
import random
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from zoo import download, sources
from zoo.errors import AccessDenied, IntegrityError, InvalidInput, NotFound, SourceUnreachable

PAYLOAD = random.Random(0).randbytes(3 * 1024 * 1024 + 123)  # fixed bytes: no flaky digests
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


class _Server:
    """An HTTP server on 127.0.0.1 serving in-memory files, with Range support and a request log."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.cut_after: int | None = None  # send only this many bytes of the next response body
        self.status: dict[str, int] = {}
        self.ignore_range = False  # answer every GET with the whole file (200), as some servers do  # path -> error status to answer instead of the file
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                outer.requests.append((self.path, rng))
                if self.path in outer.status:
                    self.send_error(outer.status[self.path])
                    return
                body = outer.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and rng.startswith("bytes=") and rng.endswith("-") and not outer.ignore_range:
                    start = int(rng[len("bytes="):-1])
                    if start >= len(body):
                        self.send_response(416)
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                part = body[start:]
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                if outer.cut_after is not None:
                    self.wfile.write(part[:outer.cut_after])
                    outer.cut_after = None
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(part)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = _Server()
    yield s
    s.stop()


def _store(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "sources" / "sha256"


def test_download_verify_and_cache(server, tmp_path):
    server.files["/w.bin"] = PAYLOAD
    path = sources.fetch(server.url("w.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert path == _store(tmp_path) / DIGEST
    assert path.read_bytes() == PAYLOAD
    assert oct(path.stat().st_mode & 0o777) == oct(0o444)
    assert server.requests == [("/w.bin", None)]  # one request: no HEAD, no ranges
    server.stop()  # the second fetch must not need the network
    again = sources.fetch(server.url("w.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert again == path
    assert len(server.requests) == 1
    assert list((_store(tmp_path).parent / "tmp").iterdir()) == []


def test_default_cache_dir_is_the_run_cache(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "runcache"))
    server.files["/w.bin"] = PAYLOAD
    path = sources.fetch(server.url("w.bin"), sha256="SHA256:" + DIGEST.upper())
    assert path == (tmp_path / "runcache" / "sources" / "sha256" / DIGEST).resolve()
    assert sources.cached(DIGEST) == path


def test_wrong_sha256_leaves_nothing(server, tmp_path):
    server.files["/w.bin"] = PAYLOAD
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(IntegrityError, match="checksum mismatch") as err:
        sources.fetch(server.url("w.bin"), sha256=wrong, cache_dir=tmp_path / "cache")
    assert DIGEST in str(err.value) and wrong in str(err.value)
    store = _store(tmp_path)
    assert list(store.iterdir()) == []
    assert list((store.parent / "tmp").iterdir()) == []


def test_unreachable_fails_fast(tmp_path):
    """Fails fast by decision, not by a stopwatch: one request, then SourceUnreachable (no retry
    loop while nothing arrives). The server answers every connection with headers and then hangs up."""
    accepted = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
            conn.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{port}/alexnet.pth"
    try:
        with pytest.raises(SourceUnreachable) as err:
            sources.fetch(url, sha256=DIGEST, cache_dir=tmp_path / "cache")
    finally:
        listener.close()
    assert accepted == [1]
    assert url in str(err.value)
    assert "pre-seed" in err.value.hint
    assert list((_store(tmp_path).parent / "tmp").iterdir()) == []  # nothing received: nothing kept


def test_nothing_listening_is_unreachable(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this port now
    with pytest.raises(SourceUnreachable, match=f"127.0.0.1:{port}"):
        sources.fetch(f"http://127.0.0.1:{port}/w.bin", sha256=DIGEST, cache_dir=tmp_path / "cache")


def test_the_http_timeout_is_configurable_and_used():
    code = ("from zoo import download; fs = download._http_fs(None); t = fs.client_kwargs['timeout']; "
            "print(download.HTTP_TIMEOUT, t.connect, t.sock_read)")
    for env, want in (({}, "10.0 10.0 10.0"), ({"ZOO_HTTP_TIMEOUT": "2.5"}, "2.5 2.5 2.5")):
        full = {k: v for k, v in os.environ.items() if k != "ZOO_HTTP_TIMEOUT"} | env
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, check=True)
        assert out.stdout.strip() == want


@pytest.mark.parametrize(("status", "error"), [(404, NotFound), (410, NotFound), (403, AccessDenied),
                                               (401, AccessDenied), (503, SourceUnreachable)])
def test_http_errors_keep_their_classes(server, tmp_path, status, error):
    server.status["/w.bin"] = status
    with pytest.raises(error) as e:
        sources.fetch(server.url("w.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert type(e.value) is error
    assert list((_store(tmp_path).parent / "tmp").iterdir()) == []


def test_a_remote_source_needs_the_full_sha256(server, tmp_path):
    """The API agrees with the recipe schema: no digest prefixes, no digests taken from file names."""
    name = f"alexnet-owt-{DIGEST[:8]}.pth"
    server.files["/" + name] = PAYLOAD
    with pytest.raises(InvalidInput, match="needs a sha256"):
        sources.fetch(server.url(name), sha256=None, cache_dir=tmp_path / "cache")
    for short in ("abc", DIGEST[:8], DIGEST[:63], DIGEST + "0"):
        with pytest.raises(InvalidInput, match="not a full sha256"):
            sources.fetch(server.url(name), sha256=short, cache_dir=tmp_path / "cache")
    with pytest.raises(InvalidInput, match="not a full sha256"):
        sources.cached(DIGEST[:10])
    assert server.requests == []


def test_interrupted_download_resumes_with_range(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    server.cut_after = 1_000_000
    path = sources.fetch(server.url("big.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert path.read_bytes() == PAYLOAD
    assert [rng for _, rng in server.requests] == [None, f"bytes={_resumed_at(server)}-"]
    assert 0 < _resumed_at(server) <= 1_000_000  # what arrived before the break (the client may drop a last buffer)
    assert list((_store(tmp_path).parent / "tmp").iterdir()) == []


def _resumed_at(server) -> int:
    return int(server.requests[-1][1][len("bytes="):-1])


def test_an_interrupted_download_is_resumed_by_the_next_run(server, tmp_path, monkeypatch):
    server.files["/big.bin"] = PAYLOAD
    monkeypatch.setattr(download, "RETRIES", 0)  # this run gives up at the first break
    server.cut_after = 1_000_000
    with pytest.raises(SourceUnreachable):
        sources.fetch(server.url("big.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    [kept] = (_store(tmp_path).parent / "tmp").glob("*.incomplete")
    held = kept.stat().st_size
    assert 0 < held <= 1_000_000
    path = sources.fetch(server.url("big.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert path.read_bytes() == PAYLOAD
    assert server.requests[-1] == ("/big.bin", f"bytes={held}-")
    assert not kept.exists()


def test_a_server_ignoring_range_is_read_from_the_start_with_what_we_hold_skipped(server, tmp_path, monkeypatch):
    server.files["/big.bin"] = PAYLOAD
    server.ignore_range = True
    server.cut_after = 1_000_000
    path = sources.fetch(server.url("big.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert path.read_bytes() == PAYLOAD
    assert [rng for _, rng in server.requests] == [None, f"bytes={_resumed_at(server)}-"]  # answered with 200


def test_local_paths(tmp_path):
    (tmp_path / "w.bin").write_bytes(PAYLOAD)
    assert sources.fetch("w.bin", sha256=DIGEST, base_dir=tmp_path) == tmp_path / "w.bin"
    assert sources.fetch(str(tmp_path / "w.bin"), sha256=None) == tmp_path / "w.bin"
    with pytest.raises(IntegrityError):
        sources.fetch("w.bin", sha256="0" * 64, base_dir=tmp_path)
    with pytest.raises(InvalidInput, match="does not exist"):
        sources.fetch("nope.bin", sha256=None, base_dir=tmp_path)
    with pytest.raises(InvalidInput, match="unsupported source scheme"):
        sources.fetch("ftp://example.org/w.bin", sha256=DIGEST)


def test_preseeded_cache_serves_offline(tmp_path):
    (tmp_path / "w.bin").write_bytes(PAYLOAD)
    assert sources.main(["add", str(tmp_path / "w.bin")]) == 0
    # no server at all: the URL is never contacted because the digest is already cached
    path = sources.fetch("http://127.0.0.1:9/alexnet-owt-xyz.pth", sha256=DIGEST)
    assert path.read_bytes() == PAYLOAD


def test_parse_hf():
    assert sources.parse_hf("hf://org/repo/w.bin") == ("org/repo", None, "w.bin")
    assert sources.parse_hf("hf://org/repo@v1.0/sub/w.bin") == ("org/repo", "v1.0", "sub/w.bin")
    with pytest.raises(InvalidInput):
        sources.parse_hf("hf://org/w.bin")


def test_hf_source_through_the_hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hub / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit / "sub").mkdir(parents=True)
    (repo / "snapshots" / commit / "sub" / "w.bin").write_bytes(PAYLOAD)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    path = sources.fetch("hf://org/tiny/sub/w.bin", sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert path == _store(tmp_path) / DIGEST and path.read_bytes() == PAYLOAD
    with pytest.raises(IntegrityError):
        sources.fetch("hf://org/tiny/sub/w.bin", sha256="1" * 64, cache_dir=tmp_path / "cache2")
    with pytest.raises(SourceUnreachable, match="hf://org/other/w.bin.*HF_HUB_OFFLINE"):
        # a digest not in the cache, so the (offline) hub is really asked
        sources.fetch("hf://org/other/w.bin", sha256=hashlib.sha256(b"other").hexdigest(), cache_dir=tmp_path / "cache")
