"""Stage cache keys: a digest of canonical JSON of everything that determines a stage's outputs.

A key is the stage's *record* plus its *code*:

- the record (what the lockfile keeps, `lockfile.IDENTITY_FIELDS`): kind, kind version, resolved config, the
  recipe-wide fields the kind declares, matrix values, digests of its inputs (upstream outputs)
  and of the files it reads (user code, data: `dependencies`), the versions of the tools it uses
  for this recipe (`StageKind.tools_used`), declared recipe fields, and for kinds that declare
  ``lineage`` the digests of their ancestors' records;
- the code: the kind's own package as far as the kind's module imports it, transitively
  (zoo.engine.import_closure; `zoo.stage.KEYED_ZOO_MODULES` beside it), and `zoo.stage.KIND_EPOCH`,
  which stands for zoo's side of the interface. zoo's engine, registry, downloader, CLI and
  file layer are not in any key, nor is zoo's version: upgrading zoo reruns nothing unless the
  kinds' code or the epoch changed.

The lock holds records, not keys: a key that changed only through code while the rebuilt bytes
are equal leaves the lock as it was (zoo/engine/frozen.py). Nothing is imported to compute a key
except the kind's own (light) module.
"""

from __future__ import annotations


from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo.engine import kind_loader
from zoo.engine.hashing import StatCache, digest_json, digest_path
from zoo.engine.planner import Dag, Node
from zoo.engine.recipe import Recipe
from zoo.stage import KEYED_ZOO_MODULES, KIND_EPOCH, KeyContext, RecipeInfo, SharedView

if TYPE_CHECKING:
    from zoo.engine.cache import Entry

# 2: the record and the code apart (`files` for the files a stage reads, `code` for the kind's
# package only, `epoch`), tools as the stage uses them, no zoo version, ancestor records not keys
KEY_SCHEMA_VERSION = 2


@lru_cache(maxsize=None)
def tool_version(dist: str) -> str:
    """Installed version of a distribution, without importing it ('absent' if not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def tool_versions(dists: tuple[str, ...]) -> dict[str, str]:
    return {d: tool_version(d) for d in sorted(set(dists))}


def recipe_info(recipe: Recipe) -> RecipeInfo:
    spec = recipe.spec
    return RecipeInfo(name=spec.name, version=spec.version, description=spec.description,
                      license=spec.license, path=recipe.path, digest=recipe.digest)


def section_fields() -> dict[str, tuple[str, ...] | None]:
    """Each recipe-wide section and its fields (None for a plain value such as ``task``): the
    registered sections (`zoo.engine.section_loader`), what a kind's ``shared`` may name."""
    from zoo.engine import section_loader

    return section_loader.section_fields()


def declared_fields(cls: type) -> dict[str, tuple[str, ...] | None]:
    """What a kind's ``shared`` declares: section -> its fields, None for the whole section.

    InvalidInput for a declaration naming a section or field the recipe format does not have.
    """
    from zoo.errors import InvalidInput

    sections = section_fields()
    out: dict[str, tuple[str, ...] | None] = {}
    for entry in cls.shared:
        section, _, name = str(entry).partition(".")
        if section not in sections:
            raise InvalidInput(f"kind {cls.name!r} declares shared {entry!r}: the recipe has no section {section!r}",
                               hint=f"recipe-wide sections: {', '.join(sections)}")
        fields = sections[section]
        if not name:
            out[section] = None
            continue
        if fields is None or name not in fields:
            known = ", ".join(f"{section}.{f}" for f in fields or ()) or f"only {section!r} as a whole"
            raise InvalidInput(f"kind {cls.name!r} declares shared {entry!r}, which the recipe format does not have",
                               hint=f"declare one of: {known}")
        if section in out and out[section] is None:
            continue
        out[section] = tuple(sorted({*(out.get(section) or ()), name}))
    return out


