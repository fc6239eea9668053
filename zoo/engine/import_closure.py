"""The project modules a kind's code may run, found by reading source: nothing is imported.

A stage's cache key must hold every line of project code that can run in the stage, or an edit
would reuse stale outputs. `closure` starts from a kind's module and follows every import
statement — at module level and inside functions (kinds import inside ``run()``), ``import a.b``,
``from a import b``, relative imports — through the modules of the *project packages* (the
kind's own top-level packages: ``zoo_stages`` for the built-in kinds) and the few single modules
named beside them (`zoo.stage.KEYED_ZOO_MODULES`). Importing a submodule runs its packages'
``__init__``, so those of the project packages are in the closure too. Other modules are not
followed: zoo's own (the kind interface; `zoo.stage.KIND_EPOCH` stands for it), the standard
library, numpy, torch (their versions enter keys as the tools the stage uses).

Files are found the way the import system would find them: the top-level package by
`importlib.util.find_spec` (which imports nothing for a top-level name), its submodules by path
below it. Not followed: imports by a computed name (``importlib.import_module(f"…")``); a kind
that loads project code that way must name the files in its ``dependencies``; and imports inside
a function named like a hook that makes no output (`UNKEYED_HOOKS`: ``equivalence``).

Parsing is the costly part (about 2 ms a file, 40 files for a built-in kind, 100 for a recipe's
six), so each file's import statements are remembered by (path, inode, size, mtime_ns): per
process, and across processes in the user's code memo (`code_memo`), or in the `StatCache` a
caller gives. The statements are a fact about an installed file, not about a project, so they are
kept where every project and run cache of the user finds them, as Python keeps a module's bytecode
beside it: a new project, a CI job or a machine taking its stages from a remote cache (whose run
cache starts empty) does not parse zoo's own modules again.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Iterable, Iterator

from zoo.engine.hashing import StatCache

# (level, module, names): `import a.b` is (0, "a.b", None); `from ..a import b, c` is (2, "a", ("b", "c"))
Statement = tuple[int, str, tuple[str, ...] | None]
IMPORTS_FORMAT = "imports/2"  # the StatCache label of parsed statements; bump it when what is parsed changes
# StageKind hooks that compute no output byte and run outside a stage (`zoo repro --check` judges
# rebuilt outputs with `equivalence`): the imports inside a function of that name are not
# followed, so the judging code (zoo_stages/lib/quality/equivalence.py, the parity check it uses) enters
# no key. A kind must not call such a hook from `run`.
UNKEYED_HOOKS = frozenset({"equivalence"})


@dataclass(frozen=True)
class Located:
    """Where a module's code is: `path` is None for a namespace package (a folder, no code)."""

    path: Path | None
    is_package: bool
    folders: tuple[Path, ...] = ()  # where its submodules are (packages only)


def closure(roots: Iterable[str], packages: Iterable[str], memo: StatCache | None = None,
            modules: Iterable[str] = ()) -> dict[str, Path]:
    """Module name -> source file of `roots` and every project module they import, transitively.

    `memo` remembers parsed files across processes (default: the user's `code_memo`).

    `packages` are the top-level package names whose modules are followed (the roots' own
    top-level packages are always among them); `modules` are single modules of other packages
    that are followed too (their packages' ``__init__`` is not: it is not code the stage runs for
    its bytes). A root that cannot be found as a file raises LookupError; an import that names no
    module file (an attribute, a module outside the project) is skipped.
    """
    roots = sorted(set(roots))
    project = set(packages) | {r.partition(".")[0] for r in roots}
    singles = set(modules)

    def followed(name: str) -> bool:
        return name.partition(".")[0] in project or name in singles
    finder = _Finder()
    found: dict[str, Path] = {}
    seen: set[str] = set()
    todo: list[str] = []
    for root in roots:
        located = finder.locate(root)
        if located is None or located.path is None:
            raise LookupError(f"no source file for module {root!r}")
        todo.append(root)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        located = finder.locate(name)
        if located is None:
            continue  # `from pkg import attribute`: not a module
        todo.extend(p for p in _parents(name) if followed(p))  # importing a.b.c runs a/__init__ and a/b/__init__
        if located.path is None:
            continue
        found[name] = located.path
        if located.path.suffix != ".py":
            continue  # a compiled extension: hashed, not read
        for candidate in _imported(name, located.is_package, _statements(located.path, memo)):
            if followed(candidate) and candidate not in seen:
                todo.append(candidate)
    return dict(sorted(found.items()))


def _parents(name: str) -> Iterator[str]:
    parts = name.split(".")
    for i in range(1, len(parts)):
        yield ".".join(parts[:i])


