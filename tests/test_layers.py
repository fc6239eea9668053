"""The layers and the absence of import circles (DEVELOPERS.md "Layers").

`lint-imports` checks the contracts declared in pyproject.toml (`[tool.importlinter]`); a broken
one fails this test with import-linter's report, naming each import that crosses a layer.

Circles are checked apart, over every import of every module of `zoo` and `zoo_stages`, at module
level and inside functions, as `zoo.engine.import_closure.parse_statements` reads them (imports
under ``if TYPE_CHECKING:`` never run, so they are not followed): a circle fails with its modules
and the imports that close it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from zoo.engine.import_closure import parse_statements

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zoo", "zoo_stages")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """Module name -> (its file, whether it is a package's __init__) for every module below `root`."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Module -> the project modules it imports. `from a import b` names a.b when that is a module,
    else a; `import a.b.c` names the deepest of a.b.c, a.b, a that is a module. A submodule's import
    runs its packages' __init__ first, but that is the import system's order, not a dependency of
    the importer on them (import-linter counts imports the same way)."""
    modules = module_files(root, packages)
    graph: dict[str, set[str]] = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        imported: set[str] = set()
        for level, target, names in parse_statements(path.read_bytes(), str(path)):
            if level:
                base = package.split(".")[:len(package.split(".")) - (level - 1)]
                target = ".".join(base + ([target] if target else []))
            if names is None:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target:
                    imported.add(target)
                continue
            for attr in names:
                if f"{target}.{attr}" in modules:
                    imported.add(f"{target}.{attr}")
                elif target in modules:
                    imported.add(target)
        graph[name] = imported - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_no_import_circles_among_zoo_and_zoo_stages_modules():
    graph = import_graph(ROOT, PACKAGES)
    assert len(graph) > 150, "the module walk found too few modules to mean anything"
    found = circles(graph)
    assert not found, "import circles (break each by moving the code to where it belongs):\n" + \
        "\n".join(describe(c, graph) for c in found)


def test_the_circle_check_finds_a_circle_through_a_function_level_import_and_ignores_type_checking(tmp_path):
    """The check above on a made-up package: a → b at module level and b → a inside a function
    make a circle; d → e under ``if TYPE_CHECKING:`` with e → d do not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import thing\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text(textwrap.dedent("""\
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            import pkg.e
        """))
    (pkg / "e.py").write_text("import pkg.d\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == set() and graph["pkg.e"] == {"pkg.d"}
    assert circles(graph) == [["pkg.a", "pkg.b"]]


def test_the_import_contracts_hold():
    """`lint-imports` over pyproject.toml's contracts; its report is the failure message."""
    run = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
                          "sys.exit(lint_imports_command())", "--no-cache"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    report = run.stdout + run.stderr
    assert run.returncode == 0, report
    assert "0 broken" in report and "kept" in report, report
