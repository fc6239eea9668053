"""Pretrained weights by name: ``torchvision:resnet18`` → the catalog's pinned file and arch.

A catalog is a JSON file in `zoo_stages/catalog/` named after its prefix (``torchvision.json``),
with a ``schema_version``, catalog-wide ``license``, ``attribution`` and ``preprocessing``, and
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
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

from zoo.errors import InvalidInput

CATALOG_DIR = Path(__file__).resolve().parents[1] / "catalog"
SCHEMA_VERSION = 1
NAME_RE = re.compile(r"^([a-z][a-z0-9_-]*):([A-Za-z0-9_.-]+)$")


def resolve(name: str) -> dict[str, Any]:
    """``{url, sha256, license, attribution, arch, num_classes, preprocessing, catalog}`` of a
    catalog name such as ``torchvision:resnet18``; InvalidInput names the known ones otherwise."""
    match = NAME_RE.match(name.strip())
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


def load(prefix: str, directory: Path | None = None) -> dict[str, Any]:
    """The catalog file ``<directory>/<prefix>.json`` (default: zoo's), checked."""
    return _load(prefix, str(directory or CATALOG_DIR))


@lru_cache(maxsize=None)
def _load(prefix: str, directory: str) -> dict[str, Any]:
    path = Path(directory) / f"{prefix}.json"
    if not path.is_file():
        known = sorted(p.stem for p in Path(directory).glob("*.json"))
        raise InvalidInput(f"no weights catalog called {prefix!r}", hint=f"catalogs: {', '.join(known) or 'none'}")
    data = json.loads(path.read_text())
    if data.get("schema_version") != SCHEMA_VERSION:
        raise InvalidInput(f"{path} has schema_version {data.get('schema_version')!r}; this zoo reads {SCHEMA_VERSION}",
                           hint="upgrade zoo-onnx")
    for model, entry in data["models"].items():
        if not re.fullmatch(r"[0-9a-f]{64}", entry.get("sha256", "")):
            raise InvalidInput(f"{path}: {model} lacks the full sha256 of its file")
    return data
