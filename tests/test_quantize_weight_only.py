"""quantize `mode: weight_only` (onnxruntime's MatMulNBitsQuantizer): each algorithm, 4 and 8 bits,
block size, symmetric, accuracy level, layers excluded or kept at 8 bits, embeddings, the accept
rule on a bad build, a decoder in zoo's convention, and the config errors.

The graphs are checked node by node (MatMulNBits' bits/block_size/accuracy_level attributes,
zero-point inputs, what stays MatMul), not only that a model came out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

from zoo.errors import InvalidInput
from zoo.stage import Inputs, Upstream
from zoo_stages.lib.data import datasets
from zoo_stages.lib.onnx import onnx_io
from zoo_stages.lib.onnx.model_info import describe
from zoo_stages.lib.release.provenance import read_metadata
from zoo_stages.lib.runtimes import ort_session
from zoo_stages.quantize import Quantize, QuantizeConfig
from test_quantize import DIGITS8, make_context

FAST = {"latency": {"warmup": 1, "runs": 3}}


def run_wo(tmp_path: Path, model: Path, *, data=DIGITS8, name="run", task="image-classification", **config):
    ctx = make_context(tmp_path, data, name)
    ctx.shared["task"] = task
    config = {"mode": "weight_only", **FAST, **config}
    out = Quantize().run(Inputs([Upstream("export", "export", {"model": model}, {})]), QuantizeConfig(**config), ctx)
    return out["model"], ctx


def nbits(path: Path) -> dict[str, dict]:
    """{original layer name: MatMulNBits attributes and input count} of a quantized model."""
    model = onnx.load(str(path))
    out = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            out[node.name.rsplit("_Q", 1)[0]] = {**attrs, "inputs": len([i for i in node.input if i])}
    return out


def ops(path: Path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


# -- a digits classifier with two fully connected layers -----------------------------------------


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> dict:
    """A ridge-regression linear classifier of the 8x8 digits (about 90% accurate), written as
    Flatten -> MatMul `hidden` (an orthogonal 64x64) -> MatMul `head` (+ bias): fp32 computes
    x @ W exactly. `outlier` is the same model with a weight of 1000 on an input pixel that is
    always 0: fp32 is unchanged, but 4-bit blocks of `hidden` holding it lose every other weight."""
    folder = tmp_path_factory.mktemp("digits")
    train = datasets.load_split(DIGITS8, folder, "train")
    x = train.features["image"].reshape(len(train), -1).astype(np.float64)
    y = np.eye(10)[train.labels]
    xb = np.hstack([x, np.ones((len(x), 1))])
    w = np.linalg.solve(xb.T @ xb + 10.0 * np.eye(65), xb.T @ y)  # ridge: no huge weight on a rare pixel
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(64, 64)))
    zero_pixel = int(np.argmax(x.max(axis=0) == 0))
    assert x[:, zero_pixel].max() == 0

    def model(hidden: np.ndarray) -> onnx.ModelProto:
        inits = [numpy_helper.from_array(hidden.astype(np.float32), "W1"),
                 numpy_helper.from_array((q.T @ w[:64]).astype(np.float32), "W2"),
                 numpy_helper.from_array(w[64].astype(np.float32), "B2")]
        nodes = [helper.make_node("Flatten", ["input"], ["flat"], axis=1, name="flatten"),
                 helper.make_node("MatMul", ["flat", "W1"], ["h"], name="hidden"),
                 helper.make_node("MatMul", ["h", "W2"], ["hw"], name="head"),
                 helper.make_node("Add", ["hw", "B2"], ["logits"], name="bias")]
        graph = helper.make_graph(nodes, "digits", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                                  ["N", 1, 8, 8])],
                                  [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])], inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 10
        return m

    bad = q.copy()
    bad[zero_pixel, :] = 1000.0
    return {"clean": onnx_io.save_model(model(q), folder / "digits.onnx"),
            "outlier": onnx_io.save_model(model(bad), folder / "outlier.onnx")}


@pytest.mark.parametrize("algorithm,bits", [("rtn", 4), ("rtn", 8), ("hqq", 4), ("gptq", 4), ("k_quant", 4),
                                            ("k_quant", 8)])
def test_each_algorithm_writes_matmulnbits_at_its_bits(tmp_path, digits, algorithm, bits):
    if algorithm == "hqq":
        pytest.importorskip("torch")  # onnxruntime's HQQ quantizer computes with torch
    calibrated = {"calibration": {"samples": 32}} if algorithm == "gptq" else {}
    out, ctx = run_wo(tmp_path, digits["clean"], weight_only={"algorithm": algorithm, "bits": bits}, **calibrated)
    layers = nbits(out)
    assert set(layers) == {"hidden", "head"} and "MatMul" not in ops(out)
    assert {a["bits"] for a in layers.values()} == {bits}
    assert {a["block_size"] for a in layers.values()} == {32}
    assert {a["accuracy_level"] for a in layers.values()} == {4}  # int8 compute, the default
    m = ctx.metrics
    assert m["mode"] == "weight_only" and m["settings"]["algorithm"] == algorithm and m["settings"]["bits"] == bits
    assert m["settings"]["block_size"] == 32 and m["settings"]["accuracy_level"] == "int8"
    assert m["weight_only"]["layers"] == {str(bits): 2}
    assert m["size_bytes"] < m["fp32_size_bytes"]
    assert m["accuracy_drop"] is not None and m["accuracy_drop"] <= 0.05, m["accuracy_drop"]
    assert (m["calibration"] is not None) == (algorithm == "gptq")
    stamp = json.loads(read_metadata(out)["zoo.quantization"])
    assert stamp == {"method": "weight_only", "algorithm": algorithm, "bits": bits, "block_size": 32,
                     "symmetric": False, "accuracy_level": "int8"}
    assert describe(out).precision == f"int{bits}"


def test_block_size_symmetric_and_accuracy_level_reach_the_graph(tmp_path, digits):
    sym, ctx = run_wo(tmp_path, digits["clean"], name="sym",
                      weight_only={"block_size": 16, "symmetric": True, "accuracy_level": "float32"})
    asym, _ = run_wo(tmp_path, digits["clean"], name="asym", weight_only={"block_size": 64})
    s, a = nbits(sym), nbits(asym)
    assert {v["block_size"] for v in s.values()} == {16} and {v["block_size"] for v in a.values()} == {64}
    assert {v["accuracy_level"] for v in s.values()} == {1}  # float32 compute
    assert {v["inputs"] for v in s.values()} == {3}  # A, B, scales: no zero points
    assert {v["inputs"] for v in a.values()} == {4}  # ... and zero points
    assert ctx.metrics["settings"]["symmetric"] is True and ctx.metrics["settings"]["accuracy_level_value"] == 1


def test_the_bytes_are_reproducible(tmp_path, digits):
    one, _ = run_wo(tmp_path, digits["clean"], name="one", weight_only={"algorithm": "k_quant"})
    two, _ = run_wo(tmp_path, digits["clean"], name="two", weight_only={"algorithm": "k_quant"})
    assert one.read_bytes() == two.read_bytes()


def test_excluded_layers_stay_float_and_kept_layers_are_8_bit(tmp_path, digits):
    out, ctx = run_wo(tmp_path, digits["clean"], name="ex", weight_only={"exclude": ["hid*"]})
    assert set(nbits(out)) == {"head"} and ops(out).count("MatMul") == 1
    assert ctx.metrics["weight_only"]["kept_float"] == 1
    for algorithm in ("rtn", "k_quant"):  # rtn: a second 8-bit pass; k_quant: its own per-node bits
        out, ctx = run_wo(tmp_path, digits["clean"], name=f"k8-{algorithm}",
                          weight_only={"algorithm": algorithm, "keep_8bit": ["head"]})
        layers = nbits(out)
        assert layers["hidden"]["bits"] == 4 and layers["head"]["bits"] == 8, layers
        assert {v["accuracy_level"] for v in layers.values()} == {4}
        assert ctx.metrics["weight_only"]["layers"] == {"4": 1, "8": 1}


def test_a_pattern_that_matches_no_layer_is_an_error(tmp_path, digits):
    with pytest.raises(InvalidInput, match="keep_8bit: '\\*lm_head\\*' matches no quantizable layer") as err:
        run_wo(tmp_path, digits["clean"], weight_only={"keep_8bit": ["*lm_head*"]})
    assert "hidden" in err.value.hint and "head" in err.value.hint


def test_a_bad_build_fails_the_accept_rule_and_exclude_repairs_it(tmp_path, digits):
    """The outlier weight wrecks `hidden`'s 4-bit blocks: the accuracy drop is flagged (as for
    int8, verify gates on it); kept in float, the same model passes."""
    out, ctx = run_wo(tmp_path, digits["outlier"], name="bad")
    m = ctx.metrics
    assert m["accuracy_drop"] > 0.2, m["accuracy_drop"]
    assert any("accuracy drop" in f and "accept.max_accuracy_drop" in f for f in m["flags"]), m["flags"]
    _, ctx = run_wo(tmp_path, digits["outlier"], name="good", weight_only={"exclude": ["hidden"]})
    assert ctx.metrics["accuracy_drop"] <= 0.02
    assert not any("accuracy drop" in f for f in ctx.metrics["flags"])


def test_without_data_the_outputs_cosine_is_the_rule(tmp_path, digits):
    _, ctx = run_wo(tmp_path, digits["outlier"], name="cos", data=None, accept={"min_cosine": 0.999})
    assert ctx.metrics["accuracy"] is None and ctx.metrics["parity"]["cosine"] < 0.999
    assert any("below accept.min_cosine" in f for f in ctx.metrics["flags"])


def test_gptq_without_data_is_refused(tmp_path, digits):
    with pytest.raises(InvalidInput, match="gptq needs the recipe's `data:`"):
        run_wo(tmp_path, digits["clean"], data=None, weight_only={"algorithm": "gptq"})


def test_gemm_layers_are_quantized_too(tmp_path):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["f"], axis=1), helper.make_node("Gemm", ["f", "G", "b"], ["logits"],
                                                                                  transB=1)],
        "gemm", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(rng.normal(0, 0.1, (10, 64)).astype(np.float32), "G"),
         numpy_helper.from_array(np.zeros(10, np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    out, _ = run_wo(tmp_path, onnx_io.save_model(model, tmp_path / "gemm.onnx"), data=None)
    assert "MatMulNBits" in ops(out) and "Gemm" not in ops(out)


# -- config errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("config,message", [
    ({"mode": "weight_only", "format": "qdq"}, "format does not apply to mode: weight_only"),
    ({"mode": "weight_only", "per_channel": True}, "per_channel does not apply to mode: weight_only"),
    ({"mode": "weight_only", "preset": "x86-avx2"}, "preset does not apply to mode: weight_only"),
    ({"mode": "static", "weight_only": {"bits": 4}}, "weight_only applies to mode: weight_only, and to mode: auto"),
    ({"mode": "weight_only", "weight_only": {"bits": 3}}, "weight_only.bits"),
    ({"mode": "weight_only", "weight_only": {"block_size": 48}}, "block_size must be a power of two"),
    ({"mode": "weight_only", "weight_only": {"algorithm": "hqq", "symmetric": True}},
     "symmetric does not apply to algorithm hqq"),
    ({"mode": "weight_only", "weight_only": {"algorithm": "hqq", "bits": 8}}, "float zero points"),
    ({"mode": "weight_only", "weight_only": {"algorithm": "gptq", "bits": 8}}, "gptq writes 4-bit weights only"),
    ({"mode": "weight_only", "weight_only": {"bits": 8, "keep_8bit": ["x"]}}, "keep_8bit applies to bits: 4"),
    ({"mode": "weight_only", "weight_only": {"accuracy_level": 4}}, "accuracy_level"),
    ({"mode": "weight_only", "calibration": {"samples": 8}}, "calibration does not apply to weight_only algorithm rtn"),
    ({"mode": "weight_only", "weight_only": {"algorithm": "gptq"}, "calibration": {"method": "entropy"}},
     "calibration.method and calibration.percentile do not apply to gptq"),
    ({"mode": "weight_only", "op_types": ["Conv"]}, "'Conv' cannot be weight-only quantized"),
    ({"mode": "weight_only", "op_types": ["MatMul", "Gather"], "weight_only": {"algorithm": "k_quant"}},
     "embeddings .* rtn at 4 bits only"),
    ({"mode": "weight_only", "candidates": ["static-qdq"]}, "candidates applies to mode: auto only"),
])
def test_config_errors_name_the_problem(config, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        QuantizeConfig(**config)


# -- a decoder in zoo's convention (onnxruntime-genai's builder on a tiny Llama) ---------------------


@pytest.fixture(scope="module")
def decoder(tmp_path_factory) -> Path:
    """onnxruntime-genai's fp32 build of a tiny random Llama: model.onnx (external data) beside its
    genai_config.json, whose head size the cache inputs leave symbolic."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime_genai")
    from decoder_models import genai_build, tiny_llama_folder

    folder = tmp_path_factory.mktemp("llama")
    return genai_build(tiny_llama_folder(folder / "hf"), folder / "fp32", precision="fp32") / "model.onnx"


