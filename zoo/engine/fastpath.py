"""The no-op fast path: answer `zoo run RECIPE` in a few stats when nothing changed.

After a run in which every stage succeeded, the runner writes a *stamp*: the (inode, size,
mtime) of every file that went into the stage keys (the recipe, its lockfile, each kind's code,
user code and data the kinds named, the site-packages folders whose contents give tool versions),
the cache entries and objects of the run, and the evidence of every effect a stage declared
(`zoo.stage.Effect`: for a version deploy published, its manifest and blobs in the local zoo, with
the variables that locate that zoo). If all of those stat the same (the evidence: still exists),
every key and every hit is the same as last time and every effect still holds, so the run would
execute nothing; the fast path prints the same summary (the effects' lines included) without
importing the CLI framework, pydantic or any kind. Anything else — a changed file, a flag, a
missing object or piece of evidence, another PYTHONPATH — falls through to the full path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

STAMP_SCHEMA_VERSION = 2  # 2: the environment names the local zoo


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _stamp_path(cache_dir: Path, recipe: Path) -> Path:
    name = hashlib.sha256(f"{recipe}\0{cache_dir}".encode()).hexdigest()[:32]
    return cache_dir / "stamps" / f"{name}.json"


def _cache_dir_from_env() -> Path:
    env = os.environ.get("ZOO_CACHE_DIR")
    return Path(env).expanduser().resolve() if env else (Path.cwd() / "cache").resolve()


def _environment() -> dict[str, Any]:
    # the local zoo's location (zoo.paths.zoo_home) follows these variables
    zoo_vars = {name: os.environ.get(name) for name in ("ZOO_HOME", "XDG_DATA_HOME", "HOME")}
    return {"sys_path": list(sys.path), "python": sys.version, "executable": sys.executable, "zoo": zoo_vars}


def _site_dirs() -> list[str]:
    """sys.path folders: installing or removing a package changes their mtime."""
    return [p for p in sys.path if p and os.path.isdir(p)]


def write_stamp(*, recipe_path: Path, cache_dir: Path, lock_path: Path, files: Iterable[Path],
                entries: Iterable[Path], objects: Iterable[Path], summary: dict[str, Any]) -> None:
    """Record the state a fully successful run saw (see module docstring)."""
    from zoo.files import atomic_write

    watched = {str(p) for p in files} | {str(recipe_path), str(lock_path)} | set(_site_dirs())
    stats = {p: _stat(p) for p in sorted(watched)}
    data = {"schema_version": STAMP_SCHEMA_VERSION, "recipe": str(recipe_path), "cache_dir": str(cache_dir),
            "environment": _environment(), "files": stats,
            "present": sorted({str(p) for p in entries} | {str(p) for p in objects}), "summary": summary}
    atomic_write(_stamp_path(cache_dir, recipe_path), json.dumps(data).encode(), fsync=False)


def try_noop(argv: list[str]) -> int | None:
    """Handle `zoo run RECIPE` when the stamp proves nothing changed; None to take the full path."""
    if len(argv) != 2 or argv[0] != "run" or argv[1].startswith("-"):
        return None
    try:
        recipe = Path(argv[1]).resolve()
        cache_dir = _cache_dir_from_env()
        stamp = json.loads(_stamp_path(cache_dir, recipe).read_bytes())
    except (OSError, ValueError):
        return None
    if stamp.get("schema_version") != STAMP_SCHEMA_VERSION or stamp.get("environment") != _environment():
        return None
    for path, recorded in stamp["files"].items():
        if _stat(path) != recorded:
            return None
    if set(_site_dirs()) - set(stamp["files"]):
        return None
    for path in stamp["present"]:
        if not os.path.exists(path):
            return None
    summary = stamp["summary"]
    lines = [f"[zoo] {sid}: cached" for sid in summary["stages"]]
    lines.append(f"{summary['name']}@{summary['version']}: 0 ran, {len(summary['stages'])} cached (0.0s of stage time)")
    lines += summary.get("notes", [])
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
