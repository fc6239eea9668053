"""Upstream files (pretrained weights, existing ONNX models), fetched once and cached by digest.

A source is one of:

- ``https://host/path/file`` or ``http://...``: downloaded to a partial file (resumed with an
  HTTP Range request when a previous attempt was interrupted and the server supports it),
  checked against its sha256, then renamed into ``<cache>/sources/sha256/<digest>``. Later
  fetches find it there with a stat, without touching the network;
- ``hf://org/repo[@revision]/path/in/repo``: fetched with ``huggingface_hub.hf_hub_download``
  (which honours ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and its own cache), then checked and
  cached the same way;
- anything else: a local path (relative to `base_dir`), checked against sha256 when given.

Remote sources must be pinned. ``sha256`` is the full 64-hex digest, or a prefix of at least 8
hex digits (weaker: it only guards against accidents). When no sha256 is given, a
torchvision-style file name carrying the prefix (``alexnet-owt-7be5be79.pth``) is accepted in
its place. A mismatch raises `IntegrityError` and leaves nothing in the cache.

Without network access, pre-seed the cache with ``python -m zoo.sources add FILE...``, which
copies files into the cache under their sha256.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import urllib.parse
from pathlib import Path

from zoo.errors import IntegrityError, InvalidInput, SourceUnreachable

CONNECT_TIMEOUT = float(os.environ.get("ZOO_HTTP_TIMEOUT", "10"))  # seconds; also per read
_CHUNK = 1 << 20
_HEX = re.compile(r"^[0-9a-f]+$")
_NAME_HASH = re.compile(r"-([0-9a-f]{8,64})\.[A-Za-z0-9]+$")  # torchvision's HASH_REGEX, at least 8 digits


def fetch(source: str, *, sha256: str | None, cache_dir: Path | None = None, base_dir: Path | None = None) -> Path:
    """The local path of `source` after checking its sha256 (see the module docstring)."""
    source = str(source).strip()
    if source.startswith(("http://", "https://")):
        return _fetch_http(source, _expected(source, sha256), _store(cache_dir))
    if source.startswith("hf://"):
        return _fetch_hf(source, _expected(source, sha256), _store(cache_dir))
    if "://" in source:
        scheme = source.split("://", 1)[0]
        raise InvalidInput(f"unsupported source scheme {scheme!r} in {source!r}",
                           hint="use https://..., hf://org/repo/path, or a local path")
    path = Path(source).expanduser()
    if not path.is_absolute():
        path = Path(base_dir or Path.cwd()) / path
    if not path.is_file():
        raise InvalidInput(f"source file {source!r} does not exist ({path})",
                           hint="paths are relative to the recipe's folder")
    if sha256:
        expected = _normalise(sha256)
        _check(sha256_file(path), expected, source)
    return path


def cached(sha256: str, cache_dir: Path | None = None) -> Path | None:
    """The cached file with this digest (full, or a unique prefix), or None."""
    return _lookup(_store(cache_dir), _normalise(sha256))


def add(path: Path, cache_dir: Path | None = None) -> Path:
    """Copy a local file into the source cache under its sha256 (to pre-seed offline machines)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"{path} is not a file")
    store = _store(cache_dir)
    digest = sha256_file(path)
    target = store / digest
    if not target.exists():
        tmp = _tmp_dir(store) / f"add-{digest}.{os.getpid()}"
        shutil.copyfile(path, tmp)
        _install(tmp, target)
    return target


