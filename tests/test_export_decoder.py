"""A causal LM's export (zoo_stages/exporters/decoder.py): a decoder with a KV cache in zoo's
convention (zoo/decoder_io.py) through torch.onnx (dynamo by default, TorchScript) or
onnxruntime-genai's model builder (`exporter: genai`), the genai_config.json and tokenizer files of
its `genai` output, and its parity gate (prefill logits and greedy decoding with the cache against
transformers' generate). The model is a random tiny Llama folder made by tests/decoder_models.py,
pinned as `model.pretrained` (the stand-in for a train stage's checkpoint)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime_genai")

from decoder_models import tiny_llama_folder  # noqa: E402
from zoo.errors import GateFailed, InvalidInput  # noqa: E402
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream  # noqa: E402
from zoo_stages.export import Export  # noqa: E402
from zoo_stages.exporters.base import ModelFieldError  # noqa: E402
from zoo_stages.exporters.transformers import TransformersExporter  # noqa: E402
from zoo_stages.lib.models import causal_lm  # noqa: E402
from zoo_stages.lib.quality import generation_parity  # noqa: E402

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
TOKENIZER_PINS = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
SMALL_GATE = {"prompts": 2, "new_tokens": 8}


def pins(folder: Path, names) -> dict[str, str]:
    return {n: hashlib.sha256((folder / n).read_bytes()).hexdigest() for n in names}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tiny_llama_folder(tmp_path_factory.mktemp("llama") / "tiny-llama")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


def model_section(folder: Path, tokenizer: bool = True) -> dict:
    names = ("config.json", "model.safetensors", *(TOKENIZER_PINS if tokenizer else ()))
    return {"framework": "transformers", "pretrained": {"path": str(folder), "sha256": pins(folder, names)}}


def run_export(tmp: Path, name: str, model: dict, upstream: Inputs | None = None, **config):
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp / "recipe.yaml", digest="x")
    ctx = StageContext(stage_id="export", out_dir=tmp / name / "out", work_dir=tmp / name / "work", recipe=recipe,
                       shared={"model": model, "data": None, "task": "text-generation"}, matrix={}, threads=1)
    out = Export().run(upstream or Inputs([]), Export.Config(**config), ctx)
    return out, ctx.metrics


@pytest.fixture(scope="module")
def dynamo(llama, tmp_path_factory):
    return run_export(tmp_path_factory.mktemp("dynamo"), "a", model_section(llama))


def session_of(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_a_causal_lm_exports_with_a_kv_cache_in_zoos_convention_through_dynamo_by_default(dynamo):
    out, metrics = dynamo
    assert metrics["torch_exporter"] == "dynamo" and metrics["generative"] is True
    layers = [f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    assert metrics["inputs"] == ["input_ids", "attention_mask", "position_ids", *layers]
    assert metrics["outputs"] == ["logits", *[n.replace("past_key_values", "present") for n in layers]]
    proto = onnx.load(str(out["model"]))
    assert proto.ir_version <= 13
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*proto.graph.input, *proto.graph.output)}
    assert dims["input_ids"] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert dims["past_key_values.0.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert dims["present.1.value"] == ["batch_size", 2, "total_sequence_length", 16]
    assert dims["logits"] == ["batch_size", "sequence_length", 512]
    parity = metrics["parity"]
    assert parity["passed"] and parity["prefill"]["passed"] and parity["decode"]["passed"]
    assert metrics["tokens_matched"] == metrics["tokens"] == 4 * 16 and parity["data"] == "seeded random token ids"
    assert metrics["tools"] == {"onnxruntime-genai": "0.18.0"}
    assert sorted(p.name for p in out["genai"].iterdir()) == metrics["genai_files"] == [
        "genai_config.json", "tokenizer.json", "tokenizer_config.json"]


def test_the_genai_config_names_the_files_ports_and_the_tokenizer_config_its_chat_template(dynamo):
    out, _ = dynamo
    config = json.loads((out["genai"] / "genai_config.json").read_text())["model"]
    assert config["type"] == "llama" and config["decoder"]["filename"] == "model.onnx"
    assert config["decoder"]["inputs"] == {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                           "position_ids": "position_ids",
                                           "past_key_names": "past_key_values.%d.key",
                                           "past_value_names": "past_key_values.%d.value"}
    assert config["decoder"]["head_size"] == 16 and config["decoder"]["num_key_value_heads"] == 2
    tok_config = json.loads((out["genai"] / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == CHAT_TEMPLATE and tok_config["eos_token"] == "<|endoftext|>"
    assert not {"is_local", "local_files_only"} & set(tok_config)
    tok = json.loads((out["genai"] / "tokenizer.json").read_text())
    assert tok["padding"] is None and tok["truncation"] is None


def genai_generate(folder: Path, prompt: list[int], new_tokens: int) -> list[int]:
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    return tokens


def test_onnxruntime_genai_generates_the_onnx_greedy_tokens_from_the_exported_files(dynamo, tmp_path):
    import onnxruntime_genai as og

    out, _ = dynamo
    folder = tmp_path / "build"
    folder.mkdir()
    shutil.copy(out["model"], folder / "model.onnx")
    for f in out["genai"].iterdir():
        shutil.copy(f, folder / f.name)
    tokenizer = og.Tokenizer(og.Model(str(folder)))
    prompt = [int(t) for t in tokenizer.encode("The Python language reference")]
    got = genai_generate(folder, prompt, 16)
    expected, _ = generation_parity.onnx_greedy(session_of(out["model"]), prompt, 16)
    assert got and got == expected[:len(got)]
    assert len(got) == 16 or got[-1] == 0  # onnxruntime_genai stops at end-of-text (token 0)
    chat = tokenizer.apply_chat_template(json.dumps([{"role": "user", "content": "hi"}]), add_generation_prompt=False)
    assert chat.startswith("<|user|>hi")


def test_torchscript_exports_the_same_bytes_twice_and_generates_as_transformers(llama, tmp_path):
    first, metrics = run_export(tmp_path, "a", model_section(llama), exporter="torchscript", generation=SMALL_GATE)
    second, _ = run_export(tmp_path, "b", model_section(llama), exporter="torchscript", generation=SMALL_GATE)
    assert first["model"].read_bytes() == second["model"].read_bytes()
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (first["genai"] / name).read_bytes() == (second["genai"] / name).read_bytes()
    assert metrics["torch_exporter"] == "torchscript" and metrics["opset"] == 17
    assert metrics["tokens_matched"] == metrics["tokens"] == 2 * 8


def test_the_genai_builder_exporter_writes_the_same_standard_onnx_twice_and_generates_as_transformers(llama, tmp_path):
    first, metrics = run_export(tmp_path, "a", model_section(llama), exporter="genai", generation=SMALL_GATE)
    second, _ = run_export(tmp_path, "b", model_section(llama), exporter="genai", generation=SMALL_GATE)
    assert first["model"].read_bytes() == second["model"].read_bytes()
    assert metrics["decoder_exporter"] == "onnxruntime-genai builder" and metrics["torch_exporter"] is None
    assert metrics["tokens_matched"] == metrics["tokens"] == 2 * 8 and metrics["parity"]["passed"]
    # the builder's own graph: no position_ids, and its weights inline (no model.onnx.data)
    assert "position_ids" not in metrics["inputs"] and sorted(p.name for p in first["model"].parent.iterdir()) == [
        "genai", "model.onnx"]
    config = json.loads((first["genai"] / "genai_config.json").read_text())["model"]["decoder"]
    assert "position_ids" not in config["inputs"]
    proto = onnx.load(str(first["model"]))
    # its producer_version names the package, not the git commit of the checkout around the venv
    assert proto.producer_version == "0.18.0" and proto.ir_version <= 13
    assert not [n for n in proto.graph.node if n.domain == "" and n.op_type == "SimplifiedLayerNormalization"]
    onnx.checker.check_model(proto, full_check=True)


def test_tokens_that_part_from_transformers_fail_the_gate_shifted_reference_stand_in(llama, tmp_path, monkeypatch):
    """Stand-in: transformers' greedy tokens shifted by one at step 3 (a decoder that parts there)."""
    real = causal_lm.reference_greedy

    def shifted(model, prompt, new_tokens):
        tokens, logits = real(model, prompt, new_tokens)
        return [t + 1 if i == 3 else t for i, t in enumerate(tokens)], logits

    monkeypatch.setattr(causal_lm, "reference_greedy", shifted)
    with pytest.raises(GateFailed, match=r"parts from transformers' generate\(\) at prompt 0, step 3: token \d+ where "
                                         r"transformers chose \d+ \(6 of 16 tokens matched\)"):
        run_export(tmp_path, "a", model_section(llama), exporter="torchscript", generation=SMALL_GATE)


