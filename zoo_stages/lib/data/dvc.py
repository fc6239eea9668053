"""``data: {source: dvc, repo, rev, path}``: a file or folder tracked in a DVC repo, at a pinned commit.

Two steps, so that only the second needs dvc (the ``dvc`` extra):

- `pin`: the digest DVC recorded for the path at that commit, read with git alone
  (`zoo.dvcrepo`), written as a small *pin file* under ``<cache>/dvc/pins/``. The pin file is what
  the data section gives the stages' keys (`datasets.data_dependencies`): a new data version at
  another commit reruns them, while plans, validation and cached runs import no dvc and download
  nothing. It holds the path and the digest, not the repo's location or the commit, so the same
  bytes give the same key wherever the repo lives;
- `fetch`: the bytes, read through ``dvc.api.DVCFileSystem`` at the commit (from the repo's
  workspace cache or its DVC remote, with the remote's credentials from the environment, as dvc
  reads them), checked against DVC's per-file md5 and kept once per digest under
  ``<cache>/dvc/data/<md5>/``. The loaders of the format the path is in (`images`, `npz`,
  `tables`) then read that copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from functools import lru_cache
from pathlib import Path, PurePosixPath

from zoo.dvcrepo import DvcOut
from zoo.errors import IntegrityError, MissingExtra, SourceUnreachable
from zoo_stages.lib.data.errors import DataError

DVC_EXTRA = "pip install 'zoo-onnx[dvc]'"
PIN_SCHEMA_VERSION = 1


def pin(spec: dict, recipe_dir: Path) -> DvcOut:
    """The DVC output the section names (InvalidInput when the rev or path is not what it must be)."""
    from zoo import dvcrepo

    for name in ("repo", "rev", "path"):
        if not spec.get(name):
            raise DataError(f"data.{name} is required when data.source is 'dvc'",
                            hint="data: {source: dvc, repo: FOLDER-OR-GIT-URL, rev: FULL-COMMIT-SHA, path: IN/REPO}")
    repo = dvcrepo.repo_location(str(spec["repo"]), Path(recipe_dir))
    return dvcrepo.out_at(repo, str(spec["rev"]), str(spec["path"]), _cache_dir())


def pin_file(out: DvcOut) -> Path:
    """The file whose content stands for the output's bytes in cache keys (written once)."""
    record = {"schema_version": PIN_SCHEMA_VERSION, "path": out.path, "md5": out.md5, "hash": out.hash,
              "size": out.size, "nfiles": out.nfiles}
    data = (json.dumps(record, sort_keys=True, indent=1) + "\n").encode()
    target = _cache_dir() / "dvc" / "pins" / hashlib.sha256(data).hexdigest()[:32] / f"{PurePosixPath(out.path).name}.json"
    if not target.is_file():
        from zoo.files import atomic_write

        atomic_write(target, data, fsync=False)  # a lost pin file is written again
    return target


@lru_cache(maxsize=8)
def fetch(out: DvcOut) -> Path:
    """A local copy of the output's bytes, downloaded once per digest (MissingExtra without dvc)."""
    from zoo.dvcrepo import is_md5

    if not is_md5(out.md5):  # checked where it is read (zoo.dvcrepo); the digest names a folder here
        raise DataError(f"data.path {out.path!r}: {out.recorded_in}: md5 {out.md5[:80]!r} is not a DVC digest",
                        hint="DVC writes only digests there; pin a commit whose file DVC wrote")
    store = _cache_dir() / "dvc" / "data"
    digest = out.md5.removesuffix(".dir")
    target = store / digest / PurePosixPath(out.path).name
    if target.exists():
        return target
    try:
        from dvc.api import DVCFileSystem
    except ImportError:
        raise MissingExtra("data.source: dvc needs dvc to download the data, which is not installed",
                           hint=f"{DVC_EXTRA} (the 'dvc' extra)") from None
    partial = store / f".{digest}.{os.getpid()}.{os.urandom(4).hex()}.partial"
    local = partial / PurePosixPath(out.path).name
    try:
        partial.mkdir(parents=True)
        expected = _download(DVCFileSystem, out, local)
        _verify(out, local, expected)
        try:
            os.rename(partial, store / digest)
        except OSError:
            if not target.exists():  # not a concurrent fetch of the same digest that got there first
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _download(filesystem: type, out: DvcOut, local: Path) -> dict[str, str]:
    """Copy the output to `local`; the md5 DVC records for each file, by path relative to the output."""
    where = f"{out.path} at {out.commit[:12]} of the DVC repo {out.repo}"
    try:
        fs = filesystem(out.repo, rev=out.commit)
        if out.is_dir:
            listing = fs.find(out.path, detail=True)
            expected = {PurePosixPath(name).relative_to(out.path).as_posix(): info.get("md5")
                        for name, info in listing.items()}
            fs.get(out.path, str(local), recursive=True)
        else:
            expected = {"": fs.info(out.path).get("md5")}
            fs.get(out.path, str(local))
    except Exception as e:  # dvc and its fsspec backends raise their own families
        raise SourceUnreachable(f"cannot read {where}: {type(e).__name__}: {e}",
                                hint="check that the DVC remote holds that version (`dvc push` at that commit) and "
                                     "is reachable; its credentials come from the environment, as for dvc") from None
    return expected


def _verify(out: DvcOut, local: Path, expected: dict[str, str]) -> None:
    """IntegrityError unless every file has the md5 DVC recorded (DVC 3 digests; DVC 2 hashed text
    with unix line ends, which is not redone here) and the folder holds exactly the recorded files."""
    if out.hash != "md5":
        return
    got = {"": local} if not out.is_dir else \
        {p.relative_to(local).as_posix(): p for p in sorted(local.rglob("*")) if p.is_file()}
    if set(got) != set(expected):
        raise IntegrityError(f"{out.path} at {out.commit[:12]}: the files read differ from those DVC recorded "
                             f"({len(got)} read, {len(expected)} recorded)", hint="run `dvc status -c` in the repo")
    for name, path in got.items():
        digest = _md5(path)
        if expected[name] and digest != expected[name]:
            raise IntegrityError(f"{out.path}{'/' + name if name else ''} at {out.commit[:12]}: md5 {digest}, "
                                 f"but DVC recorded {expected[name]}",
                                 hint="the DVC remote holds other bytes under that digest; nothing was used")


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _cache_dir() -> Path:
    from zoo.paths import cache_dir

    return cache_dir()
