"""The recipe's `data:` section (DataSpec): fields per source, old spellings, errors at the YAML line."""

from __future__ import annotations

from pathlib import Path

import pytest

from zoo.errors import RecipeError
from zoo.engine.recipe import load
from zoo_stages.sections import data as data_section

HEAD = "schema_version: 1\nname: d\nversion: 1.0.0\n"
STAGES = "stages: {train: {}}\n"


def _load(tmp_path: Path, data: str, task: str = ""):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD + "data:\n" + data + STAGES + task)
    return path, load(path)


def _refused(tmp_path: Path, data: str, line: int, fragment: str) -> RecipeError:
    with pytest.raises(RecipeError) as e:
        _load(tmp_path, data)
    text = str(e.value) + " " + (e.value.hint or "")
    assert f"r.yaml:{line}:" in text and fragment in text, text
    return e.value


@pytest.mark.parametrize("data,line,fragment", [
    ("  source: digits\n  columns: [a]\n", 6, "`columns` does not apply to source digits (only to csv, parquet, jsonl)"),
    ("  source: digits\n  image: {size: [8, 8]}\n  image_size: 8\n", 7, "not both"),
    ("  source: digits\n  image: {size: [8, 8, 3]}\n", 6, "data.image.size"),
    ("  source: digits\n  image: {std: [0]}\n", 6, "std values must be positive"),
    ("  source: digits\n  image: {channels: 3, mean: [1, 2]}\n", 6, "give 1 or one per channel (3)"),
    ("  source: digits\n  image: {layuot: NHWC}\n", 6, "did you mean 'layout'"),
    ("  source: csv\n  path: t.csv\n  text: t\n", 5, "data.text needs data.tokenizer"),
    ("  source: csv\n  path: t.csv\n  max_length: 8\n", 7, "applies to text data only"),
    ("  source: csv\n  path: t.csv\n  text: t\n  tokenizer: {path: t.json, train: {}}\n", 8, "exactly one of"),
    ("  source: csv\n  path: t.csv\n  text: t\n  tokenizer: {path: nowhere.json}\n", 8, "data.tokenizer.path 'nowhere.json' does not exist"),
    ("  source: npz\n  path: t.csv\n  inputs: {a: [x]}\n", 7, "for npz, give the array's name"),
    ("  source: csv\n  path: t.csv\n  inputs: {a: x}\n", 7, "for tables, give a list of columns"),
    ("  source: csv\n  path: missing.csv\n", 6, "data.path 'missing.csv' does not exist"),
])
def test_bad_data_sections_point_at_the_yaml(tmp_path, data, line, fragment):
    (tmp_path / "t.csv").write_text("a,label\n1,0\n")
    _refused(tmp_path, data, line, fragment)


def test_defaults_per_source_and_label_null(tmp_path):
    (tmp_path / "t.csv").write_text("a,label\n1,0\n")
    _, r = _load(tmp_path, "  source: csv\n  path: t.csv\n")
    assert r.spec.data.label == "label"
    _, r = _load(tmp_path, "  source: csv\n  path: t.csv\n  label: null\n",
                 "task: generic\n")  # no labels: nothing tells the task train reads
    assert r.spec.data.label is None
    _, r = _load(tmp_path, "  source: digits\n")
    assert r.spec.data.label is None and r.spec.data.image is None
    _, r = _load(tmp_path, "  source: csv\n  path: t.csv\n  text: a\n  tokenizer: {train: {vocab_size: 100}}\n")
    assert r.spec.data.max_length == data_section.DEFAULT_MAX_LENGTH
    dumped = r.shared()["data"]
    assert data_section.DataSpec.model_validate(dumped).model_dump(mode="json") == dumped  # the dump validates to itself
