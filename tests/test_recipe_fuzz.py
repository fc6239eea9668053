"""Fuzzing the recipe loader: any text either loads or raises RecipeError, never another exception.

Bounded and deterministic: a fixed number of examples, derandomized (the same inputs on every
run and in CI), no deadline, no example database. Inputs that crash the interpreter itself
(stack overflow in C) cannot be caught in-process: tests/test_recipe_errors.py runs those
through `python -m zoo validate` in a subprocess.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import REPO
from zoo import api
from zoo.errors import RecipeError

RECIPES = [p.read_bytes() for p in sorted((REPO / "recipes").glob("*.yaml"))]

FUZZ = settings(max_examples=250, derandomize=True, deadline=None, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# pieces of YAML syntax and of recipes, so random texts reach past the tokenizer
TOKENS = [
    "[", "]", "{", "}", ":", ": ", ",", " ", "  ", "\n", "\n  ", "\n    ", "- ", "? ", "#", "|", ">", "'", '"', "\t",
    "&a ", "&b ", "*a", "*b", "!!binary ", "!!str ", "!!int ", "!!float ", "!!set ", "!!omap ", "!custom ", "! ",
    "!!python/object:os.system ", "<<: ", "---\n", "...\n", "%YAML 1.1\n", "%TAG ! tag:x,2000:\n",
    "1e999", "1.0e999", ".inf", "-.inf", ".nan", "2001-02-30", "2001-02-03", "0x1F", "0o17", "1:30:00", "~", "null",
    "true", "yes", "1", "-1", "0.5", "9" * 60, "\x00", "\x01", "\x85", "\ufeff", "\u2028", "é", "😀", "\\",
    "schema_version: 1\n", "name: fuzz\n", "version: 1.0.0\n", "stages:\n", "  train:\n", "    config:\n",
    "      epochs: ", "      optimizer: {name: adam, lr: ", "  export:\n", "    needs: [", "    matrix: {b: [",
    "    kind: ", "verify", "quantize", "${matrix.b}", "data: {source: npz, path: ", "model: {arch: lenet5}\n",
]
yamlish = st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=4)), max_size=60).map("".join)


@st.composite
def mutated_recipe(draw) -> bytes:
    """A shipped recipe with a few byte-level edits: deletions, insertions, replacements, repeats."""
    data = bytearray(draw(st.sampled_from(RECIPES)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        op = draw(st.sampled_from(["delete", "insert", "replace", "token", "repeat"]))
        if op == "delete":
            del data[at:at + draw(st.integers(1, 40))]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif op == "replace" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif op == "token":
            data[at:at] = draw(st.sampled_from(TOKENS)).encode()
        elif op == "repeat":
            data[at:at] = data[at:at + draw(st.integers(1, 80))] * draw(st.integers(1, 4))
    return bytes(data)


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    | st.sampled_from(["adam", "sgd", "static", "dynamic", "qdq", "export", "cpu-fp32", "a.accuracy >= 0.9", "${matrix.b}"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8) | st.sampled_from(TOKENS), inner,
                                                                max_size=4),
    max_leaves=12)


@st.composite
def edited_recipe(draw) -> bytes:
    """A shipped recipe's data with values replaced, keys added or removed, dumped back to YAML."""
    data = yaml.safe_load(draw(st.sampled_from(RECIPES)))
    for _ in range(draw(st.integers(1, 4))):
        node = data
        while True:  # walk down to a random mapping or list
            children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
            containers = [(k, v) for k, v in children if isinstance(v, (dict, list)) and v]
            if not containers or draw(st.integers(0, 5)) == 0:  # mostly deep: stage configs
                break
            node = draw(st.sampled_from(containers))[1]
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        op = draw(st.sampled_from(["replace", "delete", "add"]))
        if op == "add" and isinstance(node, dict):
            node[draw(st.text(max_size=8) | st.sampled_from(["kind", "needs", "matrix", "config", "cache"]))] = draw(values)
        elif keys and op == "delete":
            del node[draw(st.sampled_from(keys))]
        elif keys:
            node[draw(st.sampled_from(keys))] = draw(values)
    return yaml.safe_dump(data, allow_unicode=True, sort_keys=False).encode("utf-8", "surrogatepass")


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def _load_or_recipe_error(folder: Path, data: bytes) -> None:
    path = folder / "fuzz.yaml"
    path.write_bytes(data)
    try:
        api.load(path)  # parse, validate each stage's config, build the DAG: what `zoo validate` does
    except RecipeError as e:
        assert str(path) in e.message  # every refusal names the file (and, past reading it, a line)


@FUZZ
@given(text=yamlish)
def test_yamlish_text_loads_or_raises_recipe_error(workdir, text):
    _load_or_recipe_error(workdir, text.encode("utf-8", "surrogatepass"))


@FUZZ
@given(data=mutated_recipe())
def test_mutated_recipe_loads_or_raises_recipe_error(workdir, data):
    _load_or_recipe_error(workdir, data)


@FUZZ
@given(data=edited_recipe())
def test_edited_recipe_loads_or_raises_recipe_error(workdir, data):
    _load_or_recipe_error(workdir, data)


def test_shipped_recipes_load(workdir):
    """The mutation corpus itself is valid (else the mutated test only explores error paths)."""
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        assert api.load(path).recipe.name
