"""framework: transformers (zoo_stages/lib/models/hf_models.py, zoo_stages/exporters/transformers.py): a
Hugging Face model given as an architecture + config, or a local pretrained folder pinned by sha256,
trained through the torch loop into a safetensors checkpoint with Hugging Face's keys, and exported
with named inputs and outputs (dynamic batch and sequence) behind a parity gate against
transformers' own forward on held-out tokenized texts; the same weights export to the same bytes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from zoo.errors import GateFailed, IntegrityError, InvalidInput  # noqa: E402
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream  # noqa: E402
from zoo_stages.export import Export  # noqa: E402
from zoo_stages.exporters.transformers import TransformersExporter  # noqa: E402
from zoo_stages.lib.models import checkpoints, hf_models  # noqa: E402
from zoo_stages.train import Train  # noqa: E402

from conftest import REPO  # noqa: E402

TEXT = {"source": "csv", "path": str(REPO / "recipes" / "data" / "languages.csv"), "text": "text",
        "label": "language", "max_length": 16, "limit": 240, "val_fraction": 0.25, "split_seed": 0,
        "tokenizer": {"train": {"model": "wordpiece", "vocab_size": 200, "lowercase": True}}}

# architecture -> (config, data extras, the graph's inputs, its outputs)
ARCHS = {
    "DistilBertForSequenceClassification": (
        {"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64, "max_position_embeddings": 16}, {},
        ["input_ids", "attention_mask"], ["logits"]),
    "BertForSequenceClassification": (
        {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 16}, {"token_type_ids": True},
        ["input_ids", "attention_mask", "token_type_ids"], ["logits"]),
    "GPT2ForSequenceClassification": (
        {"n_embd": 32, "n_layer": 1, "n_head": 2, "n_positions": 16, "pad_token_id": 0}, {},
        ["input_ids", "attention_mask"], ["logits"]),
    "BertModel": (
        {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
         "max_position_embeddings": 16}, {}, ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"]),
}


def _model(arch: str, **extra) -> dict:
    return {"framework": "transformers", "architecture": arch, "config": ARCHS[arch][0], "num_classes": 8, **extra}


def _ctx(tmp: Path, name: str, model: dict, data: dict | None = TEXT) -> StageContext:
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp / "recipe.yaml",
                        digest="x")
    shared = {"data": data, "model": model, "task": "text-classification"}
    return StageContext(stage_id=name, out_dir=tmp / name / "out", work_dir=tmp / name / "work", recipe=recipe,
                        shared=shared, matrix={}, threads=1)


def _fresh_checkpoint(tmp: Path, model: dict, data: dict) -> Path:
    """The section's model, seeded and untrained, as the train stage would save it."""
    import torch

    from zoo_stages.lib.models import archs

    torch.manual_seed(0)
    net = archs.build_model(model, tmp, **archs.data_sizes(model, data, tmp))
    return checkpoints.save_checkpoint(net, tmp / f"{model['architecture']}.safetensors")


def _export(tmp: Path, name: str, model: dict, checkpoint: Path | None, data: dict | None = TEXT, **config):
    ctx = _ctx(tmp, name, model, data)
    upstream = Inputs([] if checkpoint is None else [
        Upstream(stage_id="train", kind="train", outputs={"checkpoint": checkpoint}, metrics={}, key="train-key")])
    out = Export().run(upstream, Export.Config(**config), ctx)
    return out["model"], ctx.metrics


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_export_names_the_ports_passes_parity_on_held_out_text_and_gives_the_same_bytes_twice(arch, tmp_path):
    config, extras, inputs, outputs = ARCHS[arch]
    data = {**TEXT, **extras}
    model = _model(arch)
    checkpoint = _fresh_checkpoint(tmp_path, model, data)
    first, metrics = _export(tmp_path, "a", model, checkpoint, data)
    second, _ = _export(tmp_path, "b", model, checkpoint, data)
    assert first.read_bytes() == second.read_bytes()
    assert metrics["exporter"] == "transformers" and metrics["torch_exporter"] == "torchscript"
    assert metrics["inputs"] == inputs and metrics["outputs"] == outputs
    assert metrics["parity"]["passed"] and metrics["parity"]["data"] == "the held-out split"
    assert metrics["parity"]["rows"] == 60  # a quarter of the 240 texts

    proto = onnx.load(str(first))
    assert proto.ir_version <= 13
    for value in proto.graph.input:
        assert value.type.tensor_type.elem_type == onnx.TensorProto.INT64
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    assert proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"

    # another batch and sequence length than the traced example: the axes are dynamic
    import onnxruntime as ort
    import torch

    net = checkpoints.build_with_weights(model, tmp_path, checkpoint, "checkpoint", **_sizes(model, data, tmp_path))
    rng = np.random.default_rng(1)
    feeds = {"input_ids": rng.integers(5, 100, (3, 11)), "attention_mask": np.ones((3, 11), dtype=np.int64)}
    feeds["attention_mask"][0, 7:] = 0
    if "token_type_ids" in inputs:
        feeds["token_type_ids"] = np.zeros((3, 11), dtype=np.int64)
    got = ort.InferenceSession(str(first), providers=["CPUExecutionProvider"]).run(None, feeds)
    with torch.no_grad():
        ref = hf_models.reference_forward(net, {k: torch.from_numpy(v) for k, v in feeds.items()})
    for name, value in zip(outputs, got):
        np.testing.assert_allclose(value, ref[name].numpy(), atol=1e-4, rtol=1e-3)


def _sizes(model: dict, data: dict, recipe_dir: Path) -> dict:
    from zoo_stages.lib.models import archs

    return archs.data_sizes(model, data, recipe_dir)


