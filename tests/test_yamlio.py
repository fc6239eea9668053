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


BOMB = "".join(f"b{i}: &b{i} [" + ", ".join([f"*b{i - 1}" if i else '"x"'] * 10) + "]\n" for i in range(9))


def test_an_alias_bomb_is_refused_before_it_is_composed():
    with pytest.raises(yamlio.TooLarge, match="expands to more than 1,000,000 values") as e:
        yamlio.safe_load(BOMB)
    assert e.value.line == 6  # b5 (line 6) repeats b4 (111,111 values) ten times
    with pytest.raises(yamlio.TooLarge, match="more than 100 values"):
        yamlio.safe_load(BOMB.splitlines()[0] + "\n" + BOMB.splitlines()[1] + "\n", max_nodes=100)
    assert yamlio.safe_load("a: &a [1, 2]\nb: *a\n") == {"a": [1, 2], "b": [1, 2]}  # aliases themselves are fine


def test_an_alias_counts_as_deep_as_the_node_it_names():
    nested = "a: &a " + "[" * 40 + "]" * 40 + "\n"
    assert yamlio.safe_load(nested + "b: *a\n")
    with pytest.raises(yamlio.TooDeep, match="through an alias"):
        yamlio.safe_load(nested + "b: " + "[" * 30 + "*a" + "]" * 30 + "\n")


def test_numbers_longer_than_python_reads_and_large_texts_are_limits_too():
    with pytest.raises(yamlio.LimitExceeded, match="longer than 4,300 digits"):
        yamlio.safe_load("a: " + "1" * 5000 + "\n")
    assert yamlio.safe_load("a: '" + "1" * 5000 + "'\n")["a"] == "1" * 5000  # a quoted string is no number
    with pytest.raises(yamlio.TooLarge, match="larger than 4 MiB"):
        yamlio.safe_load("# " + "x" * (4 << 20) + "\n")


def test_load_text_is_one_invalid_input_naming_the_file_line_and_limit():
    from zoo.errors import InvalidInput

    with pytest.raises(InvalidInput) as e:
        yamlio.load_text("ok: 1\n" + BOMB, "conf.yaml", "the zoo config", hint="fix it")
    assert str(e.value.message).startswith("conf.yaml:7: the zoo config is refused: the document expands")
    with pytest.raises(InvalidInput, match=r"conf.yaml:2: the zoo config is not valid YAML"):
        yamlio.load_text("a: 1\n b: [\n", "conf.yaml", "the zoo config", hint="fix it")
    assert yamlio.line_of("a:\n  b: [1,\n    2]\n", ("a", "b", 1)) == 3