def test_a_causal_lm_without_a_tokenizer_is_refused(llama, tmp_path):
    with pytest.raises(InvalidInput, match="ships its tokenizer, and this recipe gives none"):
        run_export(tmp_path, "a", model_section(llama, tokenizer=False), exporter="torchscript")


def test_a_causal_lm_family_zoo_does_not_export_is_refused_when_the_recipe_loads():
    with pytest.raises(ModelFieldError, match="MistralForCausalLM is not among the causal LM families"):
        TransformersExporter.check_model({"framework": "transformers", "architecture": "MistralForCausalLM"})
    TransformersExporter.check_model({"framework": "transformers", "architecture": "Qwen3ForCausalLM"})


def test_exporter_genai_is_refused_for_a_model_that_is_not_a_causal_lm(tmp_path):
    model = {"framework": "transformers", "architecture": "DistilBertForSequenceClassification", "num_classes": 2,
             "config": {"dim": 32, "n_layers": 1, "n_heads": 2, "hidden_dim": 64, "max_position_embeddings": 16}}
    checkpoint = tmp_path / "never-read.safetensors"
    checkpoint.write_bytes(b"")
    upstream = Inputs([Upstream("train", "train", {"checkpoint": checkpoint}, {}, key="k")])
    with pytest.raises(InvalidInput, match="`exporter: genai`.*exports causal language models"):
        run_export(tmp_path, "a", model, upstream, exporter="genai")


