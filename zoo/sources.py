"""Upstream files (pretrained weights, existing ONNX models), fetched once and cached by digest.

A source is one of:

- ``https://host/path/file`` or ``http://...``: downloaded by `zoo.download` (resumed with
  ranged requests after an interruption, hashed while it streams), then renamed into
  ``<cache>/sources/sha256/<digest>``. Later fetches find it there with a stat, without
  touching the network;
- ``hf://org/repo[@revision]/path/in/repo``: a file already in huggingface_hub's cache is used
  from there; otherwise it is downloaded the same way from the Hub (``HF_ENDPOINT``,
  ``HF_TOKEN``; ``HF_HUB_OFFLINE`` forbids it), then checked and cached;
- anything else: a local path (relative to `base_dir`), checked against sha256 when given.

Remote sources must be pinned by the file's full sha256 (64 hex digits, as the recipe schema
requires: a prefix only guards against accidents). A mismatch raises `IntegrityError` and
leaves nothing in the cache; an unreachable server `SourceUnreachable`, a missing file
`NotFound`, a refusal (HTTP 401/403) `AccessDenied`.

Without network access, pre-seed the cache with ``python -m zoo.sources add FILE...``, which
copies files into the cache under their sha256.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from zoo.errors import IntegrityError, InvalidInput, SourceUnreachable

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def fetch(source: str, *, sha256: str | None, cache_dir: Path | None = None, base_dir: Path | None = None) -> Path:
    """The local path of `source` after checking its sha256 (see the module docstring)."""
    source = str(source).strip()
    if source.startswith(("http://", "https://", "hf://")):
        return _fetch_remote(source, _expected(source, sha256), _store(cache_dir))
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
        _check(source_sha256(path), expected, source)
    return path


def cached(sha256: str, cache_dir: Path | None = None) -> Path | None:
    """The cached file with this (full) digest, or None."""
    return _lookup(_store(cache_dir), _normalise(sha256))


def add(path: Path, cache_dir: Path | None = None) -> Path:
    """Copy a local file into the source cache under its sha256 (to pre-seed offline machines)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInput(f"{path} is not a file")
    store = _store(cache_dir)
    digest = source_sha256(path)
    target = store / digest
    if not target.exists():
        tmp = _tmp_dir(store) / f"add-{digest}.{os.getpid()}"
        shutil.copyfile(path, tmp)
        _install(tmp, target)
    return target


# (device, inode, size, mtime_ns) -> sha256: a stage checks a weights file, then records its
# digest in provenance and metrics; hashing 233 MB three times cost 0.45 s.
_SHA256_MEMO: dict[tuple[int, int, int, int], str] = {}


def source_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes (`zoo.files.sha256_file`), remembered per process while its stat
    is unchanged: a recipe names the same local source in several stages and runs."""
    from zoo.files import sha256_file

    st = os.stat(path)
    memo_key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if memo_key not in _SHA256_MEMO:
        if len(_SHA256_MEMO) > 256:
            _SHA256_MEMO.clear()
        _SHA256_MEMO[memo_key] = sha256_file(path)
    return _SHA256_MEMO[memo_key]


# ---------------------------------------------------------------------------------------------
# digests and the store


def _normalise(sha256: str) -> str:
    value = str(sha256).strip().lower().removeprefix("sha256:")
    if not _DIGEST.fullmatch(value):
        raise InvalidInput(f"sha256 {sha256!r} is not a full sha256 digest",
                           hint="give the 64 hex digits printed by `sha256sum FILE` (on a copy you trust)")
    return value


def _expected(source: str, sha256: str | None) -> str:
    """The digest a remote source must have: a download is only as trustworthy as its pin."""
    if not sha256:
        raise InvalidInput(f"remote source {source!r} needs a sha256",
                           hint="add `sha256: <64 hex digits>` (run `sha256sum FILE` on a trusted copy)")
    return _normalise(sha256)


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
    p = store / expected
    return p if p.is_file() else None


def _check(actual: str, expected: str, source: str) -> None:
    if actual != expected:
        raise IntegrityError(f"{source}: checksum mismatch (expected sha256 {expected}, got sha256 {actual})",
                             hint="the file changed upstream or was corrupted; check the source and the recorded sha256")


def _install(tmp: Path, target: Path) -> None:
    """Move a verified temp file into the store, read-only (cached files are never edited)."""
    os.chmod(tmp, 0o444)
    os.replace(tmp, target)


# ---------------------------------------------------------------------------------------------
# remote sources: http(s) and the Hugging Face Hub


_OFFLINE_HINT = ("pre-seed the cache with `python -m zoo.sources add FILE` (a copy fetched elsewhere), "
                 "or point the recipe at a local path")


def _fetch_remote(source: str, expected: str, store: Path) -> Path:
    """Download `source` into the store under `expected` (nothing to do when it is there)."""
    hit = _lookup(store, expected)
    if hit is not None:
        return hit
    from zoo.download import download, hf_source, http_source

    if source.startswith("hf://"):
        repo_id, revision, filename = parse_hf(source)
        local = _hub_cache(repo_id, filename, revision)
        if local is not None:
            return _copy_in(local, expected, store, source)
        src = hf_source(repo_id, filename, revision=revision, label=source)
    else:
        src = http_source(source)
    try:
        return download([src], store / expected, sha256=expected, size=None, what=source, tmp_dir=_tmp_dir(store))
    except SourceUnreachable as e:
        raise SourceUnreachable(e.message, hint=f"no network? {_OFFLINE_HINT}; otherwise run again: "
                                                "a partial download resumes") from e


def parse_hf(source: str) -> tuple[str, str | None, str]:
    """``hf://org/repo[@rev]/path`` -> (repo_id, revision or None, path in the repo)."""
    rest = source[len("hf://"):]
    parts = rest.split("/", 2)
    if len(parts) < 3 or not all(parts):
        raise InvalidInput(f"{source!r} must look like hf://org/repo[@revision]/path/in/repo")
    org, repo, filename = parts
    repo, _, rev = repo.partition("@")
    return f"{org}/{repo}", rev or None, filename


def _hub_cache(repo_id: str, filename: str, revision: str | None) -> Path | None:
    """The file in huggingface_hub's own cache (``HF_HUB_CACHE``), if a download put it there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename, revision=revision)
    return Path(found) if isinstance(found, str) else None


def _copy_in(local: Path, expected: str, store: Path, source: str) -> Path:
    """Copy a verified file into the store (the Hub cache's copy stays where it is)."""
    tmp = _tmp_dir(store) / f"copy-{expected}.{os.getpid()}"
    try:
        shutil.copyfile(local, tmp)
        _check(source_sha256(tmp), expected, source)
        _install(tmp, store / expected)
    finally:
        tmp.unlink(missing_ok=True)
    return store / expected


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
