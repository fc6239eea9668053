"""Equivalence verdicts on real cross-class builds of lenet-digits (tests/data/cross_platform/, made
under QEMU's EPYC-Milan model (x86-64-avx2) and natively on this AVX-512 VNNI host; its README says
how): what `zoo repro --check` decides on another platform class than a record's.

- train: two checkpoints whose weights differ by 0.22 are equivalent by held-out quality; a
  damaged one is not;
- quantize: the same int8 model's outputs from AVX2 and VNNI kernels (max-abs 2.4 apart) pass the
  quantized bar; int8 models of two training chains, or with damaged weights, do not;
- `zoo repro --check` end to end on a lock holding only x86-64-avx2 records whose cache holds the
  real AVX2 checkpoint: train is equivalent by quality and every later stage, rebuilt from the
  AVX2 record's upstream outputs, is bit-identical to its record.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from zoo import api, host
from zoo.engine import keys, kind_loader, pipeline
from zoo.stage import EquivalenceContext
from zoo_stages.lib.quality import equivalence

DATA = Path(__file__).parent / "data" / "cross_platform"
AVX2, VNNI = DATA / "x86-64-avx2", DATA / "x86-64-avx512-vnni"
RECIPE = DATA / "lenet-digits.yaml"


def _context(stage: str, quality_tolerance: float = 0.01, recipe: Path = RECIPE) -> EquivalenceContext:
    dag = api.load(recipe)
    node = dag.nodes[stage]
    return EquivalenceContext(recipe=keys.recipe_info(dag.recipe), shared=keys.shared_sections(dag.recipe, node),
                              matrix={}, quality_tolerance=quality_tolerance)


def _train_verdict(locked: Path, rebuilt: Path, quality_tolerance: float = 0.01):
    train = kind_loader.get("train")()
    return train.equivalence({"checkpoint": locked}, {"checkpoint": rebuilt}, None,
                             _context("train", quality_tolerance))


# -- train: held-out quality ------------------------------------------------------------------

def test_checkpoints_trained_on_avx2_and_avx512_are_equivalent_by_held_out_quality():
    old, new = AVX2 / "train-checkpoint.safetensors", VNNI / "train-checkpoint.safetensors"
    # weights trained on other kernels are far apart: no weight tolerance could call them equivalent
    passed, line = equivalence.compare_file(old, new)
    assert not passed and "max-abs 0.223" in line, line
    verdict = _train_verdict(old, new)
    assert verdict.equivalent, verdict.details
    (line,) = verdict.details
    assert line.startswith("checkpoint: equivalent quality (within 0.01): held-out accuracy 0.9333 vs 0.9333 "
                           "on 360 samples"), line
    agreement = float(re.search(r"predictions agree on ([0-9.]+)", line).group(1))
    assert 0.9 < agreement < 1.0  # they are different models that predict alike
    assert "weights differ by max-abs 0.223" in line


def _damaged(checkpoint: Path, target: Path, scale: float) -> Path:
    """The checkpoint with noise of `scale` added to every weight of its first convolution."""
    from safetensors.numpy import load_file, save_file

    state = load_file(str(checkpoint))
    name = sorted(k for k in state if k.endswith("weight"))[0]
    state[name] = state[name] + np.random.default_rng(0).normal(0, scale, state[name].shape).astype("float32")
    save_file(state, str(target))
    return target


def test_a_damaged_checkpoint_is_not_equivalent_and_the_tolerance_decides(tmp_path):
    old = AVX2 / "train-checkpoint.safetensors"
    bad = _damaged(VNNI / "train-checkpoint.safetensors", tmp_path / "model.safetensors", scale=0.5)
    verdict = _train_verdict(old, bad)
    assert not verdict.equivalent
    (line,) = verdict.details
    assert line.startswith("checkpoint: quality differs (beyond 0.01): held-out accuracy 0.9333 vs "), line
    accuracy = float(re.search(r"accuracy 0.9333 vs ([0-9.]+)", line).group(1))
    assert accuracy < 0.92
    # a looser quality tolerance (zoo repro --check --quality-tolerance) accepts what it covers
    assert _train_verdict(old, bad, quality_tolerance=0.9334 - accuracy + 1e-3).equivalent


# -- quantize: outputs of int8 models ---------------------------------------------------------

def _heldout_input() -> np.ndarray:
    from zoo_stages.lib.data import datasets

    data = _context("train").shared["data"]
    features = datasets.load_split(dict(data), DATA, "val").features
    return next(iter(features.values()))  # the single image feature (as q.py took it for the fixture)


def test_the_same_int8_model_on_avx2_and_vnni_kernels_passes_the_quantized_bar():
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    avx2_logits = np.load(AVX2 / "quantize-logits-heldout.npy")
    here = onnx_run.run(ort_session.make_session(AVX2 / "quantize-model.onnx"), {"input": _heldout_input()})
    passed, line = equivalence.judge_outputs({"logits": avx2_logits}, here, quantized=True)
    assert passed, line
    if host.platform_class() == "x86-64-avx2":  # this host runs the kernels the logits came from
        assert np.array_equal(here["logits"], avx2_logits)
        return
    assert np.abs(here["logits"] - avx2_logits).max() > 0.5  # int8 kernels of other classes really differ
    assert line.startswith("equivalent quantized outputs: mean cosine 0.99"), line
    assert "top-1 agreement 0.98" in line
    # as a float model's outputs they would not be
    passed, line = equivalence.judge_outputs({"logits": avx2_logits}, here, quantized=False)
    assert not passed and line.startswith("not equivalent: outputs outside"), line


def test_int8_models_of_two_training_chains_are_not_equivalent():
    passed, line = equivalence.compare_models(AVX2 / "quantize-model.onnx", VNNI / "quantize-model.onnx")
    assert not passed, line
    assert line.startswith("not equivalent: quantized outputs (same graph; 32 seeded inputs (seed 0)) below mean "
                           "cosine 0.99"), line


def test_an_int8_model_is_equivalent_to_itself_with_other_metadata_but_not_with_damaged_weights(tmp_path):
    model = onnx.load(str(AVX2 / "quantize-model.onnx"))
    onnx.helper.set_model_props(model, {"zoo.key": "another build"})
    relabelled = tmp_path / "relabelled" / "model.onnx"
    relabelled.parent.mkdir()
    onnx.save(model, str(relabelled))
    passed, line = equivalence.compare_models(AVX2 / "quantize-model.onnx", relabelled)
    assert passed and line.startswith("equivalent outputs (same graph; 32 seeded inputs (seed 0)) within"), line
    damaged = onnx.load(str(AVX2 / "quantize-model.onnx"))
    int8 = [t for t in damaged.graph.initializer if t.data_type == onnx.TensorProto.INT8 and len(t.dims) == 4]
    for tensor in int8[:1]:  # the first convolution's int8 weights, negated
        values = numpy_helper.to_array(tensor)
        tensor.CopyFrom(numpy_helper.from_array((-values.astype("int16")).clip(-127, 127).astype("int8"), tensor.name))
    target = tmp_path / "damaged" / "model.onnx"
    target.parent.mkdir()
    onnx.save(damaged, str(target))
    passed, line = equivalence.compare_models(AVX2 / "quantize-model.onnx", target)
    assert not passed and line.startswith("not equivalent: quantized outputs"), line


# -- verify's report: quality metrics, parity figures ---------------------------------------

def test_a_report_is_judged_by_its_quality_metrics_and_reports_parity_figures(tmp_path):
    def report(path: Path, accuracy: float, cosine: float, gate_value: float) -> Path:
        path.write_text(json.dumps({
            "builds": {"cpu-int8": {"accuracy": accuracy, "accuracy_drop": 0.9333 - accuracy, "cosine": cosine,
                                    "parity": {"logits": {"max_abs": 2 * (1 - cosine), "passed": False}},
                                    "size_bytes": 71979, "stage": "quantize"}},
            "gates": [{"gate": "cpu-int8.accuracy_drop <= 0.02", "value": gate_value, "passed": True}]}))
        return path

    old = report(tmp_path / "a.json", 0.9194, 0.9988, 0.0139)
    close = report(tmp_path / "b.json", 0.9250, 0.9990, 0.0083)
    passed, line = equivalence.compare_file(old, close)
    assert passed, line
    assert line.startswith("equivalent: equivalent quality within 0.01 (largest change: ")
    assert "parity figures reported, not judged" in line
    far = report(tmp_path / "c.json", 0.9361, 0.9995, -0.0028)
    passed, line = equivalence.compare_file(old, far)
    assert not passed and "quality outside 0.01: builds.cpu-int8.accuracy 0.9194 vs 0.9361" in line, line
    assert equivalence.compare_file(old, far, quality_tolerance=0.02)[0]
    other_size = report(tmp_path / "d.json", 0.9194, 0.9988, 0.0139)
    other_size.write_text(other_size.read_text().replace("71979", "71980"))
    passed, line = equivalence.compare_file(old, other_size)
    assert not passed and "builds.cpu-int8.size_bytes" in line, line


# -- zoo repro --check end to end ----------------------------------------------------------

def test_repro_check_on_a_lock_of_another_class_rebuilds_each_stage_from_that_class_outputs(tmp_path, monkeypatch):
    """The lock holds only x86-64-avx2 records; the cache holds what they describe, train's being
    the real AVX2 checkpoint. This host (another class) rebuilds every stage: train is judged by
    held-out quality, and every later stage, rebuilt from the AVX2 record's upstream outputs
    (not from this host's retrained checkpoint), is bit-identical to its record."""
    if host.platform_class() == "x86-64-avx2":
        pytest.skip("this host is of the fixture's class")
    avx2_host = json.loads((AVX2 / "host.json").read_text())
    cache = tmp_path / "cache"
    recipe = tmp_path / "lenet-digits.yaml"
    text = RECIPE.read_text()
    # the stages under test (train and the ONNX chain): verify and deploy time and publish
    recipe.write_text(text[:text.index("  verify:")])
    dag = api.load(recipe)
    # 1. the AVX2 machine's train entry: the real checkpoint, under the key this code gives it
    planned, parts = pipeline._plan(dag, cache, False)
    train_key = next(s.key for s in planned.stages if s.id == "train")
    from zoo.engine.cache import Cache

    out = tmp_path / "train-out"
    out.mkdir()
    shutil.copyfile(AVX2 / "train-checkpoint.safetensors", out / "model.safetensors")
    Cache(cache).ensure().commit(key=train_key, stage="train", kind="train", out_dir=out,
                                 outputs={"checkpoint": "model.safetensors"}, metrics={}, parts=parts["train"],
                                 duration_s=1.0, host=avx2_host)
    # 2. the rest of the chain as the AVX2 machine builds it from that checkpoint (its records name it);
    # export, optimize and quantize rebuild bit-identically from the same inputs on either class
    from test_lock_platforms import StandInMachine  # runs each stage in this process, on the stand-in CPU

    monkeypatch.setattr(host, "describe", lambda: dict(avx2_host))
    monkeypatch.setattr(pipeline, "make_executor", lambda spec, jobs: StandInMachine())
    first = api.run(dag, cache_dir=cache)
    assert first.ok and first.executed == ["export", "optimize", "quantize"]
    lock = recipe.with_suffix(".lock").read_text()
    assert "x86-64-avx512" not in lock and "x86-64-avx2:" in lock
    monkeypatch.undo()  # this host again, its own stage workers
    # 3. this host checks
    from zoo.release import repro

    report = repro.check(recipe, cache_dir=cache)
    checks = {s.id: s for s in report.stages}
    assert report.ok and not report.bit_identical, [(s.id, s.status, s.details) for s in report.stages]
    train = checks["train"]
    assert train.status == "equivalent"
    assert train.details[0].startswith(f"rebuilt on {host.platform_class()}, which has no record: compared with the "
                                       "x86-64-avx2 record for equivalence")
    assert train.details[1].startswith("checkpoint: equivalent quality (within 0.01): held-out accuracy 0.9333 vs ")
    for sid, upstream in (("export", "train"), ("optimize", "train, export"), ("quantize", "train, export")):
        assert checks[sid].status == "identical", checks[sid].details
        assert checks[sid].details == [
            f"no {host.platform_class()} record; bit-identical to the x86-64-avx2 record",
            f"rebuilt from the x86-64-avx2 record's upstream outputs ({upstream}), from the cache"]
    assert recipe.with_suffix(".lock").read_text() == lock  # a check writes nothing


# -- deploy: verify's vectors of an int8 model computed by another class's kernels ------------

def _vector_check(model: Path, logits: np.ndarray, tmp_path: Path) -> None:
    """deploy's check that `model` reproduces verify's vectors (held-out inputs, `logits`)."""

    from zoo_stages.deploy.vectors import check_vector_set
    from zoo_stages.lib.runtimes import ort_session
    from zoo_stages.lib.onnx.model_info import session_ports
    from zoo_stages.lib.release.vectors import write_test_vectors

    set_dir = write_test_vectors(tmp_path / "test_data_set_0", {"input": _heldout_input()}, {"logits": logits})
    session = ort_session.make_session(model)
    ports, out_ports = session_ports(session)
    check_vector_set("cpu-int8", "cpu-int8", "quantize", session, ports, out_ports, set_dir, model)


def test_deploy_accepts_an_int8_model_s_vectors_from_another_class_but_not_another_model_s(tmp_path):
    from zoo.errors import GateFailed

    avx2_logits = np.load(AVX2 / "quantize-logits-heldout.npy")
    _vector_check(AVX2 / "quantize-model.onnx", avx2_logits, tmp_path / "same")  # AVX2 kernels' vectors pass here
    with pytest.raises(GateFailed, match="does not reproduce verify's test vectors"):
        _vector_check(VNNI / "quantize-model.onnx", avx2_logits, tmp_path / "other")  # another training chain's model
