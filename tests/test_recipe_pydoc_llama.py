"""The shipped generative recipe, recipes/pydoc-llama.yaml, as a user runs it on a fresh clone
(slow: about four minutes on one core, most of it training): `zoo run --frozen` rebuilds the
locked bytes of every stage (train, export with the KV cache, weight-only int4, verify, deploy)
and passes its gates; then `zoo generate` streams from the build `zoo pull` chooses, `zoo show`
lists the generation figures and the int4 build's quantization, and onnxruntime_genai generates
from the pulled int4 build folder the same tokens as zoo's own loop."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")

from cli_helpers import zoo  # noqa: E402
from conftest import REPO  # noqa: E402
from shipped_recipes import copy_recipe  # noqa: E402

INT4 = "cpu-int4-rtn-b32"
PROMPT = "The for statement is used to"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    base = tmp_path_factory.mktemp("pydoc-llama")
    recipe = copy_recipe("pydoc-llama", base)
    shutil.copy(REPO / "recipes" / "pydoc-llama.lock", base / "pydoc-llama.lock")
    env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home")}
    cli = zoo("run", recipe, "--frozen", "--json", env=env, timeout=1800)
    return {"base": base, "env": env, "cli": cli}


def test_the_recipe_rebuilds_its_locked_bytes_and_its_gates_pass(shipped):
    cli = shipped["cli"]
    assert cli.code == 0, cli.text
    result = json.loads(cli.out)
    stages = {s["id"]: s for s in result["stages"]}
    assert set(stages) == {"train", "export", "quantize", "verify", "deploy"}
    assert all(s["state"] == "done" for s in stages.values()), {k: s["state"] for k, s in stages.items()}
    train = stages["train"]["metrics"]
    assert train["num_parameters"] == 5_245_184  # the recipe's Llama with the corpus's 4096-token vocabulary
    history = train["history"]
    assert history[-1]["val_perplexity"] < history[0]["val_perplexity"]
    gates = stages["verify"]["metrics"]["gates"]
    assert gates and all(g["passed"] for g in gates), gates
    assert {g["metric"] for g in gates if not g["implicit"]} == {"perplexity", "perplexity_increase",
                                                                 "greedy_agreement", "speedup"}


def test_zoo_generate_streams_a_continuation_from_the_build_zoo_pull_chooses(shipped):
    env = shipped["env"]
    greedy = zoo("generate", "pydoc-llama", PROMPT, "--max-new-tokens", "24", "--json", env=env)
    assert greedy.code == 0, greedy.text
    doc = json.loads(greedy.out)
    assert doc["build"] == INT4  # the faster of the two measured builds
    assert doc["new_tokens"] == len(doc["tokens"]) and (doc["new_tokens"] == 24 or doc["finish_reason"] == "eos")
    assert doc["text"].strip() and doc["decode_tokens_per_s"] > 0
    again = json.loads(zoo("generate", "pydoc-llama", PROMPT, "--max-new-tokens", "24", "--json", env=env).out)
    assert again["tokens"] == doc["tokens"]  # greedy is deterministic
    sampled = [json.loads(zoo("generate", "pydoc-llama", PROMPT, "--max-new-tokens", "24", "--sample", "--seed",
                              str(seed), "--json", env=env).out)["tokens"] for seed in (1, 1, 2)]
    assert sampled[0] == sampled[1] and sampled[0] != sampled[2]
    streamed = zoo("generate", "pydoc-llama", PROMPT, "--max-new-tokens", "24", env=env)
    assert streamed.code == 0 and streamed.out.strip() == doc["text"].strip()
    assert "tokens/s" in streamed.err


def test_zoo_show_lists_the_generation_figures_and_the_int4_builds_quantization(shipped):
    env = shipped["env"]
    shown = zoo("show", "pydoc-llama", env=env)
    assert shown.code == 0, shown.text
    assert "perplexity" in shown.out and INT4 in shown.out and "cpu-fp32" in shown.out
    builds = json.loads(zoo("show", "pydoc-llama", "--json", env=env).out)["builds"]
    assert builds[INT4]["quantization"] == {"method": "weight_only", "algorithm": "rtn", "bits": 4, "block_size": 32,
                                            "symmetric": False, "accuracy_level": "int8"}
    assert builds[INT4]["precision"] == "int4" and builds["cpu-fp32"].get("quantization") is None
    for name in builds:
        shipped_files = {f["path"].rsplit("/", 1)[1] for f in builds[name]["extra_files"]}
        assert {"genai_config.json", "tokenizer.json", "tokenizer_config.json"} <= shipped_files


def test_onnxruntime_genai_generates_from_the_pulled_int4_build_what_zoo_generate_does(shipped):
    import onnxruntime_genai as og

    env, base = shipped["env"], shipped["base"]
    pulled = zoo("pull", "pydoc-llama", "--build", INT4, "--to", base / "pulled", env=env)
    assert pulled.code == 0, pulled.text
    build = base / "pulled" / "builds" / INT4
    model = og.Model(str(build))
    tokenizer = og.Tokenizer(model)
    doc = json.loads(zoo("generate", "pydoc-llama", PROMPT, "--build", INT4, "--max-new-tokens", "16", "--json",
                         env=env).out)
    prompt = [int(t) for t in tokenizer.encode(PROMPT)]
    assert prompt == doc["prompt_tokens"]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + 16, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)][len(prompt):]
    assert tokens == doc["tokens"][:len(tokens)] and len(tokens) >= 1