def test_onnxruntime_genai_enters_the_key_of_a_causal_lms_export_only(llama):
    assert "onnxruntime-genai" in TransformersExporter.tools_in(model_section(llama), Path("."))
    assert "onnxruntime-genai" in TransformersExporter.tools_in(
        {"framework": "transformers", "architecture": "LlamaForCausalLM"}, Path("."))
    assert "onnxruntime-genai" not in TransformersExporter.tools_in(
        {"framework": "transformers", "architecture": "BertModel"}, Path("."))


def test_a_trained_checkpoint_exports_with_the_datas_tokenizer_and_held_out_prompts(tmp_path):
    """The train stage's output as the transformers framework saves it (Hugging Face keys in
    model.safetensors) for an architecture built from an inline config; the tokenizer and the
    prompts come from the recipe's text data."""
    import torch

    from conftest import REPO
    from zoo_stages.lib.models import archs, checkpoints

    data = {"source": "csv", "path": str(REPO / "recipes" / "data" / "languages.csv"), "text": "text",
            "label": "language", "max_length": 12, "limit": 120, "val_fraction": 0.25, "split_seed": 0,
            "tokenizer": {"train": {"model": "wordpiece", "vocab_size": 300, "lowercase": True}}}
    model = {"framework": "transformers", "architecture": "Qwen2ForCausalLM",
             "config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "max_position_embeddings": 64, "tie_word_embeddings": False,
                        "eos_token_id": 0, "bos_token_id": 0}}
    torch.manual_seed(0)
    net = archs.build_model(model, tmp_path, **archs.data_sizes(model, data, tmp_path))
    checkpoint = checkpoints.save_checkpoint(net, tmp_path / "model.safetensors")
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp_path / "recipe.yaml",
                        digest="x")
    ctx = StageContext(stage_id="export", out_dir=tmp_path / "out", work_dir=tmp_path / "work", recipe=recipe,
                       shared={"model": model, "data": data, "task": "text-generation"}, matrix={}, threads=1)
    upstream = Inputs([Upstream("train", "train", {"checkpoint": checkpoint}, {}, key="k")])
    out = Export().run(upstream, Export.Config(exporter="torchscript", generation=SMALL_GATE), ctx)
    metrics = ctx.metrics
    assert metrics["source"] == "checkpoint" and metrics["parity"]["data"] == "the held-out split's tokens"
    assert metrics["tokens_matched"] == metrics["tokens"] == 16
    assert metrics["decoder"]["genai_type"] == "qwen2"
    tok = json.loads((out["genai"] / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "WordPiece" and tok["padding"] is None
    config = json.loads((out["genai"] / "genai_config.json").read_text())["model"]
    assert config["type"] == "qwen2" and config["vocab_size"] == metrics["decoder"]["vocab_size"]


def test_the_pretrained_folder_may_pin_the_tokenizer_files_and_nothing_else_besides_its_weights():
    from pydantic import ValidationError

    from zoo_stages.sections.model import PretrainedSpec

    digest = "0" * 64
    base = {"config.json": digest, "model.safetensors": digest}
    PretrainedSpec(path="m", sha256={**base, "tokenizer.json": digest, "chat_template.jinja": digest})
    with pytest.raises(ValidationError, match="optionally the tokenizer's"):
        PretrainedSpec(path="m", sha256={**base, "vocab.txt": digest})
    with pytest.raises(ValidationError, match="pin exactly config.json and model.safetensors"):
        PretrainedSpec(path="m", sha256={"config.json": digest, "tokenizer.json": digest})


def test_a_builder_graph_onnxruntime_cannot_run_fails_in_one_line_naming_the_kernels_limit(tmp_path):
    """A head size of 8: onnxruntime's GroupQueryAttention, which the builder's graph uses, takes
    multiples of 16 only."""
    folder = tiny_llama_folder(tmp_path / "narrow-heads", hidden_size=32, heads=4, kv_heads=2)
    section = {"framework": "transformers",
               "pretrained": {"path": str(folder), "sha256": pins(folder, ("config.json", "model.safetensors",
                                                                          "tokenizer.json", "tokenizer_config.json"))}}
    with pytest.raises(InvalidInput, match="onnxruntime cannot run the exported decoder: .*head_size") as e:
        run_export(tmp_path, "a", section, exporter="genai", generation=SMALL_GATE)
    assert "multiple of 16" in e.value.hint