# (device, inode, size, mtime_ns) -> sha256: a stage checks a weights file, then records its
# digest in provenance and metrics; hashing 233 MB three times cost 0.45 s.
_SHA256_MEMO: dict[tuple[int, int, int, int], str] = {}


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (remembered per process while the file's stat is unchanged)."""
    st = os.stat(path)
    memo_key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if memo_key in _SHA256_MEMO:
        return _SHA256_MEMO[memo_key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if len(_SHA256_MEMO) > 256:
        _SHA256_MEMO.clear()
    _SHA256_MEMO[memo_key] = digest
    return digest


# ---------------------------------------------------------------------------------------------
# digests and the store


def _normalise(sha256: str) -> str:
    value = str(sha256).strip().lower().removeprefix("sha256:")
    if not _HEX.match(value) or not 8 <= len(value) <= 64:
        raise InvalidInput(f"sha256 {sha256!r} is not a hex digest",
                           hint="give the 64 hex digits printed by `sha256sum FILE` (or at least the first 8)")
    return value


def _expected(source: str, sha256: str | None) -> str:
    """The digest (or prefix) a remote source must have: given, or taken from its file name."""
    if sha256:
        return _normalise(sha256)
    name = urllib.parse.urlparse(source).path.rsplit("/", 1)[-1]
    found = _NAME_HASH.search(name)
    if found:
        return found.group(1)
    raise InvalidInput(f"remote source {source!r} needs a sha256",
                       hint="add `sha256: <64 hex digits>` (run `sha256sum FILE` on a trusted copy)")


def _store(cache_dir: Path | None) -> Path:
    from zoo.paths import cache_dir as default_cache_dir

    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    store = root / "sources" / "sha256"
    store.mkdir(parents=True, exist_ok=True)
    return store


def _tmp_dir(store: Path) -> Path:
    tmp = store.parent / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return tmp


def _lookup(store: Path, expected: str) -> Path | None:
    if len(expected) == 64:
        p = store / expected
        return p if p.is_file() else None
    matches = sorted(store.glob(expected + "*"))
    return matches[0] if len(matches) == 1 else None


def _check(actual: str, expected: str, source: str) -> None:
    if not actual.startswith(expected):
        raise IntegrityError(f"sha256 mismatch for {source}: expected {expected}{'…' if len(expected) < 64 else ''}, got {actual}",
                             hint="the file changed upstream or was corrupted in transit; check the source and the recorded sha256")


def _install(tmp: Path, target: Path) -> None:
    """Move a verified temp file into the store, read-only (cached files are never edited)."""
    os.chmod(tmp, 0o444)
    os.replace(tmp, target)


# ---------------------------------------------------------------------------------------------
# http(s)


def _fetch_http(url: str, expected: str, store: Path) -> Path:
    hit = _lookup(store, expected)
    if hit is not None:
        return hit
    from filelock import FileLock

    part = _tmp_dir(store) / (hashlib.sha256(url.encode()).hexdigest() + ".part")
    # one download per URL at a time: concurrent stages would otherwise share the partial file
    with FileLock(str(part) + ".lock"):
        hit = _lookup(store, expected)
        if hit is not None:
            return hit
        h = hashlib.sha256()
        _download(url, part, h)
        actual = h.hexdigest()
        try:
            _check(actual, expected, url)
        except IntegrityError:
            part.unlink(missing_ok=True)
            raise
        target = store / actual
        _install(part, target)
        return target


def _download(url: str, part: Path, h) -> None:
    """Download `url` into `part`, resuming from its current size; `h` ends up hashing every byte."""
    import http.client
    import urllib.error
    import urllib.request

    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "zoo-onnx", "Accept-Encoding": "identity"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the partial file is already complete (or bogus): start over
            part.unlink(missing_ok=True)
            return _download(url, part, h)
        raise SourceUnreachable(f"cannot download {url}: HTTP {e.code} {e.reason}",
                                hint="check the URL; no network? " + _OFFLINE_HINT) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise SourceUnreachable(f"cannot reach {url}: {reason}", hint="no network? " + _OFFLINE_HINT) from None
    with response:
        resumed = have and response.status == 206
        if resumed:
            with open(part, "rb") as f:
                for chunk in iter(lambda: f.read(_CHUNK), b""):
                    h.update(chunk)
        try:
            with open(part, "ab" if resumed else "wb") as out:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    h.update(chunk)
                    out.write(chunk)
        except (OSError, http.client.HTTPException) as e:  # the partial file stays, so the next attempt resumes
            raise SourceUnreachable(f"download of {url} was interrupted: {e}",
                                    hint="run again to resume; no network? " + _OFFLINE_HINT) from None
        expected_len = response.headers.get("Content-Length")
        got = part.stat().st_size - (have if resumed else 0)
        if expected_len is not None and int(expected_len) != got:
            raise SourceUnreachable(f"download of {url} ended early ({got} of {expected_len} bytes)",
                                    hint="run again to resume")


_OFFLINE_HINT = ("pre-seed the cache with `python -m zoo.sources add FILE` (a copy fetched elsewhere), "
                 "or point the recipe at a local path")


# ---------------------------------------------------------------------------------------------
# Hugging Face Hub


def parse_hf(source: str) -> tuple[str, str | None, str]:
    """``hf://org/repo[@rev]/path`` -> (repo_id, revision or None, path in the repo)."""
    rest = source[len("hf://"):]
    parts = rest.split("/", 2)
    if len(parts) < 3 or not all(parts):
        raise InvalidInput(f"{source!r} must look like hf://org/repo[@revision]/path/in/repo")
    org, repo, filename = parts
    repo, _, rev = repo.partition("@")
    return f"{org}/{repo}", rev or None, filename


def _fetch_hf(source: str, expected: str, store: Path) -> Path:
    hit = _lookup(store, expected)
    if hit is not None:
        return hit
    repo_id, revision, filename = parse_hf(source)
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface-hub is a core dependency
        raise InvalidInput("hf:// sources need huggingface-hub", hint="pip install huggingface-hub") from None
    try:
        local = Path(hf_hub_download(repo_id=repo_id, filename=filename, revision=revision))
    except LocalEntryNotFoundError as e:
        raise SourceUnreachable(f"cannot fetch {source}: {e}",
                                hint="no network or HF_HUB_OFFLINE=1? " + _OFFLINE_HINT) from None
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise SourceUnreachable(f"cannot fetch {source}: {e}",
                                hint="check the repo, revision and path (and HF_ENDPOINT / HF_TOKEN)") from None
    actual = sha256_file(local)
    _check(actual, expected, source)
    target = store / actual
    if not target.exists():
        tmp = _tmp_dir(store) / f"hf-{actual}.{os.getpid()}"
        shutil.copyfile(local, tmp)
        _install(tmp, target)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m zoo.sources add FILE...``: pre-seed the cache (prints digest and path)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2 or args[0] != "add":
        print("usage: python -m zoo.sources add FILE...", file=sys.stderr)
        return 2
    for name in args[1:]:
        target = add(Path(name))
        print(f"{target.name}  {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
