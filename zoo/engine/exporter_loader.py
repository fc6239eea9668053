"""Finding and loading exporters: every framework exporter is a `zoo.exporters` entry point.

An exporter turns a model trained in one framework (torch, scikit-learn, LightGBM, XGBoost, ...)
into ONNX; the recipe's ``model.framework`` names it (default: torch). zoo's own exporters are
entry points of its distribution, declared in pyproject.toml exactly as a third-party package
declares one: ``[project.entry-points."zoo.exporters"] myfw = "mypkg.export:MyExporter"`` (a
subclass of `zoo_stages.exporters.base.Exporter`). As for kinds (`zoo.engine.kind_loader`, whose
entry-point scan this module shares), zoo's own name wins over a plugin that declares it too.

Listing names reads package metadata only; an exporter's module is imported on first use. The
module must stay light (its framework is imported inside its functions), so `zoo validate` can
ask it about a recipe's ``model:`` section and `zoo exporters` can say whether its extra is installed.
"""

from __future__ import annotations

import difflib
import importlib
from functools import lru_cache
from typing import Any

from zoo.engine.kind_loader import KindEntry, scan
from zoo.errors import InvalidInput

ENTRY_POINT_GROUP = "zoo.exporters"
DEFAULT_FRAMEWORK = "torch"  # a model without `framework:` is a torch architecture (`arch:` or `entry:`)


@lru_cache(maxsize=1)
def entries() -> dict[str, KindEntry]:
    """Every registered exporter by name, zoo's own winning over third-party names."""
    return scan(ENTRY_POINT_GROUP)


def entry(name: str) -> KindEntry:
    """The registration of exporter `name`; InvalidInput (with the closest name) if there is none."""
    found = entries()
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"known frameworks: {', '.join(sorted(found))}"
        raise InvalidInput(f"no exporter for framework {name!r}", hint=hint)
    return found[name]


@lru_cache(maxsize=None)
def get(name: str) -> Any:
    """The exporter class registered as `name`, importing its module on first use."""
    module_name, _, attr = entry(name).target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidInput(f"exporter {name!r} could not be imported from {module_name}: {e}",
                           hint="install the package that provides it") from e
    cls = getattr(module, attr, None)
    if cls is None:
        raise InvalidInput(f"exporter {name!r}: {module_name} has no attribute {attr!r}")
    return cls


def clear_cache() -> None:
    """Forget loaded entry points and exporters (tests register exporters at run time)."""
    entries.cache_clear()
    get.cache_clear()
