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
