"""Tables (CSV, Parquet, JSON lines) and npz archives of named arrays: features, labels, errors."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from zoo.errors import InvalidInput
from zoo_stages.lib.data import datasets


@pytest.fixture(autouse=True)
def fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def _rows(n=20):
    rng = np.random.default_rng(0)
    a, b, c = rng.normal(5, 2, n), rng.normal(-1, 3, n), rng.integers(0, 9, n)
    labels = ["cat" if i % 3 else "ant" for i in range(n)]
    return a, b, c, labels


def _write_csv(path, n=20):
    a, b, c, labels = _rows(n)
    lines = ["a,b,c,kind,score"] + [f"{float(a[i])!r},{float(b[i])!r},{c[i]},{labels[i]},{i / 10}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return a, b, c, labels


def test_csv_columns_labels_and_order(tmp_path):
    a, b, c, labels = _write_csv(tmp_path / "t.csv")
    spec = {"source": "csv", "path": "t.csv", "label": "kind", "columns": ["c", "a"], "input": "x"}
    train = datasets.load_split(spec, tmp_path, "train")
    val = datasets.load_split(spec, tmp_path, "val")
    assert list(train.features) == ["x"] and train.features["x"].shape == (16, 2)
    assert train.features["x"].dtype == np.float32 and train.labels.dtype == np.int64
    assert datasets.class_names(spec, tmp_path) == ["ant", "cat"]  # sorted names -> indices
    train_idx, val_idx = datasets._indices(datasets._key(spec, tmp_path))
    assert np.allclose(train.features["x"], np.stack([c, a], 1)[train_idx].astype(np.float32))
    assert [["ant", "cat"][i] for i in val.labels] == [labels[i] for i in val_idx]
    # stratified: 20 * 0.2 = 4 held out; ants are 7 of 20 -> 1 (largest remainder), cats 3
    assert sorted(val.labels.tolist()) == [0, 1, 1, 1]


def test_default_columns_regression_and_several_inputs(tmp_path):
    _write_csv(tmp_path / "t.csv")
    spec = {"source": "csv", "path": "t.csv", "label": "score", "columns": ["a", "b"]}
    train = datasets.load_split(spec, tmp_path, "train")
    assert train.labels.dtype == np.float32  # float label: regression
    info = datasets.split_info(spec, tmp_path)
    assert info["labels"] == "values" and info["method"] == "sha256-shuffle" and info["num_classes"] == 0
    assert datasets.class_names(spec, tmp_path) == []
    several = {"source": "csv", "path": "t.csv", "label": None, "inputs": {"left": ["a"], "right": ["b", "c"]}}
    split = datasets.load_split(several, tmp_path, "train")
    assert split.labels is None and {k: v.shape for k, v in split.features.items()} == {"left": (16, 1), "right": (16, 2)}
    # default: every column but the label; text columns refused
    with pytest.raises(InvalidInput, match="data.columns: column 'kind' of 't.csv' holds text"):
        datasets.load_split({"source": "csv", "path": "t.csv", "label": "score"}, tmp_path, "train")


def test_a_stray_word_in_a_number_column_is_the_value_the_error_quotes(tmp_path):
    rows = ["x,y"] + [f"{i}.5,{i % 2}" for i in range(20)]
    rows[7] = "abc,1"  # one word among numbers: the reader keeps the column as text
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(InvalidInput, match=r"column 'x' of 't.csv' holds text, not numbers \(e.g. 'abc'\)"):
        datasets.load_split({"source": "csv", "path": "t.csv", "label": "y"}, tmp_path, "train")


def test_standard_normalisation_uses_the_train_split_only(tmp_path):
    a, b, c, _ = _write_csv(tmp_path / "t.csv")
    spec = {"source": "csv", "path": "t.csv", "label": "kind", "columns": ["a", "b"], "normalize": "standard"}
    train = datasets.load_split(spec, tmp_path, "train").features["features"]
    val = datasets.load_split(spec, tmp_path, "val").features["features"]
    train_idx, val_idx = datasets._indices(datasets._key(spec, tmp_path))
    raw = np.stack([a, b], 1).astype(np.float32).astype(np.float64)
    mean, std = raw[train_idx].mean(0), raw[train_idx].std(0)
    assert np.allclose(train, (raw[train_idx] - mean) / std, atol=1e-5)
    assert np.allclose(val, (raw[val_idx] - mean) / std, atol=1e-5)  # the train statistics, not val's
    assert not np.allclose(val.mean(0), 0, atol=1e-3)
    record = datasets.preprocessing(spec, tmp_path)["table"]["features"]["features"]
    assert record["columns"] == ["a", "b"]
    assert np.allclose([record["normalize"]["mean"]["a"], record["normalize"]["std"]["b"]], [mean[0], std[1]])
    json.dumps(record)


def test_parquet_and_jsonl_give_the_csv_features(tmp_path):
    a, b, c, labels = _write_csv(tmp_path / "t.csv")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": a, "b": b, "c": c, "kind": labels}), tmp_path / "t.parquet")
    with open(tmp_path / "t.jsonl", "w") as f:
        for i in range(len(a)):
            f.write(json.dumps({"a": float(a[i]), "b": float(b[i]), "c": int(c[i]), "kind": labels[i]}) + "\n")
    base = {"label": "kind", "columns": ["a", "b", "c"]}
    ref = datasets.load_split({"source": "csv", "path": "t.csv", **base}, tmp_path, "train")
    for source in ("parquet", "jsonl"):
        got = datasets.load_split({"source": source, "path": f"t.{source}", **base}, tmp_path, "train")
        assert np.array_equal(got.features["features"], ref.features["features"]) and np.array_equal(got.labels, ref.labels)


def test_parquet_without_pyarrow_names_the_extra_with_a_stand_in_missing_package(tmp_path, monkeypatch):
    """Stand-in: pyarrow is hidden from the import system (sys.modules entries None), as on a host without it."""
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")] + ["pyarrow", "pyarrow.parquet"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(InvalidInput, match="pyarrow") as e:
        datasets.load_split({"source": "parquet", "path": "t.parquet", "label": None}, tmp_path, "train")
    assert "zoo-onnx[tables]" in e.value.hint


def test_table_errors_name_the_field(tmp_path):
    _write_csv(tmp_path / "t.csv")
    with pytest.raises(InvalidInput, match=r"data.columns: 't.csv' has no column 'bb' \(did you mean 'b'\?\)"):
        datasets.load_split({"source": "csv", "path": "t.csv", "label": "kind", "columns": ["a", "bb"]}, tmp_path, "train")
    with pytest.raises(InvalidInput, match=r"data.label: 't.csv' has no column 'label'"):
        datasets.load_split({"source": "csv", "path": "t.csv"}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="is the label column"):
        datasets.load_split({"source": "csv", "path": "t.csv", "label": "a", "columns": ["a"]}, tmp_path, "train")
    (tmp_path / "nan.csv").write_text("a,y\n1,0\n,1\n3,0\n4,1\n")
    with pytest.raises(InvalidInput, match=r"data.columns: column 'a' .* 1 missing, NaN or infinite value\(s\) \(first at data row 2\)"):
        datasets.load_split({"source": "csv", "path": "nan.csv", "label": "y"}, tmp_path, "train")
    (tmp_path / "ragged.csv").write_text("a,y\n1,0\n2\n")
    with pytest.raises(InvalidInput, match="line 3 has 1 fields, the header 2"):
        datasets.load_split({"source": "csv", "path": "ragged.csv", "label": "y"}, tmp_path, "train")


def test_npz_named_arrays_mapping_and_label_less(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (12, 7)).astype(np.int64)
    mask = np.ones((12, 7), np.int64)
    np.savez(tmp_path / "m.npz", input_ids=ids, attention_mask=mask, target=np.arange(12) % 3)
    spec = {"source": "npz", "path": "m.npz", "label": "target", "val_fraction": 0.25}
    train = datasets.load_split(spec, tmp_path, "train")
    assert sorted(train.features) == ["attention_mask", "input_ids"] and train.features["input_ids"].dtype == np.int64
    idx = datasets._indices(datasets._key(spec, tmp_path))[0]
    assert np.array_equal(train.features["input_ids"], ids[idx]) and np.array_equal(train.labels, (np.arange(12) % 3)[idx])
    mapped = {"source": "npz", "path": "m.npz", "label": None, "inputs": {"tokens": "input_ids"}}
    split = datasets.load_split(mapped, tmp_path, "train")
    assert list(split.features) == ["tokens"] and split.labels is None
    assert datasets.preprocessing(mapped, tmp_path)["arrays"]["tokens"]["shape"] == [7]
    with pytest.raises(InvalidInput, match=r"data.inputs.tokens: 'm.npz' has no array 'input_id' \(did you mean 'input_ids'\?\)"):
        datasets.load_split({**mapped, "inputs": {"tokens": "input_id"}}, tmp_path, "train")
    np.savez(tmp_path / "ragged.npz", a=np.zeros((5, 2)), b=np.zeros((4, 2)), y=np.arange(5) % 2)
    with pytest.raises(InvalidInput, match=r"different numbers of samples \(a: 5, b: 4\)"):
        datasets.load_split({"source": "npz", "path": "ragged.npz"}, tmp_path, "train")
    np.savez(tmp_path / "short.npz", a=np.zeros((5, 2)), y=np.arange(4) % 2)
    with pytest.raises(InvalidInput, match=r"data.label: the array 'y' .* expected \(5,\)"):
        datasets.load_split({"source": "npz", "path": "short.npz"}, tmp_path, "train")
    with pytest.raises(InvalidInput, match="data.image: 'short.npz' has no image array"):
        datasets.load_split({"source": "npz", "path": "short.npz", "image": {"size": [2, 2]}}, tmp_path, "train")
