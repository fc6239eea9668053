"""A generative version's builds ship what onnxruntime_genai needs beside each model.onnx
(zoo_stages/deploy/genai_files.py): genai_config.json fitted to the build's ports and the
tokenizer files, all taken from the causal LM export's `genai` output, also for a build of a
stage whose only output is its model (quantize), each listed in the manifest with its sha256; and
end to end, `zoo pull` of a published build gives a folder onnxruntime_genai generates from with
no extra step. The model is a random tiny Llama folder (tests/decoder_models.py) pinned as
`model.pretrained`, the stand-in for a trained checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime_genai")

from cli_helpers import zoo  # noqa: E402
from decoder_models import tiny_llama_folder  # noqa: E402
from test_export_decoder import genai_generate, pins, run_export, session_of  # noqa: E402
from zoo.errors import InvalidInput  # noqa: E402
from zoo.manifest import read_manifest  # noqa: E402
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream  # noqa: E402
from zoo_stages.deploy.kind import Deploy  # noqa: E402
from zoo_stages.lib.quality import generation_parity  # noqa: E402

GENAI_FILES = ["genai_config.json", "tokenizer.json", "tokenizer_config.json"]
PINNED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict:
    """The tiny Llama's torchscript export, and a stand-in quantize stage's model: onnxruntime's
    dynamic int8 quantization of it (a model.onnx and nothing else, as quantize outputs)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = tmp_path_factory.mktemp("genai-deploy")
    folder = tiny_llama_folder(root / "tiny-llama")
    section = {"framework": "transformers", "pretrained": {"path": str(folder), "sha256": pins(folder, PINNED)}}
    out, _ = run_export(root, "export", section, exporter="torchscript", generation={"prompts": 1, "new_tokens": 4})
    int8 = root / "quantize" / "model.onnx"
    int8.parent.mkdir()
    quantize_dynamic(str(out["model"]), str(int8), weight_type=QuantType.QInt8)
    return {"root": root, "model": out["model"], "genai": out["genai"], "int8": int8}


def deploy(tmp: Path, ups: list[Upstream], builds: dict):
    recipe = RecipeInfo(name="tiny-decoder", version="0.1.0", description="A tiny decoder for tests.",
                        license="MIT", path=tmp / "recipe.yaml", digest="f" * 64)
    ctx = StageContext(stage_id="deploy", out_dir=tmp / "out", work_dir=tmp / "work", recipe=recipe,
                       shared={"model": {}, "data": None, "task": "text-generation"}, matrix={}, threads=1,
                       key="key-deploy")
    cfg = Deploy.Config.model_validate({"builds": builds, "publish": False})
    return Deploy().run(Inputs(ups), cfg, ctx)["release"]


def export_up(exported) -> Upstream:
    return Upstream("export", "export", {"model": exported["model"], "genai": exported["genai"]}, {}, key="k-e",
                    record="r-e")


def quantize_up(exported) -> Upstream:
    return Upstream("quantize", "quantize", {"model": exported["int8"]}, {}, key="k-q", record="r-q")


def test_every_build_ships_the_exports_genai_files_a_quantize_build_too_stand_in_quantize(exported, tmp_path):
    """Stand-in quantize: onnxruntime's quantize_dynamic of the export, as an upstream of kind quantize."""
    release = deploy(tmp_path, [export_up(exported), quantize_up(exported)],
                     {"cpu-fp32": {"from": "export"}, "cpu-int8": {"from": "quantize"}})
    manifest = read_manifest(release / "zoo-manifest.json")
    for name in ("cpu-fp32", "cpu-int8"):
        build = manifest.builds[name]
        listed = {Path(f.path).name: f for f in build.extra_files}
        assert sorted(listed) == GENAI_FILES
        for f in listed.values():
            assert f.path.startswith(f"builds/{name}/")
            assert hashlib.sha256((release / f.path).read_bytes()).hexdigest() == f.sha256
        for source in ("tokenizer.json", "tokenizer_config.json"):
            assert (release / "builds" / name / source).read_bytes() == (exported["genai"] / source).read_bytes()
        config = json.loads((release / "builds" / name / "genai_config.json").read_text())
        assert config["model"]["decoder"]["filename"] == Path(build.file.path).name == "model.onnx"
        # the sidecars are no part of what a runtime loads as the model
        assert build.metrics["size_bytes"] == (release / build.file.path).stat().st_size
    assert manifest.builds["cpu-int8"].precision == "int8"
    # onnxruntime_genai runs the int8 build's folder as it is
    prompt = [5, 17, 42, 99]
    tokens = genai_generate(release / "builds" / "cpu-int8", prompt, 6)
    expected, _ = generation_parity.onnx_greedy(session_of(release / "builds" / "cpu-int8" / "model.onnx"), prompt, 6)
    assert tokens and tokens == expected[:len(tokens)]


def test_a_generative_build_without_the_exports_genai_output_is_refused(exported, tmp_path):
    with pytest.raises(InvalidInput, match="build cpu-int8 is a generative model") as e:
        deploy(tmp_path, [quantize_up(exported)], {"cpu-int8": {"from": "quantize"}})
    assert "add the export stage" in e.value.hint


RECIPE = """\
schema_version: 1
name: tiny-decoder
version: 0.1.0
description: A random tiny Llama exported with its KV cache.
license: MIT
task: text-generation
model:
  framework: transformers
  pretrained:
    path: tiny-llama
    sha256: {pins}
stages:
  export:
    config: {{generation: {{prompts: 2, new_tokens: 8}}}}
  deploy:
    needs: [export]
    config:
      builds:
        cpu-fp32: {{from: export}}
"""


@pytest.mark.slow
def test_onnxruntime_genai_generates_from_a_pulled_build_with_no_extra_step(tmp_path):
    folder = tiny_llama_folder(tmp_path / "tiny-llama")
    (tmp_path / "recipe.yaml").write_text(RECIPE.format(pins=json.dumps(pins(folder, PINNED))))
    ran = zoo("run", "recipe.yaml", cwd=tmp_path)
    assert ran.code == 0, ran.text
    assert "onnxruntime-genai: 0.18.0" in (tmp_path / "recipe.lock").read_text()  # the builder's version is locked
    pulled = zoo("pull", "tiny-decoder@0.1.0", "--build", "cpu-fp32", "--to", tmp_path / "pulled", cwd=tmp_path)
    assert pulled.code == 0, pulled.text
    build = tmp_path / "pulled" / "builds" / "cpu-fp32"
    assert set(GENAI_FILES) <= {p.name for p in build.iterdir()}

    import onnxruntime_genai as og

    tokenizer = og.Tokenizer(og.Model(str(build)))
    prompt = [int(t) for t in tokenizer.encode("Lists are mutable sequences")]
    tokens = genai_generate(build, prompt, 16)
    expected, _ = generation_parity.onnx_greedy(session_of(build / "model.onnx"), prompt, 16)
    assert tokens and tokens == expected[:len(tokens)]
    assert len(tokens) == 16 or tokens[-1] == 0  # stopped early only at end-of-text
    assert np.array_equal(np.asarray(prompt), np.asarray(tokenizer.encode("Lists are mutable sequences")))
