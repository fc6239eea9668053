"""train and export for any model: an mlp on a real table (classification and regression), a tiny
BERT on a synthetic token task (two int64 inputs, dynamic batch and sequence), a non-square LeNet,
and the pass-through of an existing multi-input ONNX model.

The tabular and text data come from a stand-in `datasets.load_split` (`stand_in_data`): Splits
built here, as the data helper's npz/CSV/text sources give them, so these tests exercise train and
export alone."""

from __future__ import annotations

import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra; the torch-free tests are in test_train_export_spec.py")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from onnx_models import multi_io_feeds, multi_io_model  # noqa: E402
from zoo.errors import InvalidInput  # noqa: E402
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream  # noqa: E402
from zoo_stages.export import Export  # noqa: E402
from zoo_stages.lib.data import datasets
from zoo_stages.lib.models import archs  # noqa: E402
from zoo_stages.lib.data.datasets import Split  # noqa: E402
from zoo_stages.train import Train  # noqa: E402

MLP = {"arch": "mlp", "num_classes": 2, "hidden": [64, 32]}
BERT = {"arch": "bert", "num_classes": 2, "hidden_size": 32, "num_layers": 2, "num_heads": 2,
        "intermediate_size": 64, "max_length": 16, "vocab_size": 40}
TRAIN = {"epochs": 3, "batch_size": 32, "optimizer": {"name": "adam", "lr": 3e-3}, "seed": 0, "threads": 1}


def _splits(features: dict[str, np.ndarray], labels: np.ndarray, n_val: int) -> dict[str, Split]:
    def part(sl):
        out = Split({k: v[sl] for k, v in features.items()}, labels[sl])
        for a in (*out.features.values(), out.labels):
            a.setflags(write=False)  # read-only, as the cached splits are
        return out
    return {"train": part(slice(n_val, None)), "val": part(slice(0, n_val))}


def _standardised(x: np.ndarray) -> np.ndarray:
    return ((x - x.mean(0)) / x.std(0)).astype(np.float32)


def _cancer() -> dict[str, Split]:
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return _splits({"features": _standardised(x)[order]}, y[order].astype(np.int64), 114)


def _diabetes() -> dict[str, Split]:
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    return _splits({"features": _standardised(x)}, (y / 100).astype(np.float32), 88)


def _tokens(n: int = 320, length: int = 12, vocab: int = 40) -> dict[str, Split]:
    """Padded token sequences (1 = [CLS], 0 = padding) of random length; the label says whether
    token 5 occurs in the sequence."""
    rng = np.random.default_rng(0)
    ids = np.zeros((n, length), dtype=np.int64)
    mask = np.zeros((n, length), dtype=np.int64)
    labels = np.zeros(n, dtype=np.int64)
    for i in range(n):
        size = int(rng.integers(4, length + 1))
        ids[i, 0], ids[i, 1:size] = 1, rng.integers(6, vocab, size - 1)
        if i % 2:
            ids[i, int(rng.integers(1, size))] = 5
        mask[i, :size] = 1
        labels[i] = int((ids[i, :size] == 5).any())
    return _splits({"input_ids": ids, "attention_mask": mask}, labels, 64)


