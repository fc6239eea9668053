"""The registry of stage kinds: built-ins, entry points, lazy loading."""

from __future__ import annotations

import ast
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
import tomllib
from importlib.metadata import entry_points

import pytest

from zoo import kinds
from zoo.errors import UnknownKind
from zoo.stage import KindConfig, StageKind

from conftest import REPO


def test_builtin_list_matches_pyproject_entry_points():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    declared = pyproject["project"]["entry-points"]["zoo.stages"]
    assert declared == kinds.BUILTIN_KINDS


def test_builtin_list_matches_installed_entry_points():
    installed = {ep.name: ep.value for ep in entry_points(group=kinds.ENTRY_POINT_GROUP)}
    for name, target in kinds.BUILTIN_KINDS.items():
        assert installed.get(name) == target, f"reinstall the package: entry point {name} is stale"


@pytest.mark.parametrize("name", sorted(kinds.BUILTIN_KINDS))
def test_every_builtin_kind_declares_the_contract(name):
    cls = kinds.get(name)
    assert issubclass(cls, StageKind) and cls.name == name
    assert issubclass(cls.Config, KindConfig)
    assert cls.Config.model_config.get("extra") == "forbid"
    assert cls.version and cls.outputs and cls.run is not StageKind.run


def _helper_imports(path: Path, package: str = "zoo_stages.lib") -> set[str]:
    """The modules of `package` that the source at `path` imports (at any depth in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == package:
                found |= {f"{package}.{alias.name}" for alias in node.names}
            elif node.module.startswith(package + "."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith(package + ".")}
    return found


@pytest.mark.parametrize("name", sorted(kinds.BUILTIN_KINDS))
def test_every_helper_a_kind_runs_enters_its_cache_key(name):
    # a helper missing from code_modules would let an edit to it reuse stale cached outputs
    cls = kinds.get(name)
    todo, closure = [Path(sys.modules[cls.__module__].__file__)], set()
    while todo:
        for module in _helper_imports(todo.pop()) - closure:
            closure.add(module)
            todo.append(Path(find_spec(module).origin))
    assert closure <= set(cls.code_modules), f"add to {name}.code_modules: {sorted(closure - set(cls.code_modules))}"


def test_third_party_kinds_come_from_entry_points():
    available = kinds.available()
    assert available["writer"] == "zoo_test_kinds:Writer"
    assert "writer" not in kinds.BUILTIN_KINDS


def test_kinds_are_loaded_lazily():
    code = ("import sys; from zoo import kinds; names = kinds.available();"
            "assert 'writer' in names and 'train' in names;"
            "assert 'zoo_test_kinds' not in sys.modules and 'zoo_stages.train' not in sys.modules;"
            "kinds.get('writer'); assert 'zoo_test_kinds' in sys.modules; print('lazy')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and "lazy" in proc.stdout, proc.stderr


def test_unknown_kind_suggests_the_closest():
    with pytest.raises(UnknownKind) as err:
        kinds.get("quantise")
    assert "quantize" in (err.value.hint or "")


def test_kind_modules_import_no_heavy_libraries():
    code = ("import sys; from zoo import kinds\n"
            "for n in kinds.BUILTIN_KINDS: kinds.get(n)\n"
            "print([m for m in ('torch', 'onnx', 'onnxruntime', 'sklearn') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