def shared_values(recipe: Recipe, node: Node) -> dict[str, Any]:
    """The recipe-wide values this stage's kind declares, as plain data: what enters its key.

    ``{section: {field: value}}`` for declared fields, the whole section (every field, defaults
    filled in) when the section is declared as a whole, None where the recipe lacks the section.
    """
    present = recipe.shared()
    out: dict[str, Any] = {}
    for section, fields in declared_fields(kind_loader.get(node.kind)).items():
        value = present.get(section)
        out[section] = value if fields is None or not isinstance(value, dict) else {f: value.get(f) for f in fields}
    return out


def shared_sections(recipe: Recipe, node: Node) -> SharedView:
    """What the stage's context holds of the recipe-wide sections: `shared_values`, and nothing else.

    Built from the same values as the key, so a kind cannot read a recipe value its key lacks:
    an undeclared section or field is absent, and reading it raises `UndeclaredField`.
    """
    cls = kind_loader.get(node.kind)
    declared = declared_fields(cls)
    sections = section_fields()
    view: dict[str, Any] = {}
    for section, value in shared_values(recipe, node).items():
        if isinstance(value, dict):
            hidden = () if declared[section] is None else tuple(set(sections[section] or ()) - set(value))
            value = SharedView(value, kind=cls.name, where=section, undeclared=hidden)
        view[section] = value
    return SharedView(view, kind=cls.name, undeclared=tuple(set(sections) - set(view)))


def module_files(kind: str) -> dict[str, Path]:
    """Module name -> source file of the code kind `kind` runs for its bytes: its module and every
    module of its own package(s) that it imports, directly or not, and the `KEYED_ZOO_MODULES` it
    imports (read, not imported; each file's parsed imports are remembered in the user's code memo,
    see zoo.engine.import_closure). zoo's other modules are the kind interface (`KIND_EPOCH`).
    """
    from zoo.errors import InvalidInput
    from zoo.engine.import_closure import closure

    entry = kind_loader.entry(kind)
    roots = {entry.module, kind_loader.get(kind).__module__}
    packages = {p for p in entry.packages() if p != "zoo"}  # zoo is the interface, not the kind's code
    try:
        return closure(roots, packages, modules=KEYED_ZOO_MODULES)
    except LookupError as e:
        raise InvalidInput(f"kind {kind!r}: {e}, so its code cannot enter the cache key",
                           hint="install the package that provides it from source files") from None


def code_digests(kind: str, hashes: StatCache) -> dict[str, str]:
    """Digests of the kind's code (`module_files`), labelled ``kind:<module>``."""
    return {f"kind:{name}": hashes.digest(path) for name, path in module_files(kind).items()}


def key_context(recipe: Recipe, node: Node) -> KeyContext:
    """What the stage's kind lists its dependencies with: the zoo models its declared fields name
    already resolved and pinned (zoo/engine/parents.py), so their files can enter the key."""
    from zoo.engine import parents

    return KeyContext(recipe=recipe_info(recipe), shared=shared_sections(recipe, node), matrix=node.instance.matrix,
                      references=parents.StageReferences(shared_values(recipe, node), recipe.path.parent))


def file_digests(recipe: Recipe, node: Node, hashes: StatCache, ctx: KeyContext | None = None) -> dict[str, str]:
    """Digests of the files and folders the stage's config names (`StageKind.dependencies`)."""
    cls = kind_loader.get(node.kind)
    out: dict[str, str] = {}
    for dep in cls().dependencies(node.instance.config, ctx or key_context(recipe, node)):
        dep = Path(dep)
        out[dependency_label(dep, recipe.path.parent)] = digest_path(dep, hashes)
    return out


def tools_used(recipe: Recipe, node: Node, ctx: KeyContext | None = None) -> tuple[str, ...]:
    """The distributions the stage uses for this recipe (`StageKind.tools_used`), sorted."""
    cls = kind_loader.get(node.kind)
    return tuple(sorted(set(cls().tools_used(node.instance.config, ctx or key_context(recipe, node)))))


