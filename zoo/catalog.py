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

A catalog is hostile input (a file on ``ZOO_CATALOG_PATH`` may come from anywhere): at most
`MAX_BYTES`, it is validated whole by `CatalogFile` (pydantic) before any entry is used -- every
field typed and bounded, unknown fields refused -- and a bad one is an InvalidInput (exit 2)
naming the file and the field when a command needs that catalog; where catalogs are only consulted
for a hint (`names_for`), a bad one is skipped with one warning line.

Only json and pydantic are imported: `zoo validate` and `zoo plan` resolve names without torch.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, StrictStr

from zoo.errors import InvalidInput

CATALOG_DIR = Path(__file__).resolve().parent / "catalogs"
PATH_ENV = "ZOO_CATALOG_PATH"
SCHEMA_VERSION = 1
NAME_RE = re.compile(r"^([a-z][a-z0-9_-]*):([A-Za-z0-9_.-]+)$")
MAX_BYTES = 1 << 20  # zoo's own catalog is 4 KB; a file past 1 MiB is not read at all


# ---------------------------------------------------------------------------------------------
# the catalog file's schema (what `_load` accepts)


def _single_line(value: str) -> str:
    if any(not ch.isprintable() for ch in value):
        raise ValueError("must be one line of printable text")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value) or abs(value) > 1e6:
        raise ValueError("must be a finite number within 1e6")
    return value


Line = Annotated[StrictStr, Field(min_length=1, max_length=2000), AfterValidator(_single_line)]
Text = Annotated[StrictStr, Field(max_length=20_000)]
Word = Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")]
Dim = Annotated[StrictInt, Field(ge=1, le=65_536)]
Stat = Annotated[float, AfterValidator(_finite)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CatalogPreprocessing(BaseModel):
    """What the weights expect of an input; only the fields zoo uses are typed (others are notes)."""

    model_config = ConfigDict(extra="allow")
    input_shape: Optional[Annotated[list[Dim], Field(min_length=1, max_length=8)]] = None
    mean: Optional[Annotated[list[Stat], Field(max_length=64)]] = None
    std: Optional[Annotated[list[Stat], Field(max_length=64)]] = None
    resize: Optional[Dim] = None
    crop: Optional[Dim] = None


class CatalogEntry(_Schema):
    """One model of a catalog: an architecture and the file of its pretrained weights."""

    arch: Word
    num_classes: Annotated[StrictInt, Field(ge=1, le=1_000_000)]
    url: Annotated[StrictStr, Field(pattern=r"^https?://[^\s\\]+$", max_length=2000)]
    sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$", description="the file's full sha256")]
    bytes: Optional[Annotated[StrictInt, Field(ge=0, le=2**53)]] = None
    weights: Optional[Line] = None
    interpolation: Optional[Word] = None
    license: Optional[Line] = None  # the catalog's when absent
    attribution: Optional[Line] = None


class CatalogFile(_Schema):
    """A catalog file, ``<prefix>.json`` (schema_version 1)."""

    schema_version: Literal[1]
    name: Optional[Word] = None
    description: Optional[Text] = None
    license: Line
    attribution: Line
    preprocessing: CatalogPreprocessing = CatalogPreprocessing()
    sha256_sources: dict[Word, Text] = Field(default_factory=dict, description="where the digests came from")
    models: Annotated[dict[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$")], CatalogEntry],
                      Field(max_length=10_000)]


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
    ``torchvision:mobilenet_v3_small``), for hints; a catalog that does not load is passed over with
    one warning line on stderr (the hint is about another model: a bad file must not break it)."""
    wanted = {model, model.replace("-", "_")}
    found = []
    for prefix in known():
        try:
            models = load(prefix)["models"]
        except InvalidInput as e:
            if e.message not in _warned:  # once per process, however many hints ask
                _warned.add(e.message)
                print(f"warning: skipped a weights catalog: {e.message}", file=sys.stderr, flush=True)
            continue
        found += [f"{prefix}:{m}" for m in models if m in wanted]
    return found


_warned: set[str] = set()  # the bad catalogs `names_for` has warned about


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
    """The catalog's JSON, validated by `CatalogFile`; InvalidInput naming the file and the field."""
    from pydantic import ValidationError

    path = Path(directory) / f"{prefix}.json"
    hint = f"fix or remove the file (catalogs are read from {PATH_ENV}'s folders, then zoo's own)"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
        if len(raw) > MAX_BYTES:
            raise InvalidInput(f"{path}: not a catalog: larger than {MAX_BYTES} bytes", hint=hint)
        data = json.loads(raw)
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nesting past the parser's stack
        reason = f"{type(e).__name__}: nested too deep" if isinstance(e, RecursionError) else str(e)
        raise InvalidInput(f"{path}: not a readable catalog ({reason})", hint=hint) from None
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: not a catalog: its top level is a JSON {type(data).__name__}, not an object",
                           hint=hint)
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        shown = repr(version) if isinstance(version, (int, type(None))) else f"of type {type(version).__name__}"
        raise InvalidInput(f"{path} has schema_version {shown[:40]}; this zoo reads {SCHEMA_VERSION}",
                           hint="upgrade zoo-onnx" if isinstance(version, int) and version > SCHEMA_VERSION else hint)
    try:
        CatalogFile.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(map(_shown, first.get("loc", ()))) or "catalog"
        if first.get("loc", ())[-1:] == ("sha256",) and len(first["loc"]) == 3:
            raise InvalidInput(f"{path}: {first['loc'][1]} lacks the full sha256 of its file (field {loc}: "
                               "64 hex digits)", hint=hint) from None
        raise InvalidInput(f"{path}: invalid catalog field {loc}: {first.get('msg')}", hint=hint) from None
    return data


def _shown(part: Any) -> str:
    """A part of a field's location as an error line shows it: a stranger's key quoted when it is
    long or not printable (a newline in a model's name must not start a line of its own)."""
    text = str(part)
    return text if len(text) <= 60 and text.isprintable() else repr(text)[:60]
