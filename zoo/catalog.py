"""Pretrained weights by name: ``torchvision:resnet18`` → the catalog's pinned file and arch.

A catalog is a JSON file named after its prefix (``torchvision.json``), found first in the
folders of ``ZOO_CATALOG_PATH`` (``os.pathsep``-separated: a team's own catalog, or one whose URLs
point at an internal mirror of the weights), then in zoo's own `zoo/catalogs/`. It holds
a ``schema_version``, catalog-wide ``license``, ``attribution`` and ``preprocessing``, and
one entry per model: ``arch``, ``num_classes``, ``url`` (download.pytorch.org), the file's full
``sha256`` and ``bytes`` (where each digest came from is recorded in the file). `resolve` turns a
name into the fields of export's ``weights:`` (``url, sha256, license, attribution``) plus the
``arch``, ``num_classes`` and ``preprocessing`` the weights need. export resolves the name while
its config is validated, so the pinned URL and digest (not the name) enter its cache key.

Only json is imported: `zoo validate` and `zoo plan` resolve names without torch.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from zoo.errors import InvalidInput

CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"
PATH_ENV = "ZOO_CATALOG_PATH"
SCHEMA_VERSION = 1
NAME_RE = re.compile(r"^([a-z][a-z0-9_-]*):([A-Za-z0-9_.-]+)$")


def resolve(name: str) -> dict[str, Any]:
    """``{url, sha256, license, attribution, arch, num_classes, preprocessing, catalog}`` of a
    catalog name such as ``torchvision:resnet18``; InvalidInput names the known ones otherwise."""
    match = NAME_RE.fullmatch(name.strip())
    if not match:
        raise InvalidInput(f"{name!r} is not a catalog name", hint="write PREFIX:MODEL, e.g. torchvision:resnet18")
    prefix, model = match.groups()
    catalog = load(prefix)
    entry = catalog["models"].get(model)
    if entry is None:
        known = sorted(catalog["models"])
        close = difflib.get_close_matches(model, known, n=1)
        raise InvalidInput(f"the {prefix} catalog has no model {model!r}" + (f" — did you mean {close[0]!r}?" if close else ""),
                           hint=f"{prefix} models: {', '.join(known)}")
    return {"url": entry["url"], "sha256": entry["sha256"], "license": entry.get("license", catalog["license"]),
            "attribution": entry.get("attribution", catalog["attribution"]), "arch": entry["arch"],
            "num_classes": int(entry["num_classes"]), "preprocessing": dict(catalog.get("preprocessing") or {}),
            "catalog": f"{prefix}:{model}"}


def is_catalog_name(text: str) -> bool:
    """Whether `text` is ``PREFIX:MODEL`` with a catalog called PREFIX (the model need not exist)."""
    match = NAME_RE.fullmatch(text.strip())
    return bool(match) and _find(match.group(1)) is not None


def names_for(model: str) -> list[str]:
    """The catalog names (``PREFIX:MODEL``) of a model called `model` (``mobilenet-v3-small`` finds
    ``torchvision:mobilenet_v3_small``), for hints; catalogs that do not load are passed over."""
    wanted = {model, model.replace("-", "_")}
    found = []
    for prefix in known():
        try:
            models = load(prefix)["models"]
        except InvalidInput:
            continue
        found += [f"{prefix}:{m}" for m in models if m in wanted]
    return found


def search_path() -> list[Path]:
    """The folders searched for ``<prefix>.json``, first match wins: ``ZOO_CATALOG_PATH``'s, then zoo's own."""
    extra = [Path(p).expanduser() for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p.strip()]
    return [*extra, CATALOG_DIR]


def known() -> list[str]:
    """The catalog prefixes on the search path."""
    return sorted({p.stem for folder in search_path() if folder.is_dir() for p in folder.glob("*.json")})


def load(prefix: str, directory: Path | None = None) -> dict[str, Any]:
    """The catalog file ``<prefix>.json`` in `directory`, or else the first on `search_path`, checked."""
    folder = directory or _find(prefix)
    if folder is None or not (Path(folder) / f"{prefix}.json").is_file():
        raise InvalidInput(f"no weights catalog called {prefix!r}",
                           hint=f"catalogs: {', '.join(known()) or 'none'} (more folders: {PATH_ENV})")
    return _load(prefix, str(folder))


def _find(prefix: str) -> Path | None:
    return next((folder for folder in search_path() if (folder / f"{prefix}.json").is_file()), None)


@lru_cache(maxsize=None)
def _load(prefix: str, directory: str) -> dict[str, Any]:
    path = Path(directory) / f"{prefix}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise InvalidInput(f"{path}: not a readable catalog ({e})", hint="fix or remove the file") from None
    if data.get("schema_version") != SCHEMA_VERSION:
        raise InvalidInput(f"{path} has schema_version {data.get('schema_version')!r}; this zoo reads {SCHEMA_VERSION}",
                           hint="upgrade zoo-onnx")
    for model, entry in data["models"].items():
        if not re.fullmatch(r"[0-9a-f]{64}", entry.get("sha256", "")):
            raise InvalidInput(f"{path}: {model} lacks the full sha256 of its file")
    return data