def test_a_decoder_is_judged_on_prefill_logits_and_timed_by_a_generation(tmp_path, decoder):
    out, ctx = run_wo(tmp_path, decoder, data=None, task="text-generation", op_types=["MatMul", "Gather"],
                      weight_only={"keep_8bit": ["*lm_head*"]})
    layers = nbits(out)
    assert layers["/lm_head/MatMul"]["bits"] == 8
    assert {v["bits"] for k, v in layers.items() if k != "/lm_head/MatMul"} == {4} and len(layers) == 11
    assert "GatherBlockQuantized" in ops(out) and "MatMul" not in ops(out)
    m = ctx.metrics
    assert m["weight_only"]["gathers"] == 1
    assert m["parity"]["cosine"] > 0.98 and m["parity"]["samples"] > 0
    assert m["accuracy"] is None and m["latency_p50_ms"] > 0 and m["fp32_latency_p50_ms"] > 0
    assert "prefill of 32 tokens + 16 greedy decode steps" in m["latency_measures"]
    assert m["size_bytes"] < m["fp32_size_bytes"] / 2  # the fp32 size counts its external data
    session = ort_session.make_session(out)
    assert {i.name for i in session.get_inputs()} >= {"input_ids", "past_key_values.0.key"}


def test_gptq_calibrates_a_decoder_on_token_rows(tmp_path, decoder):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "tokens.npz", input_ids=rng.integers(0, 512, (24, 16)).astype(np.int64))
    data = {"source": "npz", "path": "tokens.npz", "label": None}
    out, ctx = run_wo(tmp_path, decoder, data=data, task="text-generation", weight_only={"algorithm": "gptq"},
                      calibration={"samples": 8, "batch_size": 4})
    assert {v["bits"] for v in nbits(out).values()} == {4}
    assert ctx.metrics["calibration"] == {"samples": 8, "method": "gptq", "seed": 0}
    assert ctx.metrics["parity"]["cosine"] > 0.98


