"""Stage cache keys: a digest of canonical JSON of everything that determines a stage's outputs.

The parts are kind, kind version, resolved config, the recipe-wide sections the kind reads,
matrix values, digests of input artifacts, digests of the code the stage runs (the kind's module
and user code it names), and versions of the tools the kind declares. Nothing is imported to
compute a key except the kind's own (light) module.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from zoo import kinds
from zoo.hashing import StatCache, digest_json, digest_path
from zoo.planner import Node
from zoo.recipe import Recipe
from zoo.stage import KeyContext, RecipeInfo

KEY_SCHEMA_VERSION = 1
ZOO_DIST = "zoo-onnx"


@lru_cache(maxsize=None)
def tool_version(dist: str) -> str:
    """Installed version of a distribution, without importing it ('absent' if not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def tool_versions(dists: tuple[str, ...]) -> dict[str, str]:
    return {d: tool_version(d) for d in sorted(set(dists) | {ZOO_DIST})}


def recipe_info(recipe: Recipe) -> RecipeInfo:
    spec = recipe.spec
    return RecipeInfo(name=spec.name, version=spec.version, description=spec.description,
                      license=spec.license, path=recipe.path, digest=recipe.digest)


def shared_sections(recipe: Recipe, node: Node) -> dict[str, Any]:
    """The recipe-wide sections this stage's kind declares it reads."""
    cls = kinds.get(node.kind)
    shared = recipe.shared()
    return {name: shared.get(name) for name in cls.shared}


def module_files(cls: type) -> dict[str, Path]:
    """The source files of a kind's module and of the `code_modules` it declares (not imported)."""
    from importlib.util import find_spec

    from zoo.errors import InvalidInput

    found: dict[str, Path] = {}
    own = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if own:
        found[cls.__module__] = Path(own)
    for name in cls.code_modules:
        spec = find_spec(name)
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            raise InvalidInput(f"kind {cls.name!r} declares code module {name!r}, which cannot be found")
        found[name] = Path(spec.origin)
    return found


def code_digests(recipe: Recipe, node: Node, hashes: StatCache) -> dict[str, str]:
    """Digests of the kind's code (its module, its code_modules) and of files its config names."""
    cls = kinds.get(node.kind)
    out: dict[str, str] = {f"kind:{name}": hashes.digest(path) for name, path in module_files(cls).items()}
    ctx = KeyContext(recipe=recipe_info(recipe), shared=shared_sections(recipe, node), matrix=node.instance.matrix)
    for dep in cls().dependencies(node.instance.config, ctx):
        dep = Path(dep)
        try:
            label = dep.resolve().relative_to(recipe.path.parent).as_posix()
        except ValueError:
            label = str(dep.resolve())
        out[label] = digest_path(dep, hashes)
    return out


def watched_files(recipe: Recipe, node: Node) -> list[Path]:
    """Every file whose content went into `code_digests` (for the no-op fast path's stamp)."""
    cls = kinds.get(node.kind)
    files: list[Path] = list(module_files(cls).values())
    ctx = KeyContext(recipe=recipe_info(recipe), shared=shared_sections(recipe, node), matrix=node.instance.matrix)
    for dep in cls().dependencies(node.instance.config, ctx):
        dep = Path(dep).resolve()
        files.append(dep)
        if dep.is_dir():
            files.extend(p for p in dep.rglob("*"))
    return files


def key_parts(recipe: Recipe, node: Node, inputs: dict[str, dict[str, str]], hashes: StatCache,
              ancestors: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything that enters the key of `node`, given its upstream output digests.

    `ancestors` (ancestor id -> key) enters only for kinds that declare ``lineage = True``.
    """
    cls = kinds.get(node.kind)
    parts = {
        "schema": KEY_SCHEMA_VERSION,
        "kind": node.kind,
        "kind_version": str(cls.version),
        "config": node.instance.config.model_dump(mode="json", by_alias=True),
        "shared": shared_sections(recipe, node),
        "matrix": dict(node.instance.matrix),
        "inputs": inputs,
        "code": code_digests(recipe, node, hashes),
        "tools": tool_versions(tuple(cls.tools)),
    }
    if cls.recipe_fields:
        info = recipe_info(recipe)
        parts["recipe"] = {f: str(getattr(info, f)) for f in cls.recipe_fields}
    if cls.lineage:
        parts["lineage"] = dict(sorted((ancestors or {}).items()))
    return parts


def key_of(parts: dict[str, Any]) -> str:
    return digest_json(parts)
