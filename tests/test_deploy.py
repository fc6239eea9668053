"""The deploy kind end to end on tiny models: builds, conversions, vectors, card, manifest, publish."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from zoo.errors import GateFailed, InvalidInput, StageFailed
from zoo.engine.hashing import hash_file_uncached
from zoo.registry.manifest import MANIFEST_FILE, Manifest
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
from zoo_stages.deploy.kind import Deploy
from zoo_stages.lib.data.datasets import load_split
from zoo_stages.lib.release.modelcard import parse_front_matter
from data_helpers import xy

DATA = {"source": "digits", "path": None, "image_size": 8, "channels": 1, "val_fraction": 0.2,
        "split_seed": 0, "limit": None}
MODEL = {"arch": None, "entry": None, "num_classes": 10, "input_name": "input", "output_name": "logits",
         "task": "image-classification"}
EVAL_SAMPLES = 120
BUILDS = {
    "cpu-fp32": {"from": "optimize"},
    "cpu-int8": {"from": "quantize"},
    "cuda-fp16": {"from": "optimize", "convert": "fp16"},
    "mobile": {"from": "quantize", "convert": "ort"},
}


# ---------------------------------------------------------------------------------------------
# fixtures: a tiny trained classifier, its int8 version, and what verify would have written


def _fit_classifier(x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
    """A 64-32-10 MLP with a random hidden layer and a least-squares output layer (accurate enough)."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((64, 32)).astype(np.float32) * 0.5
    b1 = rng.standard_normal(32).astype(np.float32) * 0.1
    h = np.maximum(x.reshape(len(x), -1) @ w1 + b1, 0)
    target = np.eye(10, dtype=np.float32)[y] * 4 - 2
    w2, *_ = np.linalg.lstsq(np.c_[h, np.ones(len(h))], target, rcond=None)
    return {"W1": w1, "b1": b1, "W2": w2[:-1].astype(np.float32), "b2": w2[-1].astype(np.float32)}


