"""The engine/kind boundary (issue #33): the built-in kinds (zoo_stages/, a plug-in like any other)
import nothing of the model zoo (zoo.registry). Publishing a release is the engine's effect
(zoo/engine/publish.py), and the manifest a kind writes is the kind-facing format of zoo/manifest.py.

Imports are read from the source at any depth — module level and inside functions, where kinds
import what `run()` needs — by the parser that finds the code in a kind's key."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from zoo.engine.import_closure import parse_statements

FORBIDDEN = "zoo.registry"
# modules that still import the registry, each with what moves it to the engine; an entry must go
# once its module is clean (the test below fails until it does)
PENDING: dict[str, str] = {}


def _kind_modules() -> list[Path]:
    return sorted((REPO / "zoo_stages").rglob("*.py"))


def _registry_imports(module: Path) -> list[str]:
    """The zoo.registry modules `module` imports (absolute imports: zoo_stages has no relative ones
    into zoo), at any depth."""
    found = []
    for level, name, names in parse_statements(module.read_bytes(), str(module)):
        if level:
            continue
        # `from zoo import registry` names the package as one of the imported names
        targets = [name] if names is None or _under(name) else [f"{name}.{n}" for n in names]
        found += [t for t in targets if _under(t)]
    return sorted(set(found))


def _under(module: str) -> bool:
    return module == FORBIDDEN or module.startswith(FORBIDDEN + ".")


@pytest.mark.parametrize("module", _kind_modules(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_a_kind_module_imports_nothing_of_the_registry(module):
    relative = module.relative_to(REPO).as_posix()
    imports = _registry_imports(module)
    if relative in PENDING:
        assert imports, f"{relative} no longer imports {FORBIDDEN}: remove it from PENDING"
        return
    assert imports == [], (f"{relative} imports {', '.join(imports)}: kinds get what they need of the zoo "
                           "through zoo/stage.py and zoo/manifest.py, and the engine publishes (zoo/engine/publish.py)")


def test_the_check_sees_imports_inside_functions_and_of_the_package_itself(tmp_path):
    module = tmp_path / "kind.py"
    module.write_text("from zoo import errors, registry\n\ndef run():\n    from zoo.registry.store import LocalZoo\n")
    assert _registry_imports(module) == ["zoo.registry", "zoo.registry.store"]
