"""recipes/data/ is exactly what scripts/make_datasets.py writes, and the files load as recipes use them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from zoo_stages.lib.data import datasets

REPO = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("make_datasets", REPO / "scripts" / "make_datasets.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated() -> dict[str, bytes]:
    return _script().files()


@pytest.mark.parametrize("name", ["breast-cancer.csv", "languages.csv", "README.md"])
def test_committed_file_equals_the_script_output(generated, name):
    committed = (REPO / "recipes" / "data" / name).read_bytes()
    assert committed == generated[name], f"recipes/data/{name} is stale: run scripts/make_datasets.py"
    assert len(committed) < 1_000_000


def test_no_other_files_in_recipes_data(generated):
    assert sorted(p.name for p in (REPO / "recipes" / "data").iterdir()) == sorted(generated)


def test_breast_cancer_loads_as_a_table():
    datasets.clear_cache()
    data = {"source": "csv", "path": "data/breast-cancer.csv", "label": "target"}
    train = datasets.load_split(data, REPO / "recipes", "train")
    assert train.features["features"].shape[1] == 30
    assert datasets.class_names(data, REPO / "recipes") == ["benign", "malignant"]
    assert datasets.split_info(data, REPO / "recipes")["num_samples"] == 569


def test_languages_have_no_name_in_two_languages():
    import csv

    with open(REPO / "recipes" / "data" / "languages.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    langs = {}
    for row in rows:
        langs.setdefault(row["text"].casefold(), set()).add(row["language"])
    assert all(len(v) == 1 for v in langs.values())
    assert {r["language"] for r in rows} == {"en", "de", "fr", "es", "it", "pt", "nl", "sv"}