def _nonsquare_digits() -> dict[str, Split]:
    """The 8x8 digits cut to 8 rows x 6 columns (NCHW, in [0, 1])."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images[:, None, :, 1:7] / 16).astype(np.float32)
    return _splits({"image": x}, d.target.astype(np.int64), 360)


TABLES = {"cancer.npz": _cancer, "diabetes.npz": _diabetes, "tokens.npz": _tokens, "digits86.npz": _nonsquare_digits}


@pytest.fixture
def stand_in_data(monkeypatch):
    """Stand-in: `datasets.load_split` (and split_info, data_dependencies) serve the Splits built
    above, by `data.path`."""
    built: dict[str, dict[str, Split]] = {}

    def load_split(data, recipe_dir, split):
        name = data["path"]
        if name not in built:
            built[name] = TABLES[name]()
        return built[name][split]

    monkeypatch.setattr(datasets, "load_split", load_split)
    monkeypatch.setattr(datasets, "split_info", lambda data, recipe_dir: {"source": "stand-in", "path": data["path"]})
    monkeypatch.setattr(datasets, "data_dependencies", lambda data, recipe_dir: [])
    return load_split


def _ctx(tmp, name, model, data, task="classification") -> StageContext:
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp / "recipe.yaml", digest="x")
    return StageContext(stage_id=name, out_dir=tmp / name / "out", work_dir=tmp / name / "work", recipe=recipe,
                        shared={"data": data, "model": model, "task": task}, matrix={}, threads=1)


def _upstream(path) -> Inputs:
    return Inputs([Upstream(stage_id="train", kind="train", outputs={"checkpoint": path}, metrics={})])


def _train(tmp, name, model, data, task="classification", **config):
    ctx = _ctx(tmp, name, model, data, task)
    out = Train().run(Inputs([]), Train.Config.model_validate({**TRAIN, **config}), ctx)
    return out["checkpoint"], ctx.metrics


def _export(tmp, name, ckpt, model, data, task="classification", **config):
    ctx = _ctx(tmp, name, model, data, task)
    path = Export().run(_upstream(ckpt), Export.Config.model_validate(config), ctx)["model"]
    return path, ctx.metrics


def _torch_model(ckpt, model, **sizes):
    from zoo_stages.lib.models import checkpoints

    return checkpoints.build_with_weights(model, ".", ckpt, "checkpoint", **sizes)


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------------------------
# mlp on a table


def test_mlp_classifier_on_a_table_is_deterministic_and_exports_with_parity(tmp_path, stand_in_data):
    data = {"source": "npz", "path": "cancer.npz"}
    ckpt, metrics = _train(tmp_path, "a", MLP, data)
    again, _ = _train(tmp_path, "b", MLP, data)
    assert again.read_bytes() == ckpt.read_bytes()
    assert metrics["val_accuracy"] > 0.9 and metrics["samples"] == 455  # breast cancer: 569 samples, 114 held out
    assert {"train_loss", "train_accuracy", "val_loss"} <= set(metrics) and "val_mae" not in metrics
    assert metrics["num_parameters"] == 30 * 64 + 64 + 64 * 32 + 32 + 32 * 2 + 2

    path, exported = _export(tmp_path, "e", ckpt, MLP, data)
    assert exported["parity"]["passed"] is True and exported["input_shapes"] == {"features": ["batch", 30]}
    model = onnx.load(str(path))
    assert model.ir_version <= 13 and [i.name for i in model.graph.input] == ["features"]
    val = stand_in_data(data, tmp_path, "val")
    logits = _session(path).run(None, {"features": np.array(val.features["features"])})[0]
    net = _torch_model(ckpt, MLP, in_features=30)
    with torch.no_grad():
        expected = net(torch.from_numpy(np.array(val.features["features"]))).numpy()
    assert np.allclose(logits, expected, atol=1e-5)
    assert abs((logits.argmax(1) == val.labels).mean() - metrics["val_accuracy"]) < 1e-6  # metrics keep 6 digits


def test_mlp_regression_trains_with_mse_and_reports_mae(tmp_path, stand_in_data):
    data = {"source": "npz", "path": "diabetes.npz"}
    model = {"arch": "mlp", "hidden": [32]}
    ckpt, metrics = _train(tmp_path, "r", model, data, task="tabular-regression", epochs=30, batch_size=64)
    assert {"train_loss", "val_loss", "val_mae"} <= set(metrics)
    assert not {"train_accuracy", "val_accuracy"} & set(metrics)
    val = stand_in_data(data, tmp_path, "val")
    baseline = float(np.abs(val.labels - val.labels.mean()).mean())  # predicting the mean
    assert metrics["val_mae"] < 0.85 * baseline
    path, exported = _export(tmp_path, "e", ckpt, model, data, task="tabular-regression")
    assert exported["parity"]["passed"] is True
    out = _session(path).run(None, {"features": np.array(val.features["features"])})[0]
    assert out.shape == (len(val), 1)
    assert abs(np.abs(out[:, 0] - val.labels).mean() - metrics["val_mae"]) < 1e-5


def test_a_classification_task_refuses_float_labels(tmp_path, stand_in_data):
    with pytest.raises(InvalidInput, match="integer class labels") as err:
        _train(tmp_path, "c", MLP, {"source": "npz", "path": "diabetes.npz"}, task="classification", epochs=1)
    assert "regression" in err.value.hint


def test_entry_training_functions_receive_splits(tmp_path, stand_in_data):
    (tmp_path / "fit.py").write_text('''
import torch

def fit(model, train, val, config, context):
    context.metrics["seen"] = [sorted(train.features), len(train), len(val), str(train.labels.dtype)]
    x = torch.from_numpy(train.features["features"].copy())
    y = torch.from_numpy(train.labels.copy())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(50):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
''')
    _, metrics = _train(tmp_path, "u", MLP, {"source": "npz", "path": "cancer.npz"}, entry="fit.py:fit")
    assert metrics["seen"] == [["features"], 455, 114, "int64"]
    assert metrics["val_accuracy"] > 0.9 and metrics["history"] == []


# ---------------------------------------------------------------------------------------------
# a tiny BERT on token ids


@pytest.fixture
def bert_trained(tmp_path, stand_in_data):
    data = {"source": "npz", "path": "tokens.npz"}
    ckpt, metrics = _train(tmp_path, "bert", BERT, data, task="text-classification", epochs=4, batch_size=32,
                           optimizer={"name": "adamw", "lr": 3e-3})
    return tmp_path, data, ckpt, metrics


def test_bert_trains_deterministically_on_token_ids(bert_trained):
    tmp, data, ckpt, metrics = bert_trained
    assert metrics["val_accuracy"] > 0.8  # "does token 5 occur" is learnt in 4 short epochs
    again, _ = _train(tmp, "again", BERT, data, task="text-classification", epochs=4, batch_size=32,
                      optimizer={"name": "adamw", "lr": 3e-3})
    assert again.read_bytes() == ckpt.read_bytes()
    from safetensors import safe_open

    with safe_open(str(ckpt), "pt") as f:  # Hugging Face's own state-dict keys
        assert {"bert.embeddings.word_embeddings.weight", "classifier.weight"} <= set(f.keys())


def test_bert_export_has_dynamic_batch_and_sequence_and_fuses_attention(bert_trained):
    tmp, data, ckpt, _ = bert_trained
    path, exported = _export(tmp, "e", ckpt, BERT, data, task="text-classification")
    assert exported["parity"]["passed"] is True and exported["opset"] == 17
    assert exported["input_shapes"] == {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"]}
    model = onnx.load(str(path))
    assert model.ir_version <= 13
    ports = {i.name: (i.type.tensor_type.elem_type, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim])
             for i in model.graph.input}
    assert ports == {"input_ids": (onnx.TensorProto.INT64, ["batch", "sequence"]),
                     "attention_mask": (onnx.TensorProto.INT64, ["batch", "sequence"])}
    assert [o.name for o in model.graph.output] == ["logits"]
    net = _torch_model(ckpt, BERT)
    session = _session(path)
    rng = np.random.default_rng(3)
    for length in (7, 16):  # neither is the traced example's shape (batch 2, max_length 16) for 7
        ids = rng.integers(0, BERT["vocab_size"], (2, length))
        mask = np.ones((2, length), dtype=np.int64)
        mask[1, length // 2:] = 0  # the second sample is padded
        got = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        with torch.no_grad():
            expected = net(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        assert got.shape == (2, 2) and np.allclose(got, expected, atol=1e-5), length

    from onnxruntime.transformers.optimizer import optimize_model

    fused = optimize_model(str(path), model_type="bert", num_heads=BERT["num_heads"], hidden_size=BERT["hidden_size"])
    assert fused.get_fused_operator_statistics()["Attention"] == BERT["num_layers"]


def test_export_takes_names_shapes_and_types_from_model_inputs(bert_trained):
    tmp, data, ckpt, _ = bert_trained
    declared = {"ids": {"shape": ["batch", "tokens"], "dtype": "int64"},
                "mask": {"shape": ["batch", "tokens"], "dtype": "int64"}}
    path, exported = _export(tmp, "named", ckpt, {**BERT, "inputs": declared}, data)
    assert exported["parity"]["passed"] is True
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in onnx.load(str(path)).graph.input}
    assert dims == {"ids": ["batch", "tokens"], "mask": ["batch", "tokens"]}
    # fixed dimensions stay fixed, and give an mlp its width without reading the data
    mlp_ckpt = tmp / "mlp.safetensors"
    from safetensors.torch import save_file

    save_file(archs.mlp(30, (8,), 2).state_dict(), str(mlp_ckpt))
    fixed = {**MLP, "hidden": [8], "inputs": {"x": {"shape": [4, 30], "dtype": "float32"}}}
    path, exported = _export(tmp, "fixed", mlp_ckpt, fixed, None)
    (inp,) = onnx.load(str(path)).graph.input
    assert inp.name == "x" and [d.dim_value for d in inp.type.tensor_type.shape.dim] == [4, 30]
    assert exported["parity"]["passed"] is True


def test_bert_without_transformers_names_the_extra_with_a_stand_in_missing_package(monkeypatch):
    """Stand-in: transformers is hidden from the import system (sys.modules entry None)."""
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(InvalidInput, match="needs the transformers package") as err:
        archs.build_model(dict(BERT), ".")
    assert err.value.hint == "pip install 'zoo-onnx[text]'"


# ---------------------------------------------------------------------------------------------
# images that are not square


def test_lenet_trains_and_exports_on_non_square_images(tmp_path, stand_in_data):
    data = {"source": "npz", "path": "digits86.npz", "image": {"size": [8, 6], "channels": 1}}
    lenet = {"arch": "lenet5", "num_classes": 10}
    ckpt, metrics = _train(tmp_path, "l", lenet, data, epochs=3)
    assert metrics["val_accuracy"] > 0.7
    path, exported = _export(tmp_path, "e", ckpt, lenet, data)
    assert exported["input_shapes"] == {"input": ["batch", 1, 8, 6]} and exported["parity"]["passed"] is True
    # the same weights at another non-square size, from input_shape, and in NHWC layout
    _, wide = _export(tmp_path, "w", ckpt, lenet, None, input_shape=[1, 6, 12])
    assert wide["input_shapes"] == {"input": ["batch", 1, 6, 12]} and wide["parity"]["passed"] is True
    nhwc = {**data, "image": {**data["image"], "layout": "NHWC"}}
    path, exported = _export(tmp_path, "n", ckpt, lenet, nhwc)
    assert exported["input_shapes"] == {"input": ["batch", 8, 6, 1]}
    val = stand_in_data(data, tmp_path, "val").features["image"]
    nchw = _session(tmp_path / "e" / "out" / "model.onnx").run(None, {"input": np.array(val)})[0]
    got = _session(path).run(None, {"input": np.ascontiguousarray(np.array(val).transpose(0, 2, 3, 1))})[0]
    assert np.allclose(got, nchw, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# an existing ONNX model with several inputs


def test_export_passes_a_multi_input_onnx_model_through_untouched(tmp_path):
    source = multi_io_model()
    onnx.save(source, str(tmp_path / "multi.onnx"))
    ctx = _ctx(tmp_path, "p", None, None)
    config = Export.Config.model_validate({"onnx": {"path": "multi.onnx"}})
    path = Export().run(Inputs([]), config, ctx)["model"]
    out = onnx.load(str(path))
    assert out.graph.SerializeToString(deterministic=True) == source.graph.SerializeToString(deterministic=True)
    assert ctx.metrics["inputs"] == ["ids", "types", "mask"] and ctx.metrics["parity"]["ran"] is True
    feeds = multi_io_feeds(3)
    assert all(np.array_equal(a, b) for a, b in zip(_session(path).run(None, feeds),
                                                    ort.InferenceSession(source.SerializeToString()).run(None, feeds)))
