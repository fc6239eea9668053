"""Finding and loading recipe-wide sections: every section is a `zoo.sections` entry point.

A recipe's top-level keys beyond its generic ones (name, version, stages, …) are sections that
distributions register (the contract: `zoo/section.py`). zoo's own ``model``, ``data`` and
``task`` are entry points of its distribution, declared in pyproject.toml exactly as a plugin
declares its own: ``[project.entry-points."zoo.sections"] mysection = "mypkg.sections:MySection"``.
As for kinds (`zoo.engine.kind_loader`, whose entry-point scan this module shares), zoo's own name
wins over a plugin that declares it too.

Every registered section is imported when a recipe is validated (any recipe may use it, and an
absent one still has its default), so section modules stay light; a kind's ``shared`` names
sections and their fields as `section_fields` lists them.
"""

from __future__ import annotations

import importlib
import re
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from zoo.engine.kind_loader import KindEntry, scan
from zoo.errors import InvalidInput

if TYPE_CHECKING:
    from zoo.section import RecipeSection

ENTRY_POINT_GROUP = "zoo.sections"
# a section's name is a top-level recipe key and a pydantic field name (which may not start with
# `model_`, pydantic's own namespace)
NAME_RE = r"^(?!model_)[a-z][a-z0-9_]*$"


@lru_cache(maxsize=1)
def entries() -> dict[str, KindEntry]:
    """Every registered section by name, zoo's own winning over third-party names."""
    return scan(ENTRY_POINT_GROUP)


def names() -> list[str]:
    """The registered section names, sorted (the order the recipe parser validates them in)."""
    return sorted(entries())


@lru_cache(maxsize=None)
def get(name: str) -> type["RecipeSection"]:
    """The section class registered as `name`, importing its module on first use."""
    from zoo.section import RecipeSection

    entry = entries()[name]
    module_name, _, attr = entry.target.partition(":")
    where = f"recipe section {name!r} (from {entry.distribution or module_name})"
    if not re.fullmatch(NAME_RE, name):
        raise InvalidInput(f"{where}: the name must be lowercase letters, digits and '_', not starting with model_",
                           hint="rename its `zoo.sections` entry point")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise InvalidInput(f"{where} could not be imported from {module_name}: {e}",
                           hint="install the package that provides it") from e
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, RecipeSection) and hasattr(cls, "schema")):
        raise InvalidInput(f"{where}: {module_name}:{attr} is not a zoo.section.RecipeSection with a `schema`")
    return cls


def sections() -> dict[str, type["RecipeSection"]]:
    """Every registered section, by name, in validation order."""
    return {name: get(name) for name in names()}


@lru_cache(maxsize=1)
def section_fields() -> dict[str, tuple[str, ...] | None]:
    """Each section and its fields as a recipe spells them (an alias where a field has one, such as
    ``model.from``); None for a plain value such as ``task``, declarable only as a whole."""
    from pydantic import BaseModel

    out: dict[str, tuple[str, ...] | None] = {}
    for name, section in sections().items():
        schema = section.schema
        is_model = isinstance(schema, type) and issubclass(schema, BaseModel)
        out[name] = tuple(f.alias or n for n, f in schema.model_fields.items()) if is_model else None
    return out


def as_plain(value: Any) -> Any:
    """A section's validated value as plain JSON data (what kinds get and keys hold)."""
    from pydantic import BaseModel
    from pydantic_core import to_jsonable_python

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return to_jsonable_python(value)


def clear_cache() -> None:
    """Forget loaded entry points and sections (tests register sections at run time)."""
    entries.cache_clear()
    get.cache_clear()
    section_fields.cache_clear()
