"""recipes/data/ is exactly what scripts/make_datasets.py writes, and the files load as recipes use them."""

from __future__ import annotations

import importlib.util
import json
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


@pytest.mark.parametrize("name", ["breast-cancer.csv", "languages.csv", "pydoc-topics.jsonl", "README.md"])
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


def test_the_pydoc_corpus_is_the_recorded_pythons_topics():
    """The corpus's bytes are those README.md records (version, sha256); on that CPython they are
    its `pydoc_data.topics` exactly (another version's topics differ, so only the digest is checked)."""
    import hashlib
    import platform

    script = _script()
    committed = (REPO / "recipes" / "data" / script.PYDOC_FILE).read_bytes()
    version, digest = script.pydoc_source((REPO / "recipes" / "data" / "README.md").read_text(encoding="utf-8"))
    assert hashlib.sha256(committed).hexdigest() == digest
    lines = committed.decode("utf-8").splitlines()
    assert len(lines) > 50 and sum(len(json.loads(line)["text"].split()) for line in lines) > 60_000
    if platform.python_version() == version:
        assert committed == script.pydoc_topics()


def test_the_pydoc_corpus_loads_as_documents():
    datasets.clear_cache()
    data = {"source": "text", "path": "data/pydoc-topics.jsonl", "tokenizer": {"train": {"vocab_size": 300}}}
    assert datasets.split_info(data, REPO / "recipes")["num_samples"] == 79
