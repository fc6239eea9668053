"""`zoo site build`: write the static site of a zoo (local, or a remote one) into a folder.

The site is written into a fresh folder beside the target and swapped in at the end, so a folder
being served never holds half of one site and half of another; a folder that is not a site
(non-empty, no site.json) is refused rather than overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.site.data import SITE_FILE

if TYPE_CHECKING:
    from zoo.registry.store import LocalZoo

ASSETS = ("site.css", "catalog.js", "favicon.svg")


def build_site(out: Path, *, remote: str | None = None, zoo: "LocalZoo | None" = None) -> dict:
    """Build the site of the local zoo (or of `remote`, a `zoo remote` name) into `out`.

    Returns {"out", "source", "models", "versions", "builds", "files", "bytes"}; InvalidInput when
    `out` is a file, or a non-empty folder that holds no site.
    """
    from zoo.registry.store import LocalZoo
    from zoo.site import render
    from zoo.site.data import collect
    from zoo.site.sources import ZooSource

    out = Path(out)
    _check_target(out)
    zoo = zoo or LocalZoo()
    with ZooSource(zoo, remote) as source:
        collected = collect(source)
    doc = collected.doc
    contents: dict[str, bytes] = dict(collected.files)
    contents["index.html"] = render.index_page(doc).encode()
    for model in doc["models"]:
        for v in model["versions"]:
            contents[v["page"]] = render.version_page(doc, model, v, collected.files).encode()
    for name in ASSETS:
        contents[f"assets/{name}"] = resources.files("zoo.site").joinpath("assets", name).read_bytes()
    contents[SITE_FILE] = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    _write_swapped(out, contents)
    versions = [v for m in doc["models"] for v in m["versions"]]
    return {"out": str(out), "source": source.label, "models": len(doc["models"]), "versions": len(versions),
            "builds": sum(len(v["builds"]) for v in versions), "files": len(contents),
            "bytes": sum(len(b) for b in contents.values())}


def _check_target(out: Path) -> None:
    from zoo.errors import InvalidInput

    if out.exists() and not out.is_dir():
        raise InvalidInput(f"{out} is a file, not a folder", hint="give -o a folder for the site")
    if out.is_dir() and any(out.iterdir()) and not (out / SITE_FILE).is_file():
        raise InvalidInput(f"{out} is not empty and holds no site ({SITE_FILE} is missing)",
                           hint="give -o a new or empty folder, or one an earlier `zoo site build` wrote")


def _write_swapped(out: Path, contents: dict[str, bytes]) -> None:
    """Write `contents` (site path -> bytes) into a new folder beside `out`, then put it in `out`'s place."""
    from zoo.pathsafety import safe_join

    out = out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fresh = out.parent / f".{out.name}.zoo-site-{tag}"
    old = out.parent / f".{out.name}.zoo-site-old-{tag}"
    fresh.mkdir()
    try:
        for rel, data in sorted(contents.items()):
            path = safe_join(fresh, rel, what="site path")  # manifest paths are untrusted: stay inside
            path.parent.mkdir(parents=True, exist_ok=True)
            # plain writes: the folder becomes visible only by the rename below, and a lost site is rebuilt
            path.write_bytes(data)
        if out.exists():
            out.rename(old)
        fresh.rename(out)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        if old.exists() and not out.exists():
            old.rename(out)
        raise
    shutil.rmtree(old, ignore_errors=True)
