"""Text data: a trained WordPiece (identical bytes in two processes), a tokenizer file, the features."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zoo.errors import InvalidInput
from zoo_stages.lib.data import datasets
from zoo_stages.lib.data import text

REPO = Path(__file__).resolve().parents[1]
LANG = {"source": "csv", "path": "data/languages.csv", "text": "text", "label": "language", "max_length": 32,
        "tokenizer": {"train": {"model": "wordpiece", "vocab_size": 2000, "lowercase": True}}}


@pytest.fixture(autouse=True)
def fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def _corpus(tmp_path: Path) -> dict:
    words = ["alpha beta", "beta gamma", "gamma delta alpha", "Delta, epsilon!", "epsilon zeta eta", "theta alpha"]
    rows = [f'"{w} {i}",{"ab"[i % 2]}' for i, w in enumerate(words * 3)]
    (tmp_path / "t.csv").write_text("sentence,lang\n" + "\n".join(rows) + "\n")
    return {"source": "csv", "path": "t.csv", "text": "sentence", "label": "lang", "max_length": 6,
            "tokenizer": {"train": {"vocab_size": 60, "min_frequency": 1}}}


def test_trained_tokenizer_is_identical_across_processes():
    code = ("import sys; from pathlib import Path; from zoo_stages.lib.data import datasets; "
            f"sys.stdout.write(datasets.tokenizer_json({LANG!r}, Path({str(REPO / 'recipes')!r})))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] == datasets.tokenizer_json(LANG, REPO / "recipes")
    assert json.loads(runs[0])["model"]["type"] == "WordPiece"


def test_text_features_padding_truncation_and_record(tmp_path):
    spec = _corpus(tmp_path)
    train = datasets.load_split(spec, tmp_path, "train")
    ids, mask = train.features["input_ids"], train.features["attention_mask"]
    assert list(train.features) == ["input_ids", "attention_mask"]
    assert ids.shape == mask.shape == (len(train), 6) and ids.dtype == mask.dtype == np.int64
    assert np.all(ids[:, 0] == 2) and np.all(ids[mask == 0] == 0)  # [CLS] first, [PAD] (id 0) where masked
    assert mask.sum(1).max() == 6 and mask.sum(1).min() < 6  # truncated and padded samples
    # the shipped JSON reproduces the features
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(datasets.tokenizer_json(spec, tmp_path))
    idx = datasets._indices(datasets._key(spec, tmp_path))[0]
    texts = (tmp_path / "t.csv").read_text().splitlines()[1:]
    first = texts[int(idx[0])].rsplit(",", 1)[0].strip('"')
    assert tok.encode(first).ids == ids[0].tolist()
    record = datasets.preprocessing(spec, tmp_path)["text"]
    assert record["max_length"] == 6 and record["padding"] == {"side": "right", "to": "max_length", "token": "[PAD]", "id": 0}
    assert record["tokenizer"]["lowercase"] is True and record["tokenizer"]["vocab_size"] == datasets.vocab_size(spec, tmp_path)
    with_types = datasets.load_split({**spec, "token_type_ids": True}, tmp_path, "val")
    assert np.all(with_types.features["token_type_ids"] == 0)


def test_vocabulary_learner_is_frequency_first_with_text_ties():
    vocab = text.learn_wordpiece_vocab({"ab": 3, "ba": 3, "abc": 1}, vocab_size=12, min_frequency=1)
    assert vocab[:5] == list(text.SPECIAL_TOKENS)
    assert vocab[5:11] == ["##a", "##b", "##c", "a", "b", "ab"]  # ("a","##b") x4 beats ("b","##a") x3
    assert vocab[11] == "ba"  # then ("b","##a") x3 beats ("ab","##c") x1


def test_tokenizer_file_is_a_dependency_and_is_used(tmp_path):
    spec = _corpus(tmp_path)
    (tmp_path / "tok.json").write_text(datasets.tokenizer_json(spec, tmp_path))
    from_file = {**spec, "tokenizer": {"path": "tok.json"}}
    assert datasets.data_dependencies(from_file, tmp_path) == [(tmp_path / "t.csv").resolve(), (tmp_path / "tok.json").resolve()]
    a = datasets.load_split(spec, tmp_path, "val").features["input_ids"]
    b = datasets.load_split(from_file, tmp_path, "val").features["input_ids"]
    assert np.array_equal(a, b)
    assert datasets.preprocessing(from_file, tmp_path)["text"]["tokenizer"]["source"] == "file"
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(InvalidInput, match="data.tokenizer.path 'bad.json' is not a Hugging Face tokenizer.json"):
        datasets.load_split({**spec, "tokenizer": {"path": "bad.json"}}, tmp_path, "train")


def test_text_errors(tmp_path, monkeypatch):
    spec = _corpus(tmp_path)
    with pytest.raises(InvalidInput, match=r"data.text: 't.csv' has no column 'sentense' \(did you mean 'sentence'\?\)"):
        datasets.load_split({**spec, "text": "sentense"}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="data.columns is for tables of numbers"):
        datasets.load_split({**spec, "columns": ["sentence"]}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="no `data.text:`"):
        datasets.tokenizer_json({"source": "digits"}, tmp_path)
    for name in [m for m in sys.modules if m == "tokenizers" or m.startswith("tokenizers.")] + ["tokenizers"]:
        monkeypatch.setitem(sys.modules, name, None)  # stand-in: a host without the text extra
    with pytest.raises(InvalidInput, match="tokenizers") as e:
        datasets.load_split(spec, tmp_path, "train")
    assert "zoo-onnx[text]" in e.value.hint