def _imported(module: str, is_package: bool, statements: Iterable[Statement]) -> Iterator[str]:
    """Absolute names of the modules each statement may import (some are attributes, dropped later)."""
    package = module if is_package else module.rpartition(".")[0]
    for level, name, names in statements:
        if level:
            base = package.split(".")
            if level - 1 >= len(base) or not package:
                continue  # beyond the top-level package: an ImportError at run time, no code
            base = base[:len(base) - (level - 1)]
            name = ".".join(base + ([name] if name else []))
        yield name
        yield from _parents(name)
        for attr in names or ():  # `from a import b`: b may be a module (`*` names no file: dropped later)
            yield f"{name}.{attr}"


def parse_statements(source: bytes, filename: str = "<source>") -> list[Statement]:
    """Every import statement in a module's source, at any depth (functions, branches, classes)."""
    found: list[Statement] = []
    try:
        tree = ast.parse(source, filename)
    except (SyntaxError, ValueError):
        return found  # it cannot run either; its own digest is in the key
    # walk statements only: imports are statements, and skipping expressions makes this 10x faster
    todo: list[ast.AST] = [node for node in tree.body if not _lazy_attributes(node)]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found.extend((0, alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or "", tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)  # `if TYPE_CHECKING:` never runs
            continue
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in UNKEYED_HOOKS:
            continue  # runs only to judge outputs, never to make them
        for attr in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, attr, None) or ())
    return found  # in a fixed order (the walk's): the memo's text is stable


def _lazy_attributes(node: ast.AST) -> bool:
    """A module-level ``def __getattr__`` (PEP 562): it runs only when code reads an attribute the
    module lacks. zoo's own (``zoo.run`` loads zoo.api) would otherwise put the whole engine into
    every built-in kind's key; no kind reads those attributes."""
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "__getattr__"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


_parsed: dict[tuple[str, int, int, int], list[Statement]] = {}


def code_memo_path() -> Path:
    """Where parsed import statements are remembered across runs and projects: ``$ZOO_CODE_MEMO``,
    else ``code.sqlite`` in the user's cache folder (``~/.cache/zoo`` on Linux)."""
    env = os.environ.get("ZOO_CODE_MEMO")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("zoo", appauthor=False)) / "code.sqlite"


_code_memos: dict[Path, StatCache] = {}


def code_memo() -> StatCache:
    """The user's code memo (`code_memo_path`), opened once per process; entries are checked against
    each file's (inode, size, mtime_ns), so a stale one is never used. Where the folder cannot be
    written, it remembers in memory only."""
    path = code_memo_path()
    if path not in _code_memos:
        _code_memos[path] = StatCache(path)
    return _code_memos[path]


def _statements(path: Path, memo: StatCache | None) -> list[Statement]:
    st = os.stat(path)
    ident = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _parsed.get(ident)
    if hit is None:
        def compute(p: Path) -> str:
            return json.dumps(parse_statements(p.read_bytes(), str(p)))

        text = (memo if memo is not None else code_memo()).remember(path, IMPORTS_FORMAT, compute)
        hit = _parsed[ident] = [(level, name, tuple(names) if names is not None else None)
                                for level, name, names in json.loads(text)]
    return hit


class _Finder:
    """Module name -> `Located`, without importing: one `find_spec` per top-level package."""

    def __init__(self) -> None:
        self._known: dict[str, Located | None] = {}

    def locate(self, name: str) -> Located | None:
        if name not in self._known:
            self._known[name] = self._find(name)
        return self._known[name]

    def _find(self, name: str) -> Located | None:
        parent, _, last = name.rpartition(".")
        if not parent:
            return _top_level(name)
        up = self.locate(parent)
        if up is None or not up.is_package:
            return None
        for folder in up.folders:
            found = _in_folder(folder, last)
            if found is not None:
                return found
        return None


def _top_level(name: str) -> Located | None:
    from importlib.util import find_spec

    try:
        spec = find_spec(name)  # a top-level name: imports nothing
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    origin = Path(spec.origin) if spec.origin and spec.has_location else None
    if origin is not None and not origin.is_file():
        origin = None
    if spec.submodule_search_locations is not None:
        return Located(origin, True, tuple(Path(p) for p in spec.submodule_search_locations))
    return Located(origin, False) if origin is not None else None


def _in_folder(folder: Path, name: str) -> Located | None:
    package = folder / name
    if (package / "__init__.py").is_file():
        return Located(package / "__init__.py", True, (package,))
    module = folder / f"{name}.py"
    if module.is_file():
        return Located(module, False)
    for suffix in EXTENSION_SUFFIXES:
        if (folder / f"{name}{suffix}").is_file():
            return Located(folder / f"{name}{suffix}", False)
    if package.is_dir():
        return Located(None, True, (package,))  # a namespace package
    return None
