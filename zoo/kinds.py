"""The registry of stage kinds: the built-in ones and those from the `zoo.stages` entry points.

Kinds are loaded lazily: listing names costs nothing, and a kind's module is imported only
when a recipe uses it. Built-in kinds are named here *and* declared as entry points in
pyproject.toml (tests check the two agree), so third-party kinds are registered exactly the
same way: ``[project.entry-points."zoo.stages"] mykind = "mypkg.kinds:MyKind"``.
"""

from __future__ import annotations

import difflib
import importlib
from functools import lru_cache
from typing import TYPE_CHECKING

from zoo.errors import UnknownKind

if TYPE_CHECKING:
    from zoo.stage import StageKind

ENTRY_POINT_GROUP = "zoo.stages"

# name -> "module:Class". The six kinds of the pipeline train → export → optimize → quantize → verify → deploy.
BUILTIN_KINDS: dict[str, str] = {
    "train": "zoo_stages.train:Train",
    "export": "zoo_stages.export:Export",
    "optimize": "zoo_stages.optimize:Optimize",
    "quantize": "zoo_stages.quantize:Quantize",
    "verify": "zoo_stages.verify:Verify",
    "deploy": "zoo_stages.deploy:Deploy",
}


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, str]:
    from importlib.metadata import entry_points

    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available() -> dict[str, str]:
    """Every known kind name -> its import target. Built-ins win over entry points."""
    found = dict(_entry_points())
    found.update(BUILTIN_KINDS)
    return found


def is_kind(name: str) -> bool:
    return name in available()


@lru_cache(maxsize=None)
def get(name: str) -> type["StageKind"]:
    """The kind class called `name`, importing its module on first use."""
    targets = available()
    if name not in targets:
        close = difflib.get_close_matches(name, list(targets), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known kinds: {', '.join(sorted(targets))}"
        raise UnknownKind(f"unknown stage kind {name!r}", hint=hint)
    module_name, _, attr = targets[name].partition(":")
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
    _entry_points.cache_clear()
    get.cache_clear()