# -- the build it makes: manifest, card (a real `zoo run`) ----------------------------------------------


@pytest.mark.slow  # a real `zoo run` of four stages in a subprocess: about 20 s on 2 cores
def test_a_weight_only_build_is_published_with_its_precision_algorithm_bits_block_and_accuracy_level(tmp_path,
                                                                                                     digits):
    """import -> quantize weight_only -> verify (gated) -> deploy: the manifest's build says int4 and
    how (schema 4), the card's builds table says it, and a build named for another precision is
    warned about."""
    import hashlib
    import shutil

    from cli_helpers import zoo
    from zoo.registry.store import LocalZoo

    shutil.copyfile(digits["clean"], tmp_path / "digits.onnx")
    sha = hashlib.sha256((tmp_path / "digits.onnx").read_bytes()).hexdigest()
    (tmp_path / "r.yaml").write_text(f"""\
schema_version: 1
name: wo-digits
version: 0.1.0
task: image-classification
model: {{num_classes: 10}}
data: {{source: digits, image_size: 8, channels: 1, limit: 300}}
stages:
  export:
    config: {{onnx: {{path: digits.onnx, sha256: {sha}}}}}
  quantize:
    needs: [export]
    config:
      mode: weight_only
      weight_only: {{algorithm: k_quant, block_size: 16, accuracy_level: float32}}
      latency: {{warmup: 1, runs: 3}}
      accept: {{min_speedup: 0}}
  verify:
    needs: [export, quantize]
    config:
      builds: {{cpu-fp32: export, cpu-int4-kquant-b16: quantize}}
      reference: cpu-fp32
      latency: {{warmup: 1, runs: 3, batch_sizes: [1]}}
      gates: [cpu-int4-kquant-b16.accuracy_drop <= 0.05]
  deploy:
    needs: [export, quantize, verify]
    config:
      builds:
        cpu-fp32: {{from: export}}
        cpu-int4-kquant-b16: {{from: quantize}}
        cpu-int8: {{from: quantize, verified_as: cpu-int4-kquant-b16}}
""")
    done = zoo("run", tmp_path / "r.yaml", "-v", cwd=tmp_path)
    assert done.code == 0, done.text
    assert "build cpu-int8 is named for int8 but its model is int4" in done.text
    manifest = LocalZoo().resolve("wo-digits@0.1.0")
    assert manifest.schema_version == 4
    build = manifest.builds["cpu-int4-kquant-b16"]
    assert build.precision == "int4" and manifest.builds["cpu-fp32"].precision == "fp32"
    assert build.quantization == {"accuracy_level": "float32", "algorithm": "k_quant", "bits": 4, "block_size": 16,
                                  "method": "weight_only", "symmetric": False}
    assert manifest.builds["cpu-fp32"].quantization is None
    card = (LocalZoo().blobs.path(manifest.card.sha256)).read_text()
    assert "int4 (weight-only k_quant, 4 bits, block 16, asymmetric, float32 compute)" in card


