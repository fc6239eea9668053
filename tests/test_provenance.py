"""Provenance: metadata_props on every ONNX artifact, zoo.lock and the in-toto statement of a release,
license/attribution propagation from a pretrained-weights source to every derived build.

One tiny chain is built by calling the kinds directly (as the engine would): export (from
`weights:` with a license and attribution) -> optimize -> quantize (dynamic) -> deploy.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra; the torch-free tests of these kinds are in other modules")

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

from zoo.engine.hashing import hash_file_uncached  # noqa: E402
from zoo.engine.lockfile import StageLock, read as read_lock  # noqa: E402
from zoo.registry.manifest import MANIFEST_FILE, Manifest  # noqa: E402
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream  # noqa: E402
from zoo_stages.deploy.kind import Deploy  # noqa: E402
from zoo_stages.export import Export  # noqa: E402
from zoo_stages.lib.models import archs
from zoo_stages.lib.release import provenance  # noqa: E402
from zoo_stages.optimize import Optimize  # noqa: E402
from zoo_stages.quantize import Quantize  # noqa: E402

DATA = {"source": "digits", "path": None, "image_size": 8, "channels": 1, "val_fraction": 0.2,
        "split_seed": 0, "limit": None}
LENET = {"arch": "lenet5", "num_classes": 10, "entry": None, "input_name": "input", "output_name": "logits",
         "task": "image-classification"}
LICENSE = "Apache-2.0"
WEIGHTS_LICENSE, WEIGHTS_CREDIT = "BSD-3-Clause", "Example Labs pretrained LeNet"
BUILDS = {"cpu-fp32": {"from": "optimize"}, "cpu-int8": {"from": "quantize"},
          "cuda-fp16": {"from": "export", "convert": "fp16"}, "mobile": {"from": "quantize", "convert": "ort"}}


def _recipe(tmp: Path) -> RecipeInfo:
    return RecipeInfo(name="tiny-lenet", version="2.1.0", description="provenance test", license=LICENSE,
                      path=tmp / "recipe.yaml", digest="d" * 64)


def _ctx(tmp: Path, stage: str, record: str, *, lineage=None, publish=False, key: str = "") -> StageContext:
    """A context whose record digest is `record`; its cache key is another value (`key`), which
    nothing may stamp (a key also holds code: tests/test_frozen.py's epoch test)."""
    return StageContext(stage_id=stage, out_dir=tmp / stage / "out", work_dir=tmp / stage / "work",
                        recipe=_recipe(tmp), shared={"data": DATA, "model": LENET}, matrix={}, threads=1,
                        key=key or f"cache-key-of-{stage}", record=record, publish=publish, lineage=lineage or {})


def _record(kind: str, key: str, outputs: dict[str, str]) -> dict:
    """A lock record as the engine puts it into context.lineage (`key` only makes it differ from others)."""
    return StageLock(kind=kind, kind_version="2", config={"x": key}, config_digest="c" * 64,
                     shared={}, matrix={}, inputs={}, files={"data/x.csv": "e" * 64},
                     tools={"onnx": "1.23"}, outputs=outputs, recipe={"license": LICENSE}).to_json()


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("chain")
    with pytest.MonkeyPatch.context() as mp:  # module scope: set up before conftest's per-test paths
        mp.setenv("ZOO_CACHE_DIR", str(tmp / "cache"))
        mp.setenv("ZOO_HOME", str(tmp / "home"))
        return _build_chain(tmp)


def _build_chain(tmp: Path) -> dict:
    torch.manual_seed(0)
    weights = tmp / "lenet-pretrained.pt"
    torch.save(archs.build_model(LENET, tmp, in_channels=1).state_dict(), weights)
    sha = hashlib.sha256(weights.read_bytes()).hexdigest()
    export_cfg = Export.Config.model_validate({"input_shape": [1, 8, 8], "parity": {"samples": 2}, "weights": {
        "path": weights.name, "sha256": sha, "license": WEIGHTS_LICENSE, "attribution": WEIGHTS_CREDIT}})
    exported = Export().run(Inputs([]), export_cfg, _ctx(tmp, "export", "key-export"))["model"]
    up_export = Upstream("export", "export", {"model": exported}, {}, key="key-export", record="record-export")
    optimized = Optimize().run(Inputs([up_export]), Optimize.Config(), _ctx(tmp, "optimize", "key-optimize"))["model"]
    quant_cfg = Quantize.Config.model_validate({"mode": "dynamic", "accept": {"min_speedup": 0.0, "max_accuracy_drop": 1.0},
                                                "latency": {"warmup": 1, "runs": 3}})
    quantized = Quantize().run(Inputs([up_export]), quant_cfg, _ctx(tmp, "quantize", "key-quantize"))["model"]
    ups = [up_export,
           Upstream("optimize", "optimize", {"model": optimized}, {}, key="key-optimize", record="record-optimize"),
           Upstream("quantize", "quantize", {"model": quantized}, {}, key="key-quantize", record="record-quantize")]
    lineage = {u.stage_id: _record(u.kind, u.key, {"model": hash_file_uncached(u.outputs["model"])}) for u in ups}
    deploy_cfg = Deploy.Config.model_validate({"builds": BUILDS, "publish": False})
    release = Deploy().run(Inputs(ups), deploy_cfg, _ctx(tmp, "deploy", "key-deploy", lineage=lineage))["release"]
    return {"tmp": tmp, "weights": weights, "sha": sha, "export": exported, "optimize": optimized,
            "quantize": quantized, "release": release, "ups": ups, "lineage": lineage, "deploy_cfg": deploy_cfg}


def _props(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def _manifest(release: Path) -> Manifest:
    return Manifest.model_validate_json((release / MANIFEST_FILE).read_text())


# ---------------------------------------------------------------------------------------------
# intermediate artifacts


def test_intermediate_models_carry_what_their_key_determines(chain):
    expected_sources = {
        "export": {"weights": f"sha256:{chain['sha']}"},
        "optimize": {"export.model": f"blake3:{hash_file_uncached(chain['export'])}"},
        "quantize": {"export.model": f"blake3:{hash_file_uncached(chain['export'])}"},
    }
    for kind in ("export", "optimize", "quantize"):
        props = _props(chain[kind])
        zoo = {k: v for k, v in props.items() if k.startswith("zoo.")}
        # not zoo's version nor the cache key: neither is in the stage's record
        assert set(zoo) == {"zoo.kind", "zoo.stage_record", "zoo.sources", "zoo.license", "zoo.attribution"}, kind
        assert zoo["zoo.kind"] == kind and "cache-key" not in json.dumps(zoo)
        assert zoo["zoo.stage_record"] == f"key-{kind}" and zoo["zoo.license"] == LICENSE
        assert json.loads(zoo["zoo.sources"]) == expected_sources[kind]
        # the stage id is not in a cache key, so it is never stamped; nor is the recipe's version
        assert "zoo.stage" not in zoo and "zoo.engine.recipe" not in zoo
        # the wire-level reader agrees with onnx's parser
        assert provenance.read_metadata(chain[kind]) == props
    for kind in (Export, Optimize, Quantize):
        assert kind.recipe_fields == ("license",)  # the license they stamp enters their key


def test_weights_attribution_propagates_through_every_stage(chain):
    want = [{"source": "weights", "uri": f"file:{chain['weights'].name}", "sha256": chain["sha"],
             "license": WEIGHTS_LICENSE, "attribution": WEIGHTS_CREDIT}]
    for kind in ("export", "optimize", "quantize"):
        assert json.loads(_props(chain[kind])["zoo.attribution"]) == want, kind
    assert provenance.upstream_attribution(Inputs(chain["ups"])) == want


def test_stamping_is_deterministic_and_keeps_foreign_props(chain, tmp_path):
    again = Optimize().run(Inputs(chain["ups"][:1]), Optimize.Config(), _ctx(tmp_path, "optimize", "key-optimize"))
    assert again["model"].read_bytes() == chain["optimize"].read_bytes()
    # another cache key (the kind's code changed), the same record: the same bytes
    recoded = Optimize().run(Inputs(chain["ups"][:1]), Optimize.Config(),
                             _ctx(tmp_path / "re", "optimize", "key-optimize", key="a-new-code-key"))
    assert recoded["model"].read_bytes() == chain["optimize"].read_bytes()
    other = Optimize().run(Inputs(chain["ups"][:1]), Optimize.Config(), _ctx(tmp_path, "o2", "another-key"))
    assert _props(other["model"])["zoo.stage_record"] == "another-key"
    model = onnx.load(str(chain["export"]))
    entry = model.metadata_props.add()
    entry.key, entry.value = "author", "someone"
    provenance.stamp(model, {"zoo.kind": "test", "zoo.b": "2", "zoo.a": "1"})
    assert [(p.key, p.value) for p in model.metadata_props] == [("author", "someone"), ("zoo.a", "1"),
                                                                 ("zoo.b", "2"), ("zoo.kind", "test")]
    with pytest.raises(ValueError, match="must start with"):
        provenance.stamp(model, {"version": "1"})


# ---------------------------------------------------------------------------------------------
# the release


def test_every_shipped_build_carries_the_full_stamp(chain):
    rel, m = chain["release"], _manifest(chain["release"])
    assert [m.builds[b].file.path for b in BUILDS] == ["builds/cpu-fp32/model.onnx", "builds/cpu-int8/model.onnx",
                                                       "builds/cuda-fp16/model.onnx", "builds/mobile/model.ort"]
    sources = {"cpu-fp32": "optimize", "cpu-int8": "quantize", "cuda-fp16": "export", "mobile": "quantize"}
    for name, build in m.builds.items():
        path = rel / build.file.path
        if build.format == "onnx":
            props = _props(path)
        else:  # the ORT format keeps metadata_props too (converted from a stamped copy)
            props = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_modelmeta().custom_metadata_map
        src = chain[sources[name]]
        assert props["zoo.recipe"] == "tiny-lenet@2.1.0" and props["zoo.recipe_digest"] == "d" * 64
        assert props["zoo.stage_record"] == "key-deploy" and props["zoo.build"] == name and props["zoo.kind"] == "deploy"
        assert props["zoo.license"] == LICENSE and "zoo.version" not in props
        assert json.loads(props["zoo.sources"]) == {f"{sources[name]}.model": f"blake3:{hash_file_uncached(src)}"}
        assert json.loads(props["zoo.attribution"])[0]["license"] == WEIGHTS_LICENSE
    # stamping changes no output: the shipped fp32 model computes exactly what its source does
    x = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    run = lambda p: ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]  # noqa: E731
    np.testing.assert_array_equal(run(rel / "builds/cpu-fp32/model.onnx"), run(chain["optimize"]))


def test_release_holds_its_lockfile_and_an_in_toto_statement(chain, tmp_path):
    rel, m = chain["release"], _manifest(chain["release"])
    assert [f.path for f in m.files] == [provenance.LOCK_FILE, provenance.STATEMENT_FILE]
    for f in m.files:
        assert hashlib.sha256((rel / f.path).read_bytes()).hexdigest() == f.sha256
    # zoo.lock: the engine's lockfile format, holding exactly the lineage records, under no platform
    # class (the release's bytes depend on its key alone, which does not say where it was built)
    (tmp_path / "r.lock").write_bytes((rel / provenance.LOCK_FILE).read_bytes())
    lock = read_lock(tmp_path / "r.lock")
    assert lock.recipe == {"name": "tiny-lenet", "version": "2.1.0", "digest": "d" * 64}
    assert list(lock.platforms) == ["unknown"]
    assert {sid: s.to_json() for sid, s in lock.records("unknown").items()} == chain["lineage"]

    stmt = json.loads((rel / provenance.STATEMENT_FILE).read_text())
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == "https://slsa.dev/provenance/v1"
    files = {f.path: f.sha256 for b in m.builds.values() for f in b.all_files()}
    assert {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]} == files
    assert provenance.check_statement(stmt, files) == []
    definition = stmt["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["recipe"] == {"name": "tiny-lenet", "version": "2.1.0",
                                                          "digest": "d" * 64, "license": LICENSE}
    assert set(definition["externalParameters"]["deploy"]["builds"]) == set(BUILDS)
    assert "publish" not in definition["externalParameters"]["deploy"]
    deps = {d["name"]: d for d in definition["resolvedDependencies"]}
    for sid in ("export", "optimize", "quantize"):
        assert deps[f"stage:{sid}/model"]["digest"] == {"blake3": chain["lineage"][sid]["outputs"]["model"]}
    assert deps["source:weights"]["digest"] == {"sha256": chain["sha"]}
    assert deps["source:weights"]["annotations"] == {"license": WEIGHTS_LICENSE, "attribution": WEIGHTS_CREDIT}
    assert "data:split" in deps
    assert definition["internalParameters"]["license"].startswith(f"{LICENSE}; weights: {WEIGHTS_LICENSE}")
    run = stmt["predicate"]["runDetails"]
    assert run["builder"] == {"id": "urn:zoo-onnx:builder:zoo"}  # no version: none is in a lock record
    assert run["byproducts"] == [{"name": "zoo.lock", "digest": {"sha256": m.files[0].sha256}}]
    assert run["metadata"]["invocationId"] == "urn:zoo-onnx:stage-record:key-deploy"
    assert "cache-key" not in (rel / provenance.STATEMENT_FILE).read_text()
    # license and attribution reach the manifest, its lineage and the card
    assert m.extra["provenance"]["attribution"][0]["attribution"] == WEIGHTS_CREDIT
    assert m.lineage.sources["weights"] == f"sha256:{chain['sha']}"
    card = (rel / "README.md").read_text()
    assert "## Provenance" in card and WEIGHTS_CREDIT in card and m.files[0].sha256 in card
    assert str(chain["tmp"]) not in card + (rel / provenance.STATEMENT_FILE).read_text()  # no host paths


def test_a_tampered_subject_is_reported(chain):
    stmt = json.loads((chain["release"] / provenance.STATEMENT_FILE).read_text())
    files = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    files["builds/cpu-int8/model.onnx"] = "0" * 64
    del files["builds/mobile/model.ort"]
    problems = provenance.check_statement(stmt, files)
    assert any("cpu-int8/model.onnx: sha256" in p for p in problems)
    assert any("mobile/model.ort is not a file" in p for p in problems)


def test_the_release_is_byte_deterministic(chain, tmp_path):
    again = Deploy().run(Inputs(chain["ups"]), chain["deploy_cfg"],
                         _ctx(tmp_path, "deploy", "key-deploy", lineage=chain["lineage"]))["release"]
    files = lambda root: {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}  # noqa: E731
    assert files(again) == files(chain["release"])
