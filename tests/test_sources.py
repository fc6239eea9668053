"""Upstream sources: download against a real local HTTP server, verify, cache, resume, fail fast."""

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

from zoo import sources
from zoo.errors import IntegrityError, InvalidInput, SourceUnreachable

PAYLOAD = random.Random(0).randbytes(3 * 1024 * 1024 + 123)  # fixed bytes: no flaky digests
DIGEST = hashlib.sha256(PAYLOAD).hexdigest()


class _Server:
    """An HTTP server on 127.0.0.1 serving in-memory files, with Range support and a request log."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.cut_after: int | None = None  # send only this many bytes of the next response body
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                outer.requests.append((self.path, rng))
                body = outer.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and rng.startswith("bytes=") and rng.endswith("-"):
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
    server.stop()  # the second fetch must not need the network
    again = sources.fetch(server.url("w.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert again == path
    assert len(server.requests) == 1


def test_default_cache_dir_is_the_run_cache(server, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "runcache"))
    server.files["/w.bin"] = PAYLOAD
    path = sources.fetch(server.url("w.bin"), sha256="SHA256:" + DIGEST.upper())
    assert path == (tmp_path / "runcache" / "sources" / "sha256" / DIGEST).resolve()
    assert sources.cached(DIGEST[:10]) == path


def test_wrong_sha256_leaves_nothing(server, tmp_path):
    server.files["/w.bin"] = PAYLOAD
    wrong = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(IntegrityError, match="sha256 mismatch") as err:
        sources.fetch(server.url("w.bin"), sha256=wrong, cache_dir=tmp_path / "cache")
    assert DIGEST in str(err.value) and wrong in str(err.value)
    store = _store(tmp_path)
    assert list(store.iterdir()) == []
    assert [p for p in (store.parent / "tmp").iterdir() if not p.name.endswith(".lock")] == []


def test_unreachable_fails_fast(tmp_path, monkeypatch):
    """Fails fast by decision, not by a stopwatch: one connection attempt, bounded by the
    configured connect timeout, then SourceUnreachable (no retry loop)."""
    import urllib.request

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens on this port now
    url = f"http://127.0.0.1:{port}/alexnet.pth"
    calls = []
    real_urlopen = urllib.request.urlopen

    def urlopen(request, *args, **kwargs):
        calls.append((request.full_url, kwargs.get("timeout", args[1] if len(args) > 1 else None)))
        return real_urlopen(request, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    with pytest.raises(SourceUnreachable) as err:
        sources.fetch(url, sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert calls == [(url, sources.CONNECT_TIMEOUT)]
    assert url in str(err.value)
    assert "pre-seed" in err.value.hint


def test_the_connect_timeout_is_configurable():
    code = "from zoo import sources; print(sources.CONNECT_TIMEOUT)"
    for env, want in (({}, "10.0"), ({"ZOO_HTTP_TIMEOUT": "2.5"}, "2.5")):
        full = {k: v for k, v in os.environ.items() if k != "ZOO_HTTP_TIMEOUT"} | env
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, check=True)
        assert out.stdout.strip() == want


def test_http_error_is_reported(server, tmp_path):
    with pytest.raises(SourceUnreachable, match="HTTP 404"):
        sources.fetch(server.url("missing.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")


def test_torchvision_style_hash_prefix_in_the_name(server, tmp_path):
    name = f"alexnet-owt-{DIGEST[:8]}.pth"
    server.files["/" + name] = PAYLOAD
    path = sources.fetch(server.url(name), sha256=None, cache_dir=tmp_path / "cache")
    assert path.read_bytes() == PAYLOAD and path.name == DIGEST
    server.stop()  # a prefix finds the cached file too
    assert sources.fetch(server.url(name), sha256=None, cache_dir=tmp_path / "cache") == path


def test_wrong_hash_prefix_in_the_name(server, tmp_path):
    name = "alexnet-owt-00000000.pth"
    server.files["/" + name] = PAYLOAD
    with pytest.raises(IntegrityError):
        sources.fetch(server.url(name), sha256=None, cache_dir=tmp_path / "cache")
    assert list(_store(tmp_path).iterdir()) == []


def test_remote_source_without_any_digest_is_refused(server, tmp_path):
    with pytest.raises(InvalidInput, match="needs a sha256"):
        sources.fetch(server.url("weights.pth"), sha256=None, cache_dir=tmp_path / "cache")
    with pytest.raises(InvalidInput, match="not a hex digest"):
        sources.fetch(server.url("weights.pth"), sha256="abc", cache_dir=tmp_path / "cache")
    assert server.requests == []


def test_interrupted_download_resumes_with_range(server, tmp_path):
    server.files["/big.bin"] = PAYLOAD
    server.cut_after = 1_000_000
    with pytest.raises(SourceUnreachable):
        sources.fetch(server.url("big.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    parts = list((_store(tmp_path).parent / "tmp").glob("*.part"))
    assert len(parts) == 1 and parts[0].stat().st_size == 1_000_000
    path = sources.fetch(server.url("big.bin"), sha256=DIGEST, cache_dir=tmp_path / "cache")
    assert path.read_bytes() == PAYLOAD
    assert server.requests[-1] == ("/big.bin", "bytes=1000000-")
    assert not parts[0].exists()


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
    with pytest.raises(SourceUnreachable, match="hf://org/other/w.bin"):
        # a digest not in the cache, so the (offline) hub is really asked
        sources.fetch("hf://org/other/w.bin", sha256=hashlib.sha256(b"other").hexdigest(), cache_dir=tmp_path / "cache")