@pytest.mark.parametrize("algorithm", ["rtn", "k_quant", "gptq"])
def test_every_algorithm_writes_a_model_onnx_checker_accepts(tmp_path, digits, algorithm):
    """onnxruntime's RTN/GPTQ path writes com.microsoft nodes without importing their domain; the
    build must pass verify's checker gate all the same."""
    from zoo_stages.lib.onnx.onnx_io import checker_error

    calibrated = {"calibration": {"samples": 16}} if algorithm == "gptq" else {}
    out, _ = run_wo(tmp_path, digits["clean"], weight_only={"algorithm": algorithm}, **calibrated)
    assert checker_error(out) is None


def test_hqq_puts_torch_in_the_key_and_the_other_algorithms_do_not():
    from zoo.stage import KeyContext

    def tools(algorithm):
        config = QuantizeConfig(mode="weight_only", weight_only={"algorithm": algorithm})
        return Quantize().tools_used(config, KeyContext(recipe=None, shared={}, matrix={}))

    assert "torch" in tools("hqq") and "torch" not in tools("rtn") and "torch" not in tools("k_quant")
    assert Quantize().tools_used(QuantizeConfig(), KeyContext(recipe=None, shared={}, matrix={})) == Quantize.tools


@pytest.fixture
def stand_in_clock(monkeypatch):
    """Stand-in for the wall clock of quantize's latency measurement: a model's p50 is given by its
    file's name (auto's candidates are written as `<candidate>.onnx`, the parent as `fp32.onnx`)."""
    from zoo_stages.lib.runtimes import timing

    latencies: dict[str, float] = {}
    real_make_session = ort_session.make_session

    def make_session(path, *args, **kwargs):
        session = real_make_session(path, *args, **kwargs)
        session.zoo_test_name = Path(path).stem
        return session

    def measure_latency(session, x, *, warmup=5, runs=30, progress=None):
        ms = latencies[session.zoo_test_name]
        return {"p50_ms": ms, "p90_ms": ms, "mean_ms": ms, "min_ms": ms, "runs": runs, "warmup": 0}

    monkeypatch.setattr(ort_session, "make_session", make_session)
    monkeypatch.setattr(timing, "measure_latency", measure_latency)
    return latencies