def test_an_export_that_differs_from_transformers_fails_the_gate_shifted_reference_stand_in(tmp_path, monkeypatch):
    """Stand-in: transformers' reference outputs shifted by 1, as a wrong export would differ."""
    model = _model("DistilBertForSequenceClassification")
    checkpoint = _fresh_checkpoint(tmp_path, model, TEXT)
    real = hf_models.reference_outputs
    monkeypatch.setattr(hf_models, "reference_outputs",
                        lambda *a, **k: {n: v + 1.0 for n, v in real(*a, **k).items()})
    with pytest.raises(GateFailed, match="differs from transformers' forward on the held-out split"):
        _export(tmp_path, "x", model, checkpoint)


def test_train_fine_tunes_through_the_torch_loop_into_hugging_face_keys(tmp_path):
    import transformers
    from safetensors.torch import load_file

    model = _model("DistilBertForSequenceClassification")
    config = Train.Config(epochs=1, batch_size=32, seed=0, threads=1)
    one = Train().run(Inputs([]), config, ctx := _ctx(tmp_path, "one", model))["checkpoint"]
    two = Train().run(Inputs([]), config, _ctx(tmp_path, "two", model))["checkpoint"]
    assert one.read_bytes() == two.read_bytes()
    assert ctx.metrics["samples"] == 180 and 0 <= ctx.metrics["val_accuracy"] <= 1
    state = load_file(str(one))
    own = transformers.DistilBertForSequenceClassification(
        hf_models.config_for(model, tmp_path, num_labels=8, vocab_size=state["distilbert.embeddings.word_embeddings"
                                                                             ".weight"].shape[0]))
    own.load_state_dict(state, strict=True)  # Hugging Face's own class takes the checkpoint key for key
    _, metrics = _export(tmp_path, "export", model, one)
    assert metrics["parity"]["passed"] and metrics["source"] == "checkpoint"


def _pretrained_folder(tmp: Path) -> tuple[Path, dict, object]:
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.DistilBertConfig(vocab_size=120, dim=32, n_layers=1, n_heads=2, hidden_dim=64,
                                           max_position_embeddings=16, num_labels=3)
    net = transformers.DistilBertForSequenceClassification(config).eval()
    folder = tmp / "tiny-distilbert"
    net.save_pretrained(str(folder), safe_serialization=True)
    pins = {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in hf_models.PRETRAINED_FILES}
    return folder, pins, net


def test_a_pinned_pretrained_folder_exports_without_a_train_stage(tmp_path):
    import torch

    folder, pins, net = _pretrained_folder(tmp_path)
    model = {"framework": "transformers", "num_classes": 3, "pretrained": {"path": str(folder), "sha256": pins}}
    assert TransformersExporter.dependencies(model, tmp_path) == [folder / "config.json",
                                                                  folder / "model.safetensors"]
    target, metrics = _export(tmp_path, "export", model, None, data=None)
    assert metrics["source"] == "pretrained" and metrics["pretrained"] == pins
    assert metrics["architecture"] == "DistilBertForSequenceClassification"
    assert metrics["parity"]["passed"] and metrics["parity"]["data"] == "seeded random token ids"
    sources = json.loads({p.key: p.value for p in onnx.load(str(target)).metadata_props}["zoo.sources"])
    assert sources["pretrained/model.safetensors"] == f"sha256:{pins['model.safetensors']}"

    import onnxruntime as ort

    ids = np.array([[2, 17, 40, 3, 0]], dtype=np.int64)
    mask = np.array([[1, 1, 1, 1, 0]], dtype=np.int64)
    got = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"]).run(
        None, {"input_ids": ids, "attention_mask": mask})[0]
    with torch.no_grad():
        want = net(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-5)  # the folder's own weights, not a fresh model's


def test_a_pretrained_folder_that_changed_since_it_was_pinned_is_refused(tmp_path):
    folder, pins, _ = _pretrained_folder(tmp_path)
    model = {"framework": "transformers", "num_classes": 3,
             "pretrained": {"path": str(folder), "sha256": {**pins, "model.safetensors": "0" * 64}}}
    with pytest.raises(IntegrityError, match="model.safetensors has sha256"):
        _export(tmp_path, "export", model, None, data=None)


def test_a_pretrained_folder_without_safetensors_is_refused_pickle_never_loaded(tmp_path):
    folder, pins, net = _pretrained_folder(tmp_path)
    (folder / "model.safetensors").unlink()
    import torch

    torch.save(net.state_dict(), folder / "pytorch_model.bin")  # a pickle: never read
    model = {"framework": "transformers", "num_classes": 3, "pretrained": {"path": str(folder), "sha256": pins}}
    with pytest.raises(InvalidInput, match="has no model.safetensors"):
        _export(tmp_path, "export", model, None, data=None)


def test_a_config_setting_the_architecture_does_not_know_names_the_closest(tmp_path):
    model = _model("DistilBertForSequenceClassification")
    model["config"] = {**model["config"], "n_layer": 2}
    with pytest.raises(InvalidInput, match="DistilBertConfig has no setting 'n_layer' — did you mean 'n_layers'"):
        hf_models.config_for(model, tmp_path, num_labels=2, vocab_size=100)


def test_validating_and_planning_the_recipe_import_no_torch_onnx_or_onnxruntime():
    """The architecture is checked against transformers' lazy listing, which imports no torch."""
    import subprocess
    import sys

    code = ("import sys; from zoo.cli.main import app; from typer.testing import CliRunner;"
            f"r = CliRunner().invoke(app, ['plan', {str(REPO / 'recipes' / 'transformers-distilbert-languages.yaml')!r}]);"
            "assert r.exit_code == 0, r.output;"
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"
