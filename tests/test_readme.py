"""README.md as a newcomer reads it: short, its links resolve (files and anchors, as GitHub
renders them), and its recipe for your own CSV validates and runs exactly as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cli_helpers import zoo
from conftest import REPO
from docs_helpers import blocks, broken_links, command_lines, iris_csv

README = REPO / "README.md"
TEXT = README.read_text(encoding="utf-8")


def _section(heading: str) -> str:
    start = TEXT.index(f"\n{heading}\n")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start:end if end != -1 else len(TEXT)]


def test_the_readme_is_short():
    assert len(TEXT.splitlines()) <= 260, "README.md is for the first hour: move reference text into docs/"


def test_every_relative_link_of_the_readme_resolves():
    assert broken_links(README, REPO) == []


def test_the_link_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## Some `code` here\n")
    md = tmp_path / "README.md"
    md.write_text("[ok](docs/a.md#some-code-here) [gone](docs/b.md) [no anchor](docs/a.md#nowhere)\n"
                  "`[in code](docs/c.md)` [web](https://example.com/x.md)\n")
    assert broken_links(md, tmp_path) == ["README.md:1: docs/b.md: no such file",
                                          "README.md:1: docs/a.md#nowhere: a.md has no heading #nowhere"]


def _csv_example() -> tuple[str, list[list[str]]]:
    """The README's CSV recipe and the `zoo` commands under it."""
    section = blocks(_section("## Your own data: a CSV"))
    recipe = next(b for b in section if b.lang == "yaml")
    shell = next(b for b in section if b.lang == "bash")
    return recipe.body, command_lines(shell)


def test_the_csv_example_is_about_fifteen_lines_and_names_its_commands():
    recipe, commands = _csv_example()
    assert len(recipe.splitlines()) <= 18
    assert [c[0] for c in commands] == ["validate", "run", "pull"]


@pytest.mark.slow
def test_the_readme_csv_recipe_validates_and_runs_as_written(tmp_path):
    recipe, commands = _csv_example()
    (tmp_path / "recipe.yaml").write_text(recipe)
    iris_csv(tmp_path / "iris.csv")
    outputs = []
    for args in commands:
        r = zoo(*args, cwd=tmp_path, timeout=900)
        assert r.code == 0, f"zoo {' '.join(args)}:\n{r.text}"
        outputs.append(r)
    assert "iris-forest@0.1.0" in outputs[1].text and "published" in outputs[1].text
    pulled = Path(outputs[2].out.strip().splitlines()[-1])
    assert pulled.name == "model.onnx" and pulled.is_file()
    # the model it published takes the four measurements and answers one of the three species
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(pulled), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: np.array([[5.1, 3.5, 1.4, 0.2]], dtype=np.float32)}
    label = session.run(None, feed)[0]
    assert label.shape == (1,)


def test_the_csv_recipe_fails_validation_when_the_label_column_is_misspelt(tmp_path):
    """The check the README promises (`zoo validate`: the recipe and its data) is a real one."""
    recipe, _ = _csv_example()
    (tmp_path / "recipe.yaml").write_text(re.sub(r"label: species", "label: specie", recipe))
    iris_csv(tmp_path / "iris.csv")
    r = zoo("validate", "recipe.yaml", cwd=tmp_path)
    assert r.code == 2, r.text
