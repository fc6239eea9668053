"""Classifiers whose probabilities are a sequence of maps (ZipMap), as users meet them first:
onnxruntime's own ``datasets/logreg_iris.onnx`` and scikit-learn models exported by skl2onnx with
ZipMap on, trained and evaluated on the real iris data (scikit-learn's ``load_iris``, offline),
through the real `zoo` CLI: import, verify (accuracy, top-1 agreement and parity per class),
quantize (the float part; ZipMap and the label pass through), deploy, pull."""

from __future__ import annotations

import csv
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest

from cli_helpers import zoo

pytestmark = pytest.mark.slow  # each case runs a recipe's stages end to end

LOGREG_IRIS = Path(__import__("onnxruntime").__file__).parent / "datasets" / "logreg_iris.onnx"
FEATURES = ["sepal_length", "sepal_width", "petal_length", "petal_width"]


def _iris(folder: Path, labels: str = "ints") -> tuple[np.ndarray, np.ndarray]:
    """iris.csv (4 float features, label `species`) in `folder`; returns X, y."""
    from sklearn.datasets import load_iris

    X, y = load_iris(return_X_y=True)
    X = X.astype(np.float32)
    y = np.array(["setosa", "versicolor", "virginica"])[y] if labels == "strings" else y
    with open(folder / "iris.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*FEATURES, "species"])
        writer.writerows([*map(float, row), label] for row, label in zip(X, y))
    return X, y


def _skl2onnx(estimator, X, y, path: Path) -> Path:
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType

    estimator.fit(X, y)
    model = to_onnx(estimator, initial_types=[("float_input", FloatTensorType([None, 4]))], target_opset=17)
    assert any(n.op_type == "ZipMap" for n in model.graph.node)  # skl2onnx's default: probabilities as maps
    path.write_bytes(model.SerializeToString())
    return path


def _cache() -> Path:
    return Path(os.environ["ZOO_CACHE_DIR"])


def _manifest(ref: str) -> dict:
    shown = zoo("show", ref, "--json")
    assert shown.code == 0, shown.text
    return json.loads(shown.out)


def test_logreg_iris_from_onnxruntime_verifies_its_map_output(tmp_path):
    """The model users try first. It verifies now (it failed with onnxruntime's "Unrecognized object
    in the object array"); its own graph is inconsistent — LinearClassifier holds 12 coefficients
    (3 classes x 4 features) for a declared float[3, 2] input, onnxruntime reads the first 6, ONNX's
    reference evaluator refuses them — so deploy's rule that a version ships one portable build stops
    the import there, naming the reference evaluator, without a traceback."""
    result = zoo("import", LOGREG_IRIS)
    assert "verify: done" in result.err
    assert "Unrecognized object" not in result.text and "Traceback" not in result.text
    assert result.code != 0
    assert "stage deploy of the generated recipe failed: no build of this version is portable ONNX" in result.err
    assert "reference evaluator" in result.err
    # the hint is about the file the user brought, not about a recipe zoo wrote for them
    assert "does not follow the ONNX standard as written" in result.err and "portable: {from" not in result.err


def test_an_skl2onnx_zipmap_classifier_imports_and_pulls_with_class_matrix_vectors(tmp_path):
    from sklearn.linear_model import LogisticRegression

    X, y = _iris(tmp_path, labels="strings")
    model = _skl2onnx(LogisticRegression(max_iter=500), X, y, tmp_path / "iris-logreg.onnx")
    imported = zoo("import", model)
    assert imported.code == 0, imported.text
    assert "imported iris-logreg@1.0.0" in imported.out
    pulled = zoo("pull", "iris-logreg@1.0.0", "--to", tmp_path / "pulled")
    assert pulled.code == 0, pulled.text
    out_files = sorted((tmp_path / "pulled").rglob("output_*.pb"))
    assert out_files, list((tmp_path / "pulled").rglob("*"))
    protos = {p.name: p for p in (onnx.TensorProto.FromString(f.read_bytes()) for f in out_files)}
    probabilities = protos["output_probability"]
    described = json.loads(probabilities.doc_string)
    assert described == {"zoo_vector": "class_matrix", "schema_version": 1,
                         "class_keys": ["setosa", "versicolor", "virginica"]}
    assert list(probabilities.dims)[1:] == [3]
    # the stored matrix is what onnxruntime says for the stored inputs, per class
    import onnxruntime as ort

    from zoo_stages.lib.release.vectors import read_test_vectors

    inputs, outputs = read_test_vectors(out_files[0].parent)
    session = ort.InferenceSession(model.read_bytes(), providers=["CPUExecutionProvider"])
    labels, maps = session.run(None, inputs)
    expected = np.array([[m[k] for k in described["class_keys"]] for m in maps], dtype=np.float32)
    np.testing.assert_allclose(outputs["output_probability"], expected, rtol=1e-5)
    assert list(outputs["output_label"]) == list(labels)
    # the pulled recipe rebuilds every stage bit for bit (vectors with their class keys included)
    check = zoo("repro", tmp_path / "pulled" / "import" / "recipe.yaml", "--check",
                env={"ZOO_CACHE_DIR": str(tmp_path / "fresh-cache")})
    assert check.code == 0, check.text
    assert "every rebuilt stage is bit-identical to the lockfile" in check.out


def test_a_zipmap_mlp_on_real_iris_verifies_quantizes_and_deploys(tmp_path):
    from sklearn.neural_network import MLPClassifier

    X, y = _iris(tmp_path)
    model = _skl2onnx(MLPClassifier(hidden_layer_sizes=(32,), max_iter=2000, random_state=0), X, y,
                      tmp_path / "mlp.onnx")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (tmp_path / "recipe.yaml").write_text(f"""\
schema_version: 1
name: iris-mlp
version: 1.0.0
description: an skl2onnx MLP on iris whose probabilities are ZipMap's maps
license: MIT
task: tabular-classification
data: {{source: csv, path: iris.csv, label: species, val_fraction: 0.3, split_seed: 0}}
stages:
  export:
    config: {{onnx: {{path: mlp.onnx, sha256: {digest}}}}}
  quantize:
    needs: [export]
    config: {{mode: dynamic}}
  verify:
    needs: [export, quantize]
    config:
      builds: {{cpu-fp32: export, cpu-int8: quantize}}
      latency: {{warmup: 1, runs: 3, threads: 1, batch_sizes: [1]}}
      gates:
        - cpu-fp32.accuracy >= 0.9
        - cpu-int8.accuracy_drop <= 0.05
        - cpu-int8.top1_agreement >= 0.9
        - cpu-int8.cosine >= 0.99
        - cpu-int8.exact_match >= 0.9
  deploy:
    needs: [export, quantize, verify]
    config:
      builds:
        cpu-fp32: {{from: export}}
        cpu-int8: {{from: quantize}}
""")
    ran = zoo("run", tmp_path / "recipe.yaml", "--json")
    assert ran.code == 0, ran.text
    builds = _manifest("iris-mlp@1.0.0")
    text = json.dumps(builds)
    assert "cpu-int8" in text and "cpu-fp32" in text
    # the int8 build quantized the MatMuls and kept ZipMap and the label path as they were
    int8 = next(p for p in _cache().rglob("model.onnx") if "MatMulInteger" in
                {n.op_type for n in onnx.load(p).graph.node})
    ops = {n.op_type for n in onnx.load(int8).graph.node}
    assert {"MatMulInteger", "ZipMap", "ArgMax"} <= ops and "MatMul" not in ops
    report = json.loads(next(_cache().rglob("report.json")).read_text())
    assert report["metric_outputs"] == {"scores": "output_probability", "label": "output_label"}
    parity = report["builds"]["cpu-int8"]["parity"]["output_probability"]
    assert parity["shape"] == [45, 3] and parity["top1_agreement"] == 1.0  # per class, 45 held-out rows
    assert 0 < parity["max_abs"] < 0.1 and parity["cosine"] > 0.99


def test_a_model_with_nothing_to_quantize_says_so_in_one_line(tmp_path):
    """A LinearClassifier + ZipMap (no MatMul, Gemm or Conv) has no float part onnxruntime quantizes."""
    from sklearn.linear_model import LogisticRegression

    X, y = _iris(tmp_path)
    model = _skl2onnx(LogisticRegression(max_iter=500), X, y, tmp_path / "lr.onnx")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (tmp_path / "recipe.yaml").write_text(f"""\
schema_version: 1
name: iris-lr
version: 1.0.0
license: MIT
task: tabular-classification
data: {{source: csv, path: iris.csv, label: species}}
stages:
  export: {{config: {{onnx: {{path: lr.onnx, sha256: {digest}}}}}}}
  quantize: {{needs: [export], config: {{mode: dynamic}}}}
""")
    ran = zoo("run", tmp_path / "recipe.yaml")
    assert ran.code == 2, ran.text
    assert "stage quantize failed: nothing to quantize" in ran.err and "ai.onnx.ml.ZipMap" in ran.err
    assert "hint: drop the quantize stage and deploy the fp32 build" in ran.err
