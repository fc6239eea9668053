"""zoo.yamlio: libyaml where PyYAML has it, the same text as the pure-Python emitter, and a
refusal (not a crash) of documents nested deeper than a reader allows."""

from pathlib import Path

import pytest
import yaml

from zoo import yamlio
from zoo.engine import lockfile

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
SHIPPED_LOCKS = sorted(RECIPES.glob("*.lock"))


def test_the_c_classes_are_used_where_pyyaml_has_them():
    assert yaml.__with_libyaml__, "PyYAML without libyaml: every zoo run reads its lockfile 8x slower"
    assert yamlio.SafeLoader is yaml.CSafeLoader and yamlio.SafeDumper is yaml.CSafeDumper


@pytest.mark.parametrize("path", SHIPPED_LOCKS, ids=lambda p: p.name)
def test_a_shipped_lockfile_reads_and_writes_the_same_in_c_and_python(path):
    """A lockfile's bytes never depend on whether a machine's PyYAML has libyaml."""
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert yamlio.safe_load(text) == data
    lock = lockfile.read(path)
    assert lock.to_yaml() == text  # what zoo would write is the file, byte for byte
    options = {"sort_keys": True, "default_flow_style": False, "width": 120, "allow_unicode": True}
    assert yamlio.safe_dump(data, **options) == yaml.safe_dump(data, **options)


def test_shipped_lockfiles_are_found():
    assert len(SHIPPED_LOCKS) >= 13


@pytest.mark.parametrize("nesting", [65, 5_000, 500_000])
def test_a_document_nested_too_deep_is_refused_before_it_is_composed(nesting):
    """libyaml's composer recurses in C: 500,000 levels crash the process unless refused first."""
    with pytest.raises(yamlio.TooDeep, match="nests deeper than 64 levels"):
        yamlio.safe_load("a: " + "[" * nesting + "]" * nesting + "\n")


def test_block_nesting_counts_too():
    deep = "".join(f"{'  ' * i}k{i}:\n" for i in range(70)) + f"{'  ' * 70}v: 1\n"
    with pytest.raises(yamlio.TooDeep):
        yamlio.safe_load(deep)
    assert yamlio.safe_load(deep, max_depth=80)["k0"]["k1"]["k2"] is not None


def test_too_deep_is_a_yaml_error():
    """Callers that turn unreadable YAML into their own error catch it without knowing it."""
    assert issubclass(yamlio.TooDeep, yaml.YAMLError)