def test_auto_tries_weight_only_candidates_only_when_named_with_a_stand_in_clock(tmp_path, digits, stand_in_clock):
    """With a stand-in clock on which the int4 candidate is the fastest, auto keeps it and records its
    settings; the weight-only candidates are not in auto's default search."""
    from zoo_stages.lib.quantization.quant_settings import CANDIDATES, WEIGHT_ONLY_CANDIDATES

    assert not set(WEIGHT_ONLY_CANDIDATES) & set(CANDIDATES)
    stand_in_clock.update({"fp32": 10.0, "static-qdq": 9.0, "weight-only-int4": 2.0, "weight-only-int8": 5.0})
    out, ctx = run_wo(tmp_path, digits["clean"], mode="auto", candidates=["static-qdq", "weight-only-int4",
                                                                           "weight-only-int8"],
                      weight_only={"algorithm": "k_quant", "block_size": 16})
    m = ctx.metrics
    assert m["chosen"] == "weight-only-int4" and m["settings"]["algorithm"] == "k_quant"
    assert m["settings"]["bits"] == 4 and m["settings"]["block_size"] == 16
    assert {v["bits"] for v in nbits(out).values()} == {4}
    rows = {r["name"]: r for r in m["candidates"]}
    assert rows["weight-only-int8"]["settings"]["bits"] == 8 and set(rows) == {"static-qdq", "weight-only-int4",
                                                                               "weight-only-int8"}
    assert json.loads(read_metadata(out)["zoo.quantization"])["algorithm"] == "k_quant"
    with pytest.raises(pydantic.ValidationError, match="weight_only applies to mode: weight_only, and to mode: auto"):
        QuantizeConfig(mode="auto", weight_only={"algorithm": "rtn"})
    with pytest.raises(pydantic.ValidationError, match="bits is chosen by mode: auto"):
        QuantizeConfig(mode="auto", candidates=["weight-only-int4"], weight_only={"bits": 4})
