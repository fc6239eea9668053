"""A corpus of bad recipes: each must fail with file:line, a helpful message and exit code 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli_helpers import zoo

CORPUS = sorted((Path(__file__).parent / "data" / "bad_recipes").glob("*.yaml"))


def _expectation(path: Path) -> tuple[int, str]:
    m = re.match(r"# expect: (\d+): (.*)", path.read_text().splitlines()[0])
    assert m, f"{path.name} lacks its '# expect: LINE: text' header"
    return int(m.group(1)), m.group(2)


def test_corpus_is_not_empty():
    assert len(CORPUS) >= 12


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_recipe_points_at_the_line(path: Path):
    line, fragment = _expectation(path)
    result = zoo("validate", path)
    assert result.code == 2, result.text
    assert f"{path}:{line}:" in result.err, result.err
    assert fragment in result.err, result.err
    assert "Traceback" not in result.text
    # the offending line is shown with a marker
    assert re.search(rf">\s+{line} \|", result.err), result.err


def test_run_and_plan_reject_bad_recipes_too():
    path = next(p for p in CORPUS if p.stem == "unknown_key")
    for command in ("run", "plan", "status"):
        result = zoo(command, path)
        assert result.code == 2, (command, result.text)
        assert "did you mean 'repeat'" in result.err


def test_debug_variable_shows_traceback():
    path = next(p for p in CORPUS if p.stem == "unknown_kind")
    result = zoo("validate", path, env={"ZOO_DEBUG": "1"})
    assert result.code != 0
    assert "Traceback" in result.err


def test_missing_recipe_file(tmp_path):
    result = zoo("validate", tmp_path / "nope.yaml")
    assert result.code == 2
    assert "no such file" in result.err


# --- hostile and malformed inputs (issue #11, "The recipe parser") ----------------------------
# Each went through `zoo validate` with a crash (exit 139), a traceback (exit 1), a hang, a memory
# blow-up or a wrong "ok"; each must now be exit 2 with file:line:col, the field and a hint.

HEAD = "schema_version: 1\nname: hostile\nversion: 1.0.0\n"
# export reads `task:`, which a recipe without data or model must give; last, so lines stay put
TASK = "task: generic\n"


def _refused(tmp_path: Path, data: bytes | str, line: int, fragment: str, field: str | None = None):
    path = tmp_path / "hostile.yaml"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    result = zoo("validate", path, timeout=120)
    assert result.code == 2, result.text[-3000:]
    assert "Traceback" not in result.text
    assert f"{path}:{line}:" in result.err, result.err[:3000]
    assert fragment in result.err, result.err[:3000]
    if field is not None:
        assert f"in {field}" in result.err, result.err[:3000]
    assert "\nhint: " in result.err, result.err[:3000]
    return result


@pytest.mark.parametrize("depth", [30_000, 3_000])
def test_deep_nesting_is_refused_not_a_crash(tmp_path, depth):
    # 30,000 unclosed `[` overflowed libyaml's recursive composer (segfault, exit 139);
    # 3,000 balanced ones raised RecursionError in Python
    closing = "]" * depth if depth < 10_000 else ""
    text = HEAD + "stages:\n  train:\n    config: {x: " + "[" * depth + closing + "}\n"
    _refused(tmp_path, text, 6, "nests deeper than 64 levels", field="stages.train.config.x")


def test_deep_nesting_through_aliases_is_refused(tmp_path):
    # each anchor is shallow, but every alias adds the depth of the node it names
    nest = 30
    text = HEAD + f"a0: &a0 {'[' * nest}1{']' * nest}\n"
    text += f"a1: &a1 {'[' * nest}*a0 {']' * nest}\n"  # 61 levels: allowed
    text += f"a2: &a2 {'[' * nest}*a1 {']' * nest}\n"  # 92 levels
    text += "stages: {train: {}}\n"
    _refused(tmp_path, text, 6, "through this alias", field="a2")


def test_billion_laughs_is_refused_quickly(tmp_path):
    # 491 bytes that expand to 9^9 values: ran past 10 s and exhausted memory
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for prev, name in zip("abcdefgh", "bcdefghi"):
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
    result = _refused(tmp_path, text, 7, "expands to more than 1,000,000 values", field="g")
    assert "aliases" in result.err


def test_huge_matrix_is_refused_before_expanding(tmp_path):
    # four axes of 60 values: 13 million instances, over 1 GiB before the fix
    values = "[" + ",".join(str(i) for i in range(60)) + "]"
    text = HEAD + f"stages:\n  train:\n    matrix: {{a: {values}, b: {values}, c: {values}, d: {values}}}\n"
    result = _refused(tmp_path, text, 6, "expands to 12,960,000 instances (60 x 60 x 60 x 60)",
                      field="stages.train.matrix")
    assert "at most 256" in result.err


def test_a_matrix_at_the_limit_is_fine(tmp_path):
    values = "[" + ",".join(str(i) for i in range(16)) + "]"
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + f"stages:\n  export:\n    matrix: {{a: {values}, b: {values}}}\n" + TASK)
    result = zoo("validate", path)
    assert result.code == 0, result.err
    assert "256 stages" in result.out


def test_a_file_over_the_size_limit_is_refused(tmp_path):
    # a valid recipe padded with a 5 MB comment: refused before parsing
    text = HEAD + "stages: {train: {}}\n# " + "x" * (5 * 1024 * 1024) + "\n"
    _refused(tmp_path, text, 1, "larger than 4 MiB")


@pytest.mark.parametrize("data,line,fragment,field", [
    (HEAD.encode() + b"description: caf\xe9\nstages: {train: {}}\n", 4, "invalid UTF-8: byte 0xe9", "description"),
    (HEAD + 'description: "caf\u00e9 \x01"\nstages: {train: {}}\n', 4, "control characters are not allowed", "description"),
    (HEAD + "description: !custom hello\nstages: {train: {}}\n", 4, "unsupported tag !custom", "description"),
    (HEAD + "stages:\n  train: !custom {config: {}}\n", 5, "unsupported tag !custom on a mapping", "stages.train"),
    (HEAD + "description: !!binary 'a'\nstages: {train: {}}\n", 4, "unsupported tag !!binary on a scalar", None),
    (HEAD + "description: 2001-02-30\nstages: {train: {}}\n", 4, "day is out of range for month", "description"),
    (HEAD + "description: " + "9" * 4400 + "\nstages: {train: {}}\n", 4, "a number of 4,400 characters is too long",
     "description"),
    # base-60 integers: "1:0:0:…" converts in quadratic time (a hang) unless its length is bounded
    (HEAD + "description: 1" + ":0" * 200_000 + "\nstages: {train: {}}\n", 4, "too long", "description"),
    (HEAD + "description: &r {a: *r}\nstages: {train: {}}\n", 4, "recursive alias", "description.a"),
    (HEAD + "stages:\n  train:\n    config: {epochs: !!int ''}\n", 6, "'' is not a valid int", "stages.train.config.epochs"),
    (HEAD + "description: *nowhere\nstages: {train: {}}\n", 4, "names no anchor", "description"),
], ids=["invalid-utf8", "control-char", "custom-tag", "custom-tag-on-mapping", "bad-binary", "bad-date", "4400-digits",
        "base60-hang", "recursive-alias", "explicit-tag-mismatch", "unknown-alias"])
def test_malformed_values_are_errors_not_tracebacks(tmp_path, data, line, fragment, field):
    _refused(tmp_path, data, line, fragment, field)


@pytest.mark.parametrize("value,line,field", [
    ("{name: adam, lr: 1e999}", 7, "stages.train.config.optimizer.lr"),  # a string to YAML, infinity to pydantic
    ("{name: adam, lr: 1.0e999}", 7, "stages.train.config.optimizer.lr"),  # a YAML float that overflows
    ("{name: adam, lr: .inf}", 7, "stages.train.config.optimizer.lr"),
    ("{name: adam, lr: inf}", 7, "stages.train.config.optimizer.lr"),
])
def test_non_finite_numbers_are_refused(tmp_path, value, line, field):
    text = HEAD + f"stages:\n  train:\n    config:\n      optimizer: {value}\n"
    _refused(tmp_path, text, line, "not a finite number", field)


def test_non_finite_numbers_are_refused_anywhere(tmp_path):
    # a matrix value is not checked by any float field: NaN passed validation before
    text = HEAD + "stages:\n  export:\n    matrix: {x: [1, .nan]}\n"
    _refused(tmp_path, text, 6, "not a finite number", "stages.export.matrix.x.1")


@pytest.mark.parametrize("data,fragment,line", [
    ("{source: npz, path: missing.npz}", "data.path 'missing.npz' does not exist", 4),
    ("{source: folder, path: images}", "data.path 'images' does not exist", 4),
    ("{source: folder, path: recipe.yaml}", "data.path 'recipe.yaml' is not a folder", 4),
    ("{source: npz}", "data.path is required when data.source is 'npz'", 4),
])
def test_missing_data_files_are_reported_by_validate(tmp_path, data, fragment, line):
    (tmp_path / "recipe.yaml").write_text("placeholder")
    _refused(tmp_path, HEAD + f"data: {data}\nstages: {{train: {{}}}}\n", line, fragment)


def test_data_path_is_relative_to_the_recipe(tmp_path, monkeypatch):
    import numpy as np

    folder = tmp_path / "project"
    folder.mkdir()
    np.savez(folder / "d.npz", x=np.zeros((4, 8, 8), np.uint8), y=np.arange(4) % 2)
    path = folder / "r.yaml"
    path.write_text(HEAD + "data: {source: npz, path: d.npz}\nstages: {train: {}}\n")
    result = zoo("validate", path, cwd=tmp_path)  # not the recipe's folder
    assert result.code == 0, result.err


def test_a_thousand_stage_recipe_validates(tmp_path):
    # each stage needs every earlier one: 500,000 edges (18.7 s before the fix; the DAG was O(n^3))
    lines = [HEAD, "stages:\n"]
    for i in range(1000):
        lines.append(f"  s{i}:\n    kind: export\n    needs: [{', '.join(f's{j}' for j in range(i))}]\n")
    path = tmp_path / "big.yaml"
    path.write_text("".join(lines) + TASK)
    result = zoo("validate", path, timeout=300)
    assert result.code == 0, result.err[-2000:]
    assert "1000 stages: s0, s1, s2" in result.out and result.out.rstrip().endswith("s998, s999")


def test_topological_sort_reads_each_needs_list_once():
    """The DAG order costs O(edges): Kahn's rounds used to re-scan every waiting stage's needs."""
    from zoo.engine import planner, recipe as recipe_mod

    class CountingList(list):
        iterations = 0

        def __iter__(self):
            CountingList.iterations += 1
            return super().__iter__()

    path = Path(__file__).parent / "data" / "chain.yaml"
    n = 200
    lines = [HEAD, "stages:\n"] + [f"  s{i}:\n    kind: export\n    needs: [{', '.join(f's{j}' for j in range(i))}]\n"
                                   for i in range(n)] + [TASK]
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "chain.yaml"
        path.write_text("".join(lines))
        dag = planner.build(recipe_mod.load(path))
        nodes = {nid: planner.Node(node.instance, CountingList(node.needs), node.cache_policy)
                 for nid, node in reversed(dag.nodes.items())}  # worst case: dependents first
        CountingList.iterations = 0
        ordered = planner._toposort(nodes, dag.recipe)
    assert list(ordered) == [f"s{i}" for i in range(n)]
    assert CountingList.iterations <= 2 * n  # the quadratic version iterated n*(n+1)/2 = 20,100 times


def test_repeated_needs_are_expanded_once(tmp_path, monkeypatch):
    """`needs: [a, a, …]`: each instance matched the same needed stage once per repeat (100,000
    repeats on a 256-instance matrix hung `zoo validate`)."""
    from zoo.engine import planner, recipe as recipe_mod

    calls = []
    original = planner._matched
    monkeypatch.setattr(planner, "_matched", lambda inst, upstream: calls.append(inst.id) or original(inst, upstream))
    values = "[" + ", ".join(str(i) for i in range(16)) + "]"
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + f"stages:\n  a:\n    kind: export\n    matrix: {{x: {values}}}\n"
                    f"  b:\n    kind: export\n    matrix: {{y: {values}}}\n    needs: [{', '.join(['a'] * 1000)}]\n" + TASK)
    dag = planner.build(recipe_mod.load(path))
    assert dag.nodes["b[3]"].needs == [f"a[{i}]" for i in range(16)]
    assert len(calls) == 16  # once per instance of b, not once per repeat (16,000)


@pytest.mark.parametrize("nesting", [5_000, 500_000])  # 500,000: libyaml's composer would crash the process
def test_a_hostile_lockfile_is_an_error_not_a_crash(tmp_path, nesting):
    """A lockfile nested far deeper than zoo writes gives exit 2 naming the file, never a traceback."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("schema_version: 1\nname: r\nversion: 1.0.0\nstages:\n  w: {kind: writer}\n")
    (tmp_path / "r.lock").write_text("schema_version: 2\nstages: " + "[" * nesting + "]" * nesting + "\n")
    r = zoo("plan", recipe)
    assert r.code == 2, r.text
    assert "r.lock: unreadable lockfile" in r.err and "Traceback" not in r.err