def dependency_label(dep: Path, recipe_dir: Path) -> str:
    """The name a dependency has in a key, the same wherever the machine keeps its folders, so keys
    (and the remote run cache) are shared: files in zoo's own folders are named from their root
    (``zoo-home:models/…`` and ``cache:parents/…`` for a `model.from` parent, zoo/engine/parents.py;
    ``cache:dvc/pins/…`` for a DVC pin), since
    ZOO_HOME and the cache live at other paths on other machines; files in the recipe's folder
    relative to it (``data/x.csv``); anything else by its absolute path, which is how a recipe names
    a file outside its project (a recipe that moves, as `zoo import`'s does when pulled, keeps it)."""
    from zoo import paths

    dep = dep.resolve()
    for prefix, root in (("zoo-home", paths.zoo_home()), ("cache", paths.cache_dir())):
        try:
            return f"{prefix}:{dep.relative_to(root.resolve()).as_posix()}"
        except ValueError:
            pass
    try:
        return dep.relative_to(recipe_dir.resolve()).as_posix()
    except ValueError:
        return str(dep)


def watched_files(recipe: Recipe, node: Node) -> list[Path]:
    """Every file whose content went into the key's code and files (for the no-op fast path's stamp)."""
    cls = kind_loader.get(node.kind)
    files: list[Path] = list(module_files(node.kind).values())  # parsed imports: memoised in this process
    for dep in cls().dependencies(node.instance.config, key_context(recipe, node)):
        dep = Path(dep).resolve()
        files.append(dep)
        if dep.is_dir():
            files.extend(p for p in dep.rglob("*"))
    return files


def key_parts(recipe: Recipe, node: Node, inputs: dict[str, dict[str, str]], hashes: StatCache,
              ancestors: dict[str, str] | None = None) -> dict[str, Any]:
    """Everything that enters the key of `node`, given its upstream output digests.

    `ancestors` (ancestor id -> digest of its record) enters only for kinds that declare ``lineage = True``.
    """
    cls = kind_loader.get(node.kind)
    ctx = key_context(recipe, node)  # once: it holds the declared sections and the pinned references
    parts = {
        "schema": KEY_SCHEMA_VERSION,
        "kind": node.kind,
        "kind_version": str(cls.version),
        "config": node.instance.config.model_dump(mode="json", by_alias=True),
        "shared": shared_values(recipe, node),
        "matrix": dict(node.instance.matrix),
        "inputs": inputs,
        "files": file_digests(recipe, node, hashes, ctx),
        "tools": tool_versions(tools_used(recipe, node, ctx)),
    }
    if cls.recipe_fields:
        info = recipe_info(recipe)
        parts["recipe"] = {f: str(getattr(info, f)) for f in cls.recipe_fields}
    if cls.lineage:
        parts["lineage"] = dict(sorted((ancestors or {}).items()))
    parts["code"] = code_digests(node.kind, hashes)
    parts["epoch"] = KIND_EPOCH
    return parts


def record_digest(parts: Mapping[str, Any]) -> str:
    """The digest of a stage's record (`lockfile.record_identity`: the key's parts but the code): the identity its
    lock record, its cache entry and the stamps in its outputs share, which code does not move."""
    from zoo.engine.lockfile import record_identity

    return record_identity(dict(parts))


def key_of(parts: dict[str, Any]) -> str:
    return digest_json(parts)


def stage_key(dag: Dag, node: Node, entries: Mapping[str, "Entry"], records: Mapping[str, str],
              hashes: StatCache) -> tuple[dict[str, Any], str]:
    """The key parts and key of `node` once every stage it needs is done (`plan` and the runner).

    `entries`: the cache entry of each stage `node` needs (their output digests are its inputs);
    `records`: the record digest of each ancestor (they enter kinds that declare ``lineage``).
    """
    inputs = {up: entries[up].output_digests() for up in node.needs}
    ancestors = {a: records.get(a, "") for a in dag.ancestors(node.id)} if kind_loader.get(node.kind).lineage else {}
    parts = key_parts(dag.recipe, node, inputs, hashes, ancestors)
    return parts, key_of(parts)
