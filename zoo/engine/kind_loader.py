"""Finding and loading stage kinds: every kind, zoo's own included, is a `zoo.stages` entry point.

zoo's kinds (train → export → optimize → quantize → verify → deploy) are the entry points of its
own distribution, declared in pyproject.toml exactly as a third-party package declares its kinds:
``[project.entry-points."zoo.stages"] mykind = "mypkg.kinds:MyKind"``. pyproject.toml is the only
list of built-in kinds; this module, `zoo kinds` and scripts/gen_kinds_doc.py read the installed
entry points. When several distributions declare one name, zoo's own kind wins (a plugin cannot
replace a built-in); between third-party distributions, the first one on sys.path.

Kinds are loaded lazily: listing names reads package metadata only, and a kind's module is
imported only when a recipe uses it.
"""

from __future__ import annotations

import difflib
import importlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from zoo.errors import UnknownKind

if TYPE_CHECKING:
    from zoo.stage import StageKind

ENTRY_POINT_GROUP = "zoo.stages"
BUILTIN_DISTRIBUTION = "zoo-onnx"  # zoo's own distribution: its kinds are the built-in ones


def _normalized(dist: str) -> str:
    """A distribution name as packaging compares them (PEP 503: `zoo_onnx` is `zoo-onnx`)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


@dataclass(frozen=True)
class KindEntry:
    """One registered kind: its name, import target and the distribution that declares it."""

    name: str
    target: str  # "module:Class"
    distribution: str  # normalized name; "" for an entry point that belongs to no distribution
    dist: Any = field(default=None, compare=False, repr=False)  # importlib.metadata.Distribution

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def builtin(self) -> bool:
        return self.distribution == BUILTIN_DISTRIBUTION

    def packages(self) -> tuple[str, ...]:
        """The top-level packages of the distribution that provides the kind (its project code).

        From the distribution's ``top_level.txt`` (or its RECORD); the top-level package of the
        kind's own module always belongs to it.
        """
        found = {self.module.partition(".")[0]}
        if self.dist is not None:
            listed = self.dist.read_text("top_level.txt")
            if listed:
                found.update(line.strip() for line in listed.splitlines() if line.strip())
            else:
                found.update(_record_packages(self.dist))
        return tuple(sorted(found))


def _record_packages(dist: Any) -> set[str]:
    """Top-level packages and modules named by a distribution's RECORD (no top_level.txt)."""
    found = set()
    for f in dist.files or ():
        parts = f.parts
        if len(parts) > 1 and not parts[0].endswith((".dist-info", ".egg-info", ".data")) and parts[0] != "..":
            found.add(parts[0])
        elif len(parts) == 1 and parts[0].endswith(".py"):
            found.add(parts[0][:-3])
    return {name for name in found if name.isidentifier() and not name.startswith("__")}  # not __editable__ finders


@lru_cache(maxsize=1)
def entries() -> dict[str, KindEntry]:
    """Every registered kind by name, built-ins winning over third-party names."""
    return scan(ENTRY_POINT_GROUP)


def scan(group: str) -> dict[str, KindEntry]:
    """Every entry point of `group` by name, zoo's own winning over third-party names (also used
    for the `zoo.exporters` group by `zoo.engine.exporter_loader`)."""
    from importlib.metadata import entry_points

    found: dict[str, KindEntry] = {}
    for ep in entry_points(group=group):
        dist = getattr(ep, "dist", None)
        entry = KindEntry(name=ep.name, target=ep.value, distribution=_normalized(dist.name) if dist else "", dist=dist)
        if ep.name not in found or (entry.builtin and not found[ep.name].builtin):
            found[ep.name] = entry
    return found


def available() -> dict[str, str]:
    """Every known kind name -> its import target ("module:Class")."""
    return {name: e.target for name, e in entries().items()}


def builtin_names() -> list[str]:
    """The names of zoo's own kinds (the entry points of its distribution), sorted."""
    return sorted(name for name, e in entries().items() if e.builtin)


def is_kind(name: str) -> bool:
    return name in entries()


def entry(name: str) -> KindEntry:
    """The registration of kind `name`; UnknownKind (with the closest name) if there is none."""
    found = entries()
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known kinds: {', '.join(sorted(found))}"
        raise UnknownKind(f"unknown stage kind {name!r}", hint=hint)
    return found[name]


@lru_cache(maxsize=None)
def get(name: str) -> type["StageKind"]:
    """The kind class called `name`, importing its module on first use."""
    module_name, _, attr = entry(name).target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownKind(f"stage kind {name!r} could not be imported from {module_name}: {e}",
                          hint="install the package that provides it") from e
    cls = getattr(module, attr, None)
    if cls is None:
        raise UnknownKind(f"stage kind {name!r}: {module_name} has no attribute {attr!r}")
    return cls


def clear_cache() -> None:
    """Forget loaded entry points and kinds (tests register kinds at run time)."""
    entries.cache_clear()
    get.cache_clear()