def _classifier(path: Path, weights: dict[str, np.ndarray]) -> Path:
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "W2"], ["o0"]),
        helper.make_node("Add", ["o0", "b2"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny-digits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _write_verify(root: Path, models: dict[str, tuple[str, Path]], x: np.ndarray, y: np.ndarray) -> Path:
    """What verify writes: report.json (flat per-build metrics) and vectors/<build>/test_data_set_0."""
    builds = {}
    ref_acc = None
    for name, (stage, path) in models.items():
        logits = _run(path, x[:EVAL_SAMPLES])
        acc = float(np.mean(np.argmax(logits, 1) == y[:EVAL_SAMPLES]))
        ref_acc = acc if ref_acc is None else ref_acc
        builds[name] = {
            "stage": stage, "model_digest": hash_file_uncached(path), "size_bytes": path.stat().st_size,
            "checker": 1, "checker_error": None, "ir_version": 13, "opset": 17, "custom_domains": [],
            "accuracy": acc, "accuracy_drop": ref_acc - acc, "latency_p50_ms": 0.05, "latency_p90_ms": 0.07,
            "throughput": {"1": 20000.0}, "throughput_bs1": 20000.0, "notes": [], "speedup": None,
        }
        set_dir = root / "vectors" / name / "test_data_set_0"
        set_dir.mkdir(parents=True)
        sample = np.ascontiguousarray(x[3:4])
        (set_dir / "input_0.pb").write_bytes(numpy_helper.from_array(sample, "input").SerializeToString())
        (set_dir / "output_0.pb").write_bytes(numpy_helper.from_array(_run(path, sample), "logits").SerializeToString())
    report = {"reference": next(iter(models)), "threads": 1, "eval_samples": EVAL_SAMPLES, "builds": builds,
              "gates": [{"gate": "cpu-int8.accuracy_drop <= 0.05", "passed": True, "implicit": False}],
              "passed": True}
    (root / "report.json").write_text(json.dumps(report, indent=2))
    return root


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> dict:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = tmp_path_factory.mktemp("upstream")
    x_train, y_train = xy(load_split(DATA, root, "train"))
    x_val, y_val = xy(load_split(DATA, root, "val"))
    fp32 = _classifier(root / "optimize" / "model.onnx", _fit_classifier(np.asarray(x_train), np.asarray(y_train)))
    int8 = root / "quantize" / "model.onnx"
    int8.parent.mkdir()
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8)
    m = onnx.load(str(int8))
    m.ir_version = 13
    onnx.save(m, str(int8))
    verify = _write_verify(root / "verify", {"cpu-fp32": ("optimize", fp32), "cpu-int8": ("quantize", int8)},
                           np.asarray(x_val), np.asarray(y_val))
    return {"root": root, "fp32": fp32, "int8": int8, "verify": verify, "x_val": np.asarray(x_val)}


def _inputs(up: dict, *, with_verify: bool = True) -> Inputs:
    ups = [
        Upstream("optimize", "optimize", {"model": up["fp32"]}, {}, key="cache-key-optimize", record="key-optimize"),
        Upstream("quantize", "quantize", {"model": up["int8"]}, {}, key="cache-key-quantize", record="key-quantize"),
    ]
    if with_verify:
        ups.append(Upstream("verify", "verify", {"report": up["verify"] / "report.json",
                                                  "vectors": up["verify"] / "vectors"}, {}, key="cache-key-verify", record="key-verify"))
    return Inputs(ups)


def _context(tmp: Path, name: str) -> StageContext:
    recipe = RecipeInfo(name="tiny-digits", version="1.2.3", description="A tiny digits classifier for tests.",
                        license="MIT", path=tmp / "recipe.yaml", digest="f" * 64)
    return StageContext(stage_id="deploy", out_dir=tmp / name / "out", work_dir=tmp / name / "work", recipe=recipe,
                        shared={"model": MODEL, "data": DATA, "task": "image-classification"}, matrix={},
                        threads=2, key="key-deploy")


def _deploy(up: dict, tmp: Path, name: str = "run", *, builds=None, with_verify=True, locked=None, **config):
    """Run deploy; with `publish: true`, then publish its release as the engine does once it completed."""
    cfg = Deploy.Config.model_validate({"builds": builds or BUILDS, "publish": False, **config})
    ctx = _context(tmp, name)
    ctx.locked_outputs = locked
    inputs = _inputs(up, with_verify=with_verify)
    release = Deploy().run(inputs, cfg, ctx)["release"]
    if cfg.publish:
        _publish(release, cfg, ctx, inputs)
    return release, ctx


def _publish(release: Path, cfg, ctx: StageContext, inputs: Inputs) -> None:
    """What the runner does after deploy ran (zoo/engine/publish.py): publish the release deploy
    declares, given the upstream results and the metrics of deploy's entry (its own timings); the
    release is this test's workspace, so its files are copied into the zoo."""
    from zoo.engine.publish import publish_release

    ctx.inputs, ctx.entry_metrics = inputs, dict(ctx.metrics)
    publish_release(Deploy(), cfg, {"release": release}, ctx, link=False)


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _manifest(release: Path) -> Manifest:
    return Manifest.model_validate_json((release / MANIFEST_FILE).read_text())


# ---------------------------------------------------------------------------------------------
# the release


@pytest.fixture(scope="module")
def release(upstream, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("deploy")
    rel, ctx = _deploy(upstream, tmp)
    return {"path": rel, "ctx": ctx, "tmp": tmp}


def test_four_builds_with_correct_files(release):
    rel = release["path"]
    m = _manifest(rel)
    assert list(m.builds) == ["cpu-fp32", "cpu-int8", "cuda-fp16", "mobile"]
    assert (m.name, m.version, m.license, m.task) == ("tiny-digits", "1.2.3", "MIT", "image-classification")
    assert m.created is None
    import hashlib

    for ref in m.all_files():
        data = (rel / ref.path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == ref.sha256 and len(data) == ref.size, ref.path
    listed = {ref.path for ref in m.all_files()} | {MANIFEST_FILE}
    assert set(_files(rel)) == listed  # nothing else in the release (no converter leftovers)
    b = m.builds
    assert [b[n].file.path for n in b] == ["builds/cpu-fp32/model.onnx", "builds/cpu-int8/model.onnx",
                                           "builds/cuda-fp16/model.onnx", "builds/mobile/model.ort"]
    assert [b[n].format for n in b] == ["onnx", "onnx", "onnx", "ort"]
    assert [b[n].precision for n in b] == ["fp32", "int8", "fp16", "int8"]
    assert all(b[n].opset == 17 for n in b)
    assert b["cuda-fp16"].execution_providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert b["cuda-fp16"].requires == {"device": "cuda"}
    assert b["cpu-fp32"].execution_providers == ["CPUExecutionProvider"] and b["cpu-fp32"].requires == {}
    assert [f.path for f in b["mobile"].extra_files] == ["builds/mobile/model.required_operators.config"]
    for name in b:
        assert [(p.name, p.dtype, p.shape) for p in b[name].inputs] == [("input", "float32", ["batch", 1, 8, 8])]
        assert [(p.name, p.dtype, p.shape) for p in b[name].outputs] == [("logits", "float32", ["batch", 10])]


def test_unconverted_builds_ship_upstream_bytes_with_verify_metrics_and_vectors(release, upstream):
    rel = release["path"]
    m = _manifest(rel)
    from zoo_stages.lib.release.provenance import read_metadata

    # the shipped model is the upstream graph, stamped with its provenance (metadata_props only)
    for build, source in (("cpu-fp32", "fp32"), ("cpu-int8", "int8")):
        shipped = rel / f"builds/{build}/model.onnx"
        assert onnx.load(str(shipped)).graph == onnx.load(str(upstream[source])).graph
        assert read_metadata(shipped)["zoo.build"] == build
    report = json.loads((upstream["verify"] / "report.json").read_text())
    for name in ("cpu-fp32", "cpu-int8"):
        metrics = m.builds[name].metrics
        assert metrics["accuracy"] == report["builds"][name]["accuracy"]
        # timings are measurements: never in the release artifact (they are added when publishing)
        assert not any(k.startswith(("latency", "throughput", "speedup")) for k in metrics)
        assert metrics["size_bytes"] == m.builds[name].file.size
        # strings, nested tables, None and model properties are not metrics
        assert not {"stage", "model_digest", "throughput", "notes", "speedup", "opset", "checker_error"} & set(metrics)
        vectors = [f.path for f in m.builds[name].test_vectors]
        assert vectors == [f"builds/{name}/test_data_set_0/input_0.pb", f"builds/{name}/test_data_set_0/output_0.pb"]
        for path in vectors:
            src = upstream["verify"] / "vectors" / name / path.split("/", 2)[2]
            assert (rel / path).read_bytes() == src.read_bytes()
    assert m.builds["cpu-fp32"].metrics["accuracy"] > 0.8  # the fixture model is a real classifier
    assert m.extra["deploy"]["verified_as"] == {"cpu-fp32": "cpu-fp32", "cpu-int8": "cpu-int8",
                                                "cuda-fp16": "cpu-fp32", "mobile": "cpu-int8"}


def test_fp16_build_keeps_float32_io_and_passes_parity(release, upstream):
    rel = release["path"]
    m = _manifest(rel)
    model = onnx.load(str(rel / "builds/cuda-fp16/model.onnx"))
    assert model.ir_version <= 13
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert TensorProto.FLOAT16 in {i.data_type for i in model.graph.initializer}
    metrics = m.builds["cuda-fp16"].metrics
    assert 0 < metrics["parity_max_abs"] <= 1e-2 + 1e-2 * 10
    assert metrics["parity_atol"] == 1e-2 and metrics["parity_samples"] == EVAL_SAMPLES
    assert metrics["parity_cosine"] > 0.9999
    assert metrics["accuracy_samples"] == EVAL_SAMPLES
    assert abs(metrics["accuracy_drop"]) <= 0.02
    # generated vectors: verify's reference input, outputs of the fp16 model itself
    vec = rel / "builds/cuda-fp16/test_data_set_0"
    x = numpy_helper.to_array(onnx.load_tensor(str(vec / "input_0.pb")))
    y = numpy_helper.to_array(onnx.load_tensor(str(vec / "output_0.pb")))
    assert (vec / "input_0.pb").read_bytes() == (upstream["verify"] / "vectors/cpu-fp32/test_data_set_0/input_0.pb").read_bytes()
    np.testing.assert_array_equal(_run(rel / "builds/cuda-fp16/model.onnx", x), y)
    conv = m.extra["deploy"]["conversions"]["cuda-fp16"]
    assert conv["kind"] == "fp16" and conv["from"] == "optimize" and conv["keep_io_types"] is True


def test_ort_build_loads_and_matches_source(release, upstream):
    rel = release["path"]
    m = _manifest(rel)
    x = upstream["x_val"][:32]
    np.testing.assert_allclose(_run(rel / "builds/mobile/model.ort", x), _run(upstream["int8"], x), atol=1e-4, rtol=1e-4)
    assert m.builds["mobile"].metrics["parity_max_abs"] <= 1e-4
    conv = m.extra["deploy"]["conversions"]["mobile"]
    assert conv["optimization_style"] == "Fixed"
    assert conv["files"] == ["model.ort", "model.required_operators.config"]
    config = (rel / "builds/mobile/model.required_operators.config").read_text()
    assert str(release["tmp"]) not in config and "ai.onnx;" in config
    vec = rel / "builds/mobile/test_data_set_0"
    x0 = numpy_helper.to_array(onnx.load_tensor(str(vec / "input_0.pb")))
    np.testing.assert_array_equal(_run(rel / "builds/mobile/model.ort", x0),
                                  numpy_helper.to_array(onnx.load_tensor(str(vec / "output_0.pb"))))


def test_model_card_front_matter_and_sections(release):
    rel = release["path"]
    m = _manifest(rel)
    assert m.card is not None and m.card.path == "README.md"
    text = (rel / "README.md").read_text()
    front, body = parse_front_matter(text)
    assert front["license"] == "MIT" and front["task"] == "image-classification"
    assert set(front["metrics"]) == set(m.builds)
    assert front["metrics"]["cpu-int8"]["accuracy"] == m.builds["cpu-int8"].metrics["accuracy"]
    assert front["lineage"]["recipe"] == {"name": "tiny-digits", "version": "1.2.3", "digest": "f" * 64}
    assert front["lineage"]["stages"] == {"optimize": "key-optimize", "quantize": "key-quantize", "verify": "key-verify"}
    assert front["dataset"]["source"] == "digits" and front["datasets"] == ["digits"]
    assert front["builds"]["mobile"]["sha256"] == m.builds["mobile"].file.sha256
    for name in m.builds:
        assert f"zoo pull tiny-digits@1.2.3 --build {name}" in body
    for section in ("## Builds", "## Intended use", "## Limitations", "## How to pull", "## Lineage",
                    "## Conversions", "## Verification"):
        assert section in body
    assert "| `cuda-fp16` |" in body and "CUDAExecutionProvider" in body


def test_lineage_tools_and_metrics(release):
    m = _manifest(release["path"])
    from importlib.metadata import version

    assert m.lineage.tools["onnx"] == version("onnx") and m.lineage.tools["onnxruntime"] == version("onnxruntime")
    assert m.lineage.stages == {"optimize": "key-optimize", "quantize": "key-quantize", "verify": "key-verify"}
    assert set(m.lineage.sources) == {"data"}
    assert m.lineage.tools["flatbuffers"] == version("flatbuffers")  # it writes the canonical .ort bytes
    assert release["ctx"].metrics["builds"] == list(m.builds)


def test_release_is_byte_deterministic(release, upstream, tmp_path):
    again, _ = _deploy(upstream, tmp_path, "second")
    first, second = _files(release["path"]), _files(again)
    assert list(first) == list(second)
    for path in first:
        assert first[path] == second[path], path


# ---------------------------------------------------------------------------------------------
# errors and options


def test_parity_failure_raises_gate_with_table(upstream, tmp_path):
    with pytest.raises(GateFailed) as err:
        _deploy(upstream, tmp_path, builds={"cuda-fp16": {"from": "optimize", "convert": "fp16", "atol": 0, "rtol": 0}})
    assert "cuda-fp16" in err.value.message and "logits" in err.value.table and "violations" in err.value.table


def test_a_build_that_is_not_valid_onnx_fails_the_stage_and_nothing_is_released(upstream, tmp_path, monkeypatch):
    """The float16 converter's own output (its input Casts after the nodes that read them, as
    onnxruntime's converter leaves it without zoo's reordering) fails onnx.checker at deploy."""
    from zoo_stages.lib.onnx import graph_order

    monkeypatch.setattr(graph_order, "sort_graph", lambda graph, outer=(): False)
    with pytest.raises(StageFailed, match="build cuda-fp16: model.onnx is not valid ONNX "
                                          r"\(onnx.checker: Nodes in a graph must be topologically sorted") as e:
        _deploy(upstream, tmp_path, builds={"cuda-fp16": {"from": "optimize", "convert": "fp16"}})
    assert "nothing was published" in e.value.message


def test_wrong_verified_name_is_caught_by_digest(upstream, tmp_path):
    with pytest.raises(GateFailed, match="not the model verify checked"):
        _deploy(upstream, tmp_path, builds={"cpu-fp32": {"from": "optimize", "verified_as": "cpu-int8"}})


def test_tampered_vectors_are_caught(upstream, tmp_path):
    import shutil

    verify = tmp_path / "verify"
    shutil.copytree(upstream["verify"], verify)
    out = verify / "vectors/cpu-fp32/test_data_set_0/output_0.pb"
    arr = numpy_helper.to_array(onnx.load_tensor(str(out))) + 1.0
    out.write_bytes(numpy_helper.from_array(arr, "logits").SerializeToString())
    up = dict(upstream, verify=verify)
    with pytest.raises(GateFailed, match="does not reproduce"):
        _deploy(up, tmp_path, builds={"cpu-fp32": {"from": "optimize"}})
    # unchecked against onnxruntime, the vectors still fail under onnx.reference: the only build is then not
    # portable ONNX, and a version without one is refused
    with pytest.raises(StageFailed, match="no build of this version is portable ONNX .cpu-fp32: onnx's reference "
                                          "evaluator: test_data_set_0: "):
        _deploy(up, tmp_path, "unchecked", builds={"cpu-fp32": {"from": "optimize"}}, check_vectors=False)


def test_unknown_source_and_verified_as(upstream, tmp_path):
    with pytest.raises(InvalidInput, match="builds.gpu.from") as err:
        _deploy(upstream, tmp_path, builds={"gpu": {"from": "export"}})
    assert "optimize" in err.value.hint
    with pytest.raises(InvalidInput, match="verified_as"):
        _deploy(upstream, tmp_path, builds={"cpu-fp32": {"from": "optimize", "verified_as": "nope"}})
    with pytest.raises(InvalidInput, match="has no `model` output"):
        _deploy(upstream, tmp_path, builds={"x": {"from": "verify"}})


def test_fp16_of_int8_source_is_refused(upstream, tmp_path):
    with pytest.raises(InvalidInput, match="quantized"):
        _deploy(upstream, tmp_path, builds={"gpu": {"from": "quantize", "convert": "fp16"}})


def test_config_validation():
    cfg = Deploy.Config.model_validate({"builds": {"cpu-fp32": "optimize"}})
    assert cfg.builds["cpu-fp32"].source == "optimize" and cfg.publish is True
    with pytest.raises(ValidationError, match="build name"):
        Deploy.Config.model_validate({"builds": {"CPU FP32": {"from": "optimize"}}})
    with pytest.raises(ValidationError, match="optimization_style"):
        Deploy.Config.model_validate({"builds": {"g": {"from": "optimize", "convert": "fp16",
                                                       "optimization_style": "Fixed"}}})
    with pytest.raises(ValidationError):
        Deploy.Config.model_validate({"builds": {"g": {"from": "optimize", "convert": "tflite"}}})
    with pytest.raises(ValidationError):
        Deploy.Config.model_validate({"builds": {"g": {"from": "optimize", "bogus": 1}}})
    with pytest.raises(ValidationError):
        Deploy.Config.model_validate({"builds": {}})


def test_without_verify_builds_get_generated_vectors(upstream, tmp_path):
    release, _ = _deploy(upstream, tmp_path, with_verify=False, vector_samples=4,
                         builds={"cpu-fp32": {"from": "optimize"}, "mobile": {"from": "quantize", "convert": "ort",
                                                                              "optimization_style": "Runtime"}})
    m = _manifest(release)
    assert "accuracy" not in m.builds["cpu-fp32"].metrics
    assert m.builds["mobile"].metrics["parity_samples"] == len(upstream["x_val"])  # whole held-out split
    x = numpy_helper.to_array(onnx.load_tensor(str(release / "builds/cpu-fp32/test_data_set_0/input_0.pb")))
    np.testing.assert_array_equal(x, upstream["x_val"][:4])
    assert m.extra["deploy"]["conversions"]["mobile"]["optimization_style"] == "Runtime"
    # the pinned onnxruntime replays the saved optimizations of this model and matches the source
    assert m.extra["deploy"]["conversions"]["mobile"]["runtime_optimizations_replay"] == "ok"
    assert "session.enable_saved_runtime_optimizations" in (release / "README.md").read_text()
    assert "verification" not in m.extra["deploy"]


@pytest.mark.parametrize("broken,expect", [("raises", "fails: onnxruntime cannot load model.ort: cannot replay here"),
                                           ("differs", "outputs differ: max |diff| ")])
def test_a_failed_replay_is_recorded_not_fatal_with_a_stand_in_onnxruntime(upstream, tmp_path, monkeypatch,
                                                                           broken, expect):
    """Stand-in: onnxruntime's replay of saved runtime optimizations is replaced by one that raises
    or that returns shifted outputs (the pinned onnxruntime replays this model fine). The build
    still ships, and its conversion record says what the replay did."""
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    real_open, real_run = ort_session.make_session, onnx_run.run
    replayed = set()

    def make_session(model, **kwargs):
        session = real_open(model, **kwargs)
        if kwargs.get("runtime_optimizations"):
            if broken == "raises":  # what the real builder raises for a model it cannot load
                raise InvalidInput("onnxruntime cannot load model.ort: cannot replay here\nsecond line")
            replayed.add(id(session))
        return session

    def run(session, feeds, **kwargs):
        out = real_run(session, feeds, **kwargs)
        return {name: o + 1.0 for name, o in out.items()} if id(session) in replayed else out

    monkeypatch.setattr(ort_session, "make_session", make_session)
    monkeypatch.setattr(onnx_run, "run", run)
    release, _ = _deploy(upstream, tmp_path, with_verify=False,
                         builds={"mobile": {"from": "quantize", "convert": "ort", "optimization_style": "Runtime"},
                                 "cpu-int8": {"from": "quantize"}})  # the portable build every version has
    replay = _manifest(release).extra["deploy"]["conversions"]["mobile"]["runtime_optimizations_replay"]
    assert replay.startswith(expect) and "second line" not in replay, replay


def test_gpu_builds_are_verified_on_the_providers_a_host_offers_with_a_stand_in_onnxruntime(upstream, tmp_path,
                                                                                           monkeypatch):
    """Stand-in: this host has no NVIDIA GPU, so onnxruntime is made to offer TensorRT and CUDA and
    the sessions asked of them run on the CPU. What this checks is zoo's side of a GPU host: the
    sessions deploy asks for (providers, TensorRT's options and engine folder), builds published
    verified with parity and timings recorded against the provider and the GPU, and a card that
    says where parity was checked. (On a real GPU host test_recipe_lenet_e2e checks the provider.)"""
    import onnxruntime
    from zoo.registry.store import LocalZoo
    from zoo_stages.lib.runtimes import host_info, ort_session
    from zoo_stages.lib.runtimes import tensorrt_build as trt

    real_providers, real_open = onnxruntime.get_available_providers, ort_session.make_session
    asked: list[tuple[tuple[str, ...], dict | None]] = []

    def make_session(model, *, providers=("CPUExecutionProvider",), provider_options=None, **kwargs):
        asked.append((tuple(providers), provider_options))
        return real_open(model, **kwargs)  # on the CPU

    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: [trt.TENSORRT_PROVIDER, trt.CUDA_PROVIDER, *real_providers()])
    monkeypatch.setattr(ort_session, "make_session", make_session)
    monkeypatch.setattr(host_info, "gpu_name", lambda: "Stand-in GPU")
    monkeypatch.setattr(trt, "tensorrt_version", lambda: "10.9.0")
    release, ctx = _deploy(upstream, tmp_path, with_verify=False, publish=True,
                           builds={"cpu-fp32": {"from": "optimize"},
                                   "cuda-fp16": {"from": "optimize", "convert": "fp16"},
                                   "tensorrt-fp16": {"from": "optimize", "convert": "tensorrt"}})
    m = LocalZoo().resolve(ctx.effects[0].ref)  # the published version: the release plus the timings
    engines = ctx.work_dir / "tensorrt-engines" / "tensorrt-fp16"
    trt_asked = [options for providers, options in asked if providers[0] == trt.TENSORRT_PROVIDER]
    assert trt_asked and trt_asked[0][trt.TENSORRT_PROVIDER]["trt_engine_cache_path"] == str(engines)
    assert trt_asked[0][trt.TENSORRT_PROVIDER]["trt_fp16_enable"] == "True" and engines.is_dir()
    assert (trt.CUDA_PROVIDER,) in [providers for providers, _ in asked]
    conversions = m.extra["deploy"]["conversions"]
    for name, provider in (("cuda-fp16", trt.CUDA_PROVIDER), ("tensorrt-fp16", trt.TENSORRT_PROVIDER)):
        build = m.builds[name]
        assert build.verified is True and build.unverified_reason == "", name
        assert build.measured_on["execution_provider"] == provider and build.measured_on["device"] == "Stand-in GPU"
        assert build.metrics["latency_p50_ms"] > 0 and build.metrics["parity_max_abs"] < 1e-2, name
        assert conversions[name]["parity_on"] == f"{provider} (Stand-in GPU)"
    assert m.builds["tensorrt-fp16"].measured_on["runtime_version"].endswith("(TensorRT 10.9.0)")
    assert m.builds["tensorrt-fp16"].provider_options == {trt.TENSORRT_PROVIDER: trt.provider_options("fp16")}
    card = (release / "README.md").read_text()
    assert f"parity on {trt.TENSORRT_PROVIDER} (Stand-in GPU)" in card and "not run with TensorRT" not in card
    assert f"parity on {trt.CUDA_PROVIDER} (Stand-in GPU)" in card and "not run on a CUDA GPU" not in card


def test_rerun_replaces_previous_release(upstream, tmp_path):
    first, _ = _deploy(upstream, tmp_path, "same", builds={"cpu-fp32": {"from": "optimize"}})
    (first / "stray.txt").write_text("left over")
    again, _ = _deploy(upstream, tmp_path, "same", builds={"cpu-int8": {"from": "quantize"}})
    assert again == first
    assert list(_manifest(again).builds) == ["cpu-int8"]
    assert not (again / "stray.txt").exists() and not (again / "builds/cpu-fp32").exists()


# ---------------------------------------------------------------------------------------------
# registration and import cost


def test_kind_is_registered_and_import_is_light():
    from zoo.engine import kind_loader

    assert kind_loader.get("deploy") is Deploy
    assert Deploy.outputs == ("release",) and Deploy.shared == ("data", "model.task", "task")
    code = ("import sys, zoo_stages.deploy.kind, zoo_stages.lib.runtimes.convert, zoo_stages.lib.onnx.model_info, "
            "zoo_stages.lib.release.modelcard; "
            "print(sorted(m for m in ('onnx', 'onnxruntime', 'torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------
# publishing to the local zoo (ZOO_HOME points at a temp dir, see conftest.py)


def test_publish_to_local_zoo_is_idempotent_and_immutable(upstream, tmp_path, isolated_zoo_paths):
    from zoo.errors import Conflict
    from zoo.registry.store import LocalZoo

    release, ctx = _deploy(upstream, tmp_path, "pub", publish=True)
    zoo = LocalZoo()
    assert zoo.root == isolated_zoo_paths / "home"
    assert [str(e) for e in ctx.effects] == ["published tiny-digits@1.2.3"]
    assert "published" not in ctx.metrics and "zoo" not in ctx.metrics  # metrics are cached: no effects there
    stored = zoo.get("tiny-digits", "1.2.3")
    # the effect's evidence is the version in this zoo: its manifest and every blob
    evidence = {Path(p) for p in ctx.effects[0].evidence}
    assert evidence == {zoo.manifest_path("tiny-digits", "1.2.3")} | {zoo.blobs.path(f.sha256) for f in stored.all_files()}
    staged = _manifest(release)
    assert stored is not None and stored.created is not None
    assert stored.model_copy(update={"created": None}) == staged
    assert zoo.missing(stored.all_files()) == []
    # the published mobile build materializes and its test vector reproduces
    model = zoo.materialize(stored, "mobile", tmp_path / "installed")
    vec = model.parent / "test_data_set_0"
    x = numpy_helper.to_array(onnx.load_tensor(str(vec / "input_0.pb")))
    np.testing.assert_array_equal(_run(model, x), numpy_helper.to_array(onnx.load_tensor(str(vec / "output_0.pb"))))
    # a rebuild from the same inputs is bit-identical, so publishing it again is a no-op
    _, again = _deploy(upstream, tmp_path, "pub-again", publish=True)
    assert [str(e) for e in again.effects] == ["published tiny-digits@1.2.3"]
    assert zoo.get("tiny-digits", "1.2.3").created == stored.created
    # different bytes under the same version are refused
    with pytest.raises(Conflict):
        _deploy(upstream, tmp_path, "pub-changed", publish=True, intended_use="Something else entirely.")


def test_deploy_declares_its_release_and_publishes_nothing_itself(upstream, tmp_path, isolated_zoo_paths):
    """Publishing is the engine's effect (zoo/engine/publish.py, applied by the runner only to bytes
    the lockfile still pins: tests/test_kind_hooks.py): deploy's run leaves the local zoo alone."""
    from zoo.registry.store import LocalZoo

    cfg = Deploy.Config.model_validate({"builds": BUILDS, "publish": True})
    ctx = _context(tmp_path, "declared")
    release = Deploy().run(_inputs(upstream), cfg, ctx)["release"]
    assert ctx.effects == [] and LocalZoo().get("tiny-digits", "1.2.3") is None
    assert Deploy().release_output(cfg) == "release" and (release / MANIFEST_FILE).is_file()


def test_release_hooks_name_the_release_check_its_provenance_and_report_its_builds(upstream, tmp_path):
    from zoo_stages.lib.release.provenance import LOCK_FILE, STATEMENT_FILE

    release, ctx = _deploy(upstream, tmp_path, "hooks", publish=True)
    kind, manifest = Deploy(), _manifest(release)
    assert kind.release_output(Deploy.Config.model_validate({"builds": BUILDS})) == "release"
    assert kind.release_output(Deploy.Config.model_validate({"builds": BUILDS, "publish": False})) is None
    assert set(Deploy.release_files) == {LOCK_FILE, STATEMENT_FILE} <= {f.path for f in manifest.files}
    assert kind.check_release(manifest, lambda path: (release / path).read_bytes()) == []
    # a statement that leaves a build file out, or names other bytes, or does not parse
    stmt = json.loads((release / STATEMENT_FILE).read_text())
    dropped = stmt["subject"].pop(0)
    assert kind.check_release(manifest, lambda path: json.dumps(stmt).encode()) == [
        f"{STATEMENT_FILE}: build file {dropped['name']} is not a subject of the statement"]
    stmt["subject"].append({**dropped, "digest": {"sha256": "0" * 64}})
    [problem] = kind.check_release(manifest, lambda path: json.dumps(stmt).encode())
    assert problem.startswith(f"{STATEMENT_FILE}: subject {dropped['name']}: sha256 000000000000")
    assert "is not valid JSON" in kind.check_release(manifest, lambda path: b"{")[0]
    # the run summary: the builds of the version this run published, read back from the local zoo
    [table] = kind.report("deploy", ctx.metrics, ctx.effects)
    assert table.title == "builds of tiny-digits@1.2.3"
    assert [c.header for c in table.columns] == ["build", "format", "precision", "size", "accuracy", "p50 ms", "sha256"]
    assert [row[0] for row in table.rows] == list(manifest.builds)
    assert [row[-1] for row in table.rows] == [b.file.sha256[:12] for b in manifest.builds.values()]
    assert kind.report("deploy", ctx.metrics, []) == []  # published nothing: nothing to show


def _timed_inputs(up: dict, latency: float) -> Inputs:
    """Upstream results whose verify metrics carry timings, as the runner passes them."""
    report = json.loads((up["verify"] / "report.json").read_text())
    measured = {name: {**b, "latency_p50_ms": latency, "latency_p90_ms": latency * 2, "throughput_bs1": 1000 / latency}
                for name, b in report["builds"].items()}
    gates = report["gates"] + [{"gate": "cpu-int8.latency_p50_ms <= 1", "build": "cpu-int8", "metric": "latency_p50_ms",
                                "op": "<=", "threshold": 1, "value": latency, "passed": True}]
    ups = list(_inputs(up))
    ups[-1] = Upstream("verify", "verify", ups[-1].outputs, {"builds": measured, "gates": gates}, key="cache-key-verify", record="key-verify")
    return Inputs(ups)


def test_release_never_holds_timings_but_the_publication_does(upstream, tmp_path):
    from zoo.registry.store import LocalZoo

    builds = {"cpu-fp32": {"from": "optimize"}, "cpu-int8": {"from": "quantize"}}
    cfg = Deploy.Config.model_validate({"builds": builds, "publish": True})
    first_ctx, second_ctx = _context(tmp_path, "a"), _context(tmp_path, "b")
    first = Deploy().run(_timed_inputs(upstream, 0.05), cfg, first_ctx)["release"]
    _publish(first, cfg, first_ctx, _timed_inputs(upstream, 0.05))
    # a rerun of verify measures other timings: the release artifact is byte-identical
    second = Deploy().run(_timed_inputs(upstream, 0.09), cfg, second_ctx)["release"]
    assert _files(first) == _files(second)
    m = _manifest(first)
    assert not any(k.startswith(("latency", "throughput", "speedup")) for b in m.builds.values() for k in b.metrics)
    # the published version adds the measured timings (and the timing gate's value) to manifest and card
    published = LocalZoo().resolve(first_ctx.effects[0].ref)
    assert published.builds["cpu-int8"].metrics["latency_p50_ms"] == 0.05
    assert published.builds["cpu-int8"].metrics["accuracy"] == m.builds["cpu-int8"].metrics["accuracy"]
    assert published.builds["cpu-int8"].file.sha256 == m.builds["cpu-int8"].file.sha256
    gate = published.extra["deploy"]["verification"]["gates"][-1]
    assert gate["gate"] == "cpu-int8.latency_p50_ms <= 1" and gate["value"] == 0.05
    # without measurements, the release itself is what gets published
    cfg_plain = Deploy.Config.model_validate({"builds": builds, "publish": False, "measurements": False})
    rel = Deploy().run(_timed_inputs(upstream, 0.05), cfg_plain, _context(tmp_path, "c"))["release"]
    assert _files(rel) == _files(first)


def test_a_cached_release_is_published_with_the_timings_its_verify_entry_measured(upstream, tmp_path, monkeypatch):
    """The engine publishes a cached deploy (a cache hit, or a deploy that ran on a Dask worker) with
    verify's result in `context.inputs`: the version is the one published after deploy ran here on
    the same verify result (manifest and card), not the release without timings."""
    from zoo.engine.publish import publish_release
    from zoo.registry.codec import dump_manifest
    from zoo.registry.store import LocalZoo

    builds = {"cpu-fp32": {"from": "optimize"}, "cpu-int8": {"from": "quantize"}}
    cfg = Deploy.Config.model_validate({"builds": builds, "publish": True})
    ran_ctx = _context(tmp_path, "ran")
    release = Deploy().run(_timed_inputs(upstream, 0.05), cfg, ran_ctx)["release"]
    _publish(release, cfg, ran_ctx, _timed_inputs(upstream, 0.05))
    ran = LocalZoo().resolve(ran_ctx.effects[0].ref)
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "other-home"))  # another machine's zoo, the same cache
    cached_ctx = _context(tmp_path, "cached")
    cached_ctx.inputs = _timed_inputs(upstream, 0.05)
    publish_release(Deploy(), cfg, {"release": release}, cached_ctx, link=False)
    zoo_ = LocalZoo()
    cached = zoo_.resolve(cached_ctx.effects[0].ref)
    assert cached.builds["cpu-int8"].metrics["latency_p50_ms"] == 0.05
    assert dump_manifest(cached.model_copy(update={"created": ran.created})) == dump_manifest(ran)
    # without verify's result (a caller outside the engine), the release as built, as before
    monkeypatch.setenv("ZOO_HOME", str(tmp_path / "third-home"))
    publish_release(Deploy(), cfg, {"release": release}, _context(tmp_path, "bare"), link=False)
    assert "latency_p50_ms" not in LocalZoo().resolve("tiny-digits@1.2.3").builds["cpu-int8"].metrics

