"""train for `task: text-generation`: a transformers `*ForCausalLM` built from a config (Llama and
Qwen2 families) fitted on a corpus's `input_ids` blocks with the next-token loss; the same
checkpoint bytes in two runs, held-out perplexity that falls with training, Hugging Face's keys,
the tokenizer's end-of-text ids in the config, the equivalence hook judging by held-out perplexity
(the shipped recipe end to end is tests/test_recipe_pydoc_llama.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from zoo.errors import InvalidInput  # noqa: E402
from zoo.stage import Inputs, RecipeInfo, StageContext  # noqa: E402
from zoo_stages.lib.data import datasets  # noqa: E402
from zoo_stages.lib.models import archs, checkpoints, hf_models  # noqa: E402
from zoo_stages.lib.quality import training_quality  # noqa: E402
from zoo_stages.train import Train  # noqa: E402

from conftest import REPO  # noqa: E402

CORPUS = {"source": "text", "path": str(REPO / "recipes" / "data" / "pydoc-topics.jsonl"), "limit": 16,
          "val_fraction": 0.25, "block_size": 32, "tokenizer": {"train": {"vocab_size": 320}}}
CONFIGS = {
    "LlamaForCausalLM": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64},
    "Qwen2ForCausalLM": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64},
}
# more families: trained once each (the two above are trained twice)
MORE = {
    "Qwen3ForCausalLM": {**CONFIGS["LlamaForCausalLM"], "head_dim": 8},
    "Phi3ForCausalLM": CONFIGS["LlamaForCausalLM"],
}
CONFIG = Train.Config(epochs=2, batch_size=8, optimizer={"name": "adamw", "lr": 0.01}, seed=0, threads=1)


@pytest.fixture(autouse=True)
def fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def _model(arch: str) -> dict:
    return {"framework": "transformers", "architecture": arch, "config": {**CONFIGS, **MORE}[arch]}


def _ctx(tmp: Path, name: str, model: dict, data: dict = CORPUS) -> StageContext:
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="MIT", path=tmp / "recipe.yaml",
                        digest="x")
    shared = {"data": data, "model": model, "task": "text-generation"}
    return StageContext(stage_id=name, out_dir=tmp / name / "out", work_dir=tmp / name / "work", recipe=recipe,
                        shared=shared, matrix={}, threads=1)


def _untrained(tmp: Path, model: dict) -> Path:
    import torch

    torch.manual_seed(0)
    net = archs.build_model(model, tmp, **archs.data_sizes(model, CORPUS, tmp))
    return checkpoints.save_checkpoint(net, tmp / "untrained.safetensors")


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_a_causal_lm_trains_to_the_same_bytes_twice_and_its_held_out_perplexity_falls(arch, tmp_path):
    import transformers
    from safetensors.torch import load_file

    model = _model(arch)
    one = Train().run(Inputs([]), CONFIG, ctx := _ctx(tmp_path, "one", model))["checkpoint"]
    two = Train().run(Inputs([]), CONFIG, _ctx(tmp_path, "two", model))["checkpoint"]
    assert one.read_bytes() == two.read_bytes()
    m = ctx.metrics
    vocab = datasets.vocab_size(CORPUS, REPO)
    history = m["history"]
    assert [h["epoch"] for h in history] == [1, 2]
    assert all({"train_loss", "val_loss", "val_perplexity"} <= set(h) for h in history)
    assert history[1]["val_perplexity"] < history[0]["val_perplexity"]
    assert m["val_perplexity"] == pytest.approx(math.exp(m["val_loss"]), rel=1e-4)
    assert m["val_perplexity"] == pytest.approx(history[-1]["val_perplexity"], rel=1e-5)
    assert m["val_perplexity"] < vocab / 2  # an untrained model is near the vocabulary size (below)
    assert m["samples"] == len(datasets.load_split(CORPUS, REPO, "train"))  # blocks
    assert m["split"]["unit"] == "documents" and m["split"]["num_val"] == 4
    # the checkpoint is Hugging Face's: the architecture's own class takes it key for key
    state = load_file(str(one))
    config = hf_models.config_for(model, tmp_path, num_labels=10, vocab_size=vocab,
                                  token_ids={"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0})
    assert (config.vocab_size, config.bos_token_id, config.eos_token_id) == (vocab, 0, 0)
    getattr(transformers, arch)(config).load_state_dict(state, strict=True)


@pytest.mark.parametrize("arch", sorted(MORE))
def test_other_causal_lm_families_train_into_their_own_keys(arch, tmp_path):
    import transformers
    from safetensors.torch import load_file

    model = _model(arch)
    one_epoch = Train.Config(**{**CONFIG.model_dump(), "epochs": 1})
    checkpoint = Train().run(Inputs([]), one_epoch, ctx := _ctx(tmp_path, "one", model))["checkpoint"]
    assert ctx.metrics["val_perplexity"] < datasets.vocab_size(CORPUS, REPO) / 2
    config = hf_models.config_for(model, tmp_path, num_labels=10, vocab_size=datasets.vocab_size(CORPUS, REPO),
                                  token_ids={"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0})
    getattr(transformers, arch)(config).load_state_dict(load_file(str(checkpoint)), strict=True)


def test_an_untrained_causal_lm_is_near_the_vocabulary_size_in_perplexity(tmp_path):
    """The bound the trained model is held to above is meaningful: fresh weights score about the vocabulary."""
    from zoo_stages.lib.models import torch_eval

    model = _model("LlamaForCausalLM")
    net = checkpoints.build_with_weights(model, tmp_path, _untrained(tmp_path, model), "weights",
                                         **archs.data_sizes(model, CORPUS, tmp_path))
    val = datasets.load_split(CORPUS, REPO, "val")
    x = torch_eval.as_model_inputs(val.features)
    figures = torch_eval.evaluate(net, x, None, "generation", 8)
    assert figures["perplexity"] > datasets.vocab_size(CORPUS, REPO) / 2
    with pytest.raises(InvalidInput, match="input_ids"):
        torch_eval.evaluate(net, {"tokens": x["input_ids"]}, None, "generation", 8)


def test_equivalence_of_causal_lm_checkpoints_is_judged_by_held_out_perplexity(tmp_path):
    model = _model("LlamaForCausalLM")
    trained = Train().run(Inputs([]), CONFIG, _ctx(tmp_path, "t", model))["checkpoint"]
    shared = {"data": CORPUS, "model": model, "task": "text-generation"}
    same = training_quality.compare_checkpoints(trained, trained, shared, tmp_path, tolerance=0.01)
    assert same.equivalent and "held-out perplexity" in same.details[0] and "blocks" in same.details[0]
    worse = training_quality.compare_checkpoints(trained, _untrained(tmp_path, model), shared, tmp_path,
                                                 tolerance=0.01)
    assert not worse.equivalent and "quality differs" in worse.details[0]


def test_the_tokenizer_files_load_in_transformers_and_encode_as_the_blocks_were_made(tmp_path):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    for name, content in datasets.tokenizer_files(CORPUS, REPO).items():
        (tmp_path / name).write_text(content)
    fast = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "The assert statement is a convenient way to insert debugging assertions."
    own = Tokenizer.from_str(datasets.tokenizer_json(CORPUS, REPO)).encode(text, add_special_tokens=False).ids
    assert fast(text, add_special_tokens=False)["input_ids"] == own
    assert (fast.eos_token, fast.eos_token_id, fast.bos_token_id) == ("<|endoftext|>", 0, 0)
    assert fast.decode(own) == text
    assert getattr(fast, "chat_template", None) is None  # a base language model has none


def test_validating_and_planning_the_shipped_recipe_import_no_torch_onnx_or_onnxruntime():
    """The corpus's checks at validate read the file's keys; its tokenizer is learnt by the stage."""
    import subprocess
    import sys

    code = ("import sys; from zoo.cli.main import app; from typer.testing import CliRunner;"
            f"r = CliRunner().invoke(app, ['plan', {str(REPO / 'recipes' / 'pydoc-llama.yaml')!r}]);"
            "assert r.exit_code == 0, r.output;"
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'tokenizers') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_onnxruntime_genai_tokenizes_with_the_corpus_tokenizer_files_as_training_did(tmp_path):
    """The tokenizer files beside a build (here beside onnxruntime-genai's builder's build of a tiny
    random Llama, `tests/decoder_models.py`) give onnxruntime-genai the ids the blocks were made with."""
    import onnxruntime_genai as og
    import torch
    import transformers
    from tokenizers import Tokenizer

    from decoder_models import genai_build

    hf = tmp_path / "hf"
    hf.mkdir()
    for name, content in datasets.tokenizer_files(CORPUS, REPO).items():
        (hf / name).write_text(content)
    vocab = datasets.vocab_size(CORPUS, REPO)
    config = transformers.LlamaConfig(vocab_size=vocab, bos_token_id=0, eos_token_id=0, **CONFIGS["LlamaForCausalLM"])
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(hf), safe_serialization=True)
    build = genai_build(hf, tmp_path / "build")
    tokenizer = og.Tokenizer(og.Model(str(build)))
    text = "The assert statement is a convenient way to insert debugging assertions."
    own = Tokenizer.from_str(datasets.tokenizer_json(CORPUS, REPO)).encode(text, add_special_tokens=False).ids
    assert [int(i) for i in tokenizer.encode(text)] == own
    assert tokenizer.decode(own) == text
