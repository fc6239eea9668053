"""A decoder LLM at batch 1: zoo's int4 builds against zoo's fp32 build and against the int4 model
onnxruntime-genai's model builder makes of the same weights (prints figures; never run as a test).

1. Model and data: recipes/pydoc-llama.yaml's architecture (Hugging Face `transformers`'
   LlamaForCausalLM built from a config: nothing is downloaded) and corpus (the Python standard
   library's documentation topics, recipes/data/pydoc-topics.jsonl, split by topic), at a larger
   width (`--size`, below) so that decoding one token reads tens of MB of weights and is bound by
   memory, as it is for real LLMs; trained briefly (`--epochs`, default 1) by zoo's own train stage.
   The shipped recipe's size is `--size recipe`.
2. zoo: one `zoo run` of a temporary recipe (its own ZOO_CACHE_DIR/ZOO_HOME): train → export
   (torch.onnx with the KV cache, the fp32 build) → quantize `mode: weight_only`, 4 bits: RTN with
   block 32 and int8 compute ("zoo int4 rtn"), and k-quant with the LM head kept at 8 bits
   ("zoo int4 k_quant"); and train → export with `exporter: genai` (onnxruntime-genai's builder
   inside zoo's export: fused attention, fp32) → the same k-quant ("zoo int4 k_quant, genai
   export"). The fastest at 1 thread is "zoo int4" for the goals; the builder comparison takes the
   fastest at each thread count.
3. The peer: onnxruntime-genai's model builder (`-p int4 -e cpu`, its defaults) on a local
   Hugging Face folder holding the trained checkpoint, config and tokenizer: the same weights.
4. Timing: every model in ONE process with the project's onnxruntime, through zoo's decoding loop
   (zoo/textgen.py, the one `zoo generate` and verify use), at 1 and 2 intra-op threads, batch 1,
   a 128-token prompt from held-out text and 128 greedy new tokens; warm-up first, then
   round-robin (one generation of each model in turn, `--rounds` times), medians of prefill ms
   and decode tokens/s.
5. Quality: perplexity of each model on held-out blocks (teacher-forced), and greedy agreement
   with zoo's fp32 build on fixed prompts (the first 32 tokens of held-out blocks, 64 new tokens):
   tokens matched before the first divergence, as a share of all tokens.

Goals printed as PASS/FAIL: zoo int4 decode ≥ 2.5× zoo fp32's tokens/s (1 thread); zoo int4 at
least as fast as the builder's int4 with perplexity no worse; zoo int4 perplexity at most 5% above
fp32's; greedy agreement ≥ 90% of tokens.

    .venv/bin/python bench/bench_llm.py [--size recipe|small|medium|large] [--epochs 1] [--rounds 5]
                                        [--prompt 128] [--new 128] [--threads 1,2] [--keep]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # no __pycache__ next to the bench scripts
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quantize import REPO, host_line, load_average, output_path, run_zoo, table  # noqa: E402

# LlamaConfig settings per size; `recipe` is recipes/pydoc-llama.yaml's own
SIZES: dict[str, dict[str, int]] = {
    "recipe": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 8,
               "num_key_value_heads": 4},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 4},
    "medium": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 6, "num_attention_heads": 12,
               "num_key_value_heads": 4},
    "large": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
              "num_key_value_heads": 4},
}
INT4 = {"zoo int4 rtn": "quantize_rtn", "zoo int4 k_quant": "quantize_kquant",
        "zoo int4 k_quant, genai export": "quantize_genai"}
SPEED_GOAL = 2.5
PPL_GOAL = 0.05
AGREEMENT_GOAL = 0.90


RTN = "{algorithm: rtn, bits: 4, block_size: 32, accuracy_level: int8}"
KQUANT = '{algorithm: k_quant, bits: 4, block_size: 32, accuracy_level: int8, keep_8bit: ["*lm_head*"]}'


def _weight_only(stage_id: str, source: str, settings: str) -> str:
    """A weight-only int4 quantize stage of `source`'s model (accept rules off: the bench judges)."""
    return (f"  {stage_id}:\n    kind: quantize\n    needs: [{source}]\n    config:\n      mode: weight_only\n"
            f"      weight_only: {settings}\n      accept: {{min_cosine: 0.0, min_speedup: 0.0}}\n")


def zoo_recipe(size: str, epochs: int) -> str:
    config = {**SIZES[size], "max_position_embeddings": 512, "tie_word_embeddings": False}
    return f"""\
schema_version: 1
name: bench-llm-{size}
version: 0.0.1
description: pydoc-llama at size {size}, briefly trained; fp32 and weight-only int4 builds (bench/bench_llm.py)
task: text-generation
model:
  framework: transformers
  architecture: LlamaForCausalLM
  config: {json.dumps(config)}
data:
  source: text
  path: {REPO / "recipes" / "data" / "pydoc-topics.jsonl"}
  text: text
  tokenizer:
    train: {{model: bpe, vocab_size: 4096, min_frequency: 2}}
  block_size: 128
  val_fraction: 0.1
  split_seed: 0
stages:
  train:
    config:
      epochs: {epochs}
      batch_size: 16
      optimizer: {{name: adamw, lr: 0.002, weight_decay: 0.01}}
      schedule: cosine
      seed: 0
      threads: 2
  export: {{}}
{_weight_only("quantize_rtn", "export", RTN)}{_weight_only("quantize_kquant", "export", KQUANT)}\
  export_genai:                 # the same weights through onnxruntime-genai's builder (fused attention), fp32
    kind: export
    needs: [train]
    config: {{exporter: genai}}
{_weight_only("quantize_genai", "export_genai", KQUANT)}"""


def builder_int4(work: Path, recipe: Path, checkpoint: Path, genai_out: Path) -> tuple[Path, float]:
    """onnxruntime-genai's builder, its int4 CPU defaults, on a Hugging Face folder of the same
    weights: the trained checkpoint loaded into the recipe's model as zoo's export loads it, saved
    with `save_pretrained`, and the tokenizer files of zoo's build."""
    import torch

    from zoo_stages.lib.models import archs, checkpoints, genai_builder

    section, data = _sections(recipe)
    torch.set_num_threads(2)
    sizes = archs.data_sizes(section, data, recipe.parent)
    model = checkpoints.build_with_weights(section, recipe.parent, checkpoint, "checkpoint", **sizes)
    tokenizer = {f.name: f.read_bytes() for f in genai_out.iterdir() if f.name in genai_builder.TOKENIZER_FILES}
    folder = genai_builder.hf_folder(model, tokenizer, work / "hf")
    start = time.perf_counter()
    out = genai_builder.run(folder, work / "builder-int4", precision="int4")
    return out, time.perf_counter() - start


def _sections(recipe: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The recipe's model: and data: sections as plain dicts (data.path made absolute)."""
    import yaml

    doc = yaml.safe_load(recipe.read_text())
    return dict(doc["model"]), dict(doc["data"])


def decoder(model: Path, genai_dir: Path, threads: int):
    from zoo.textgen import Decoder, read_genai_config
    from zoo_stages.lib.runtimes.ort_session import make_session

    settings = read_genai_config(genai_dir)
    session = make_session(model, threads=threads, level="all")
    return Decoder(session, head_size=settings.head_size, context_length=settings.context_length)


def time_round_robin(models: dict[str, tuple[Path, Path]], prompt: Any, new: int, threads: int,
                     rounds: int) -> dict[str, dict[str, float]]:
    """Median prefill ms and decode tokens/s of each model: one greedy generation of each in turn."""
    decoders = {name: decoder(path, genai, threads) for name, (path, genai) in models.items()}
    for d in decoders.values():  # warm-up: first-run allocations and kernel selection
        d.greedy(prompt, 8).run()
    prefill: dict[str, list[float]] = {n: [] for n in decoders}
    speed: dict[str, list[float]] = {n: [] for n in decoders}
    for _ in range(rounds):
        for name, d in decoders.items():
            g = d.greedy(prompt, new, eos=()).run()
            prefill[name].append(g.prefill_s * 1000)
            speed[name].append(g.decode_tokens_per_s)
    return {n: {"prefill_ms": statistics.median(prefill[n]), "tokens_per_s": statistics.median(speed[n])}
            for n in decoders}


def quality(models: dict[str, tuple[Path, Path]], blocks: Any, prompts: Any, new: int) -> dict[str, dict[str, float]]:
    """Perplexity on held-out blocks and greedy agreement with zoo fp32 (tokens before the first divergence)."""
    import numpy as np

    from zoo.textgen import perplexity

    decoders = {name: decoder(path, genai, 2) for name, (path, genai) in models.items()}
    reference = [np.asarray(decoders["zoo fp32"].greedy(p, new, eos=()).run().tokens) for p in prompts]
    out = {}
    for name, d in decoders.items():
        matched = 0
        for p, ref in zip(prompts, reference):
            got = np.asarray(d.greedy(p, new, eos=()).run().tokens)
            diverge = np.nonzero(got[:len(ref)] != ref[:len(got)])[0]
            matched += int(diverge[0]) if diverge.size else min(len(got), len(ref))
        out[name] = {"perplexity": float(perplexity(d, blocks)), "agreement": matched / (len(prompts) * new)}
    return out


def held_out(recipe: Path, prompt_len: int, blocks: int, prompts: int) -> tuple[Any, Any, Any]:
    """From the recipe's held-out split (zoo's own data loader: the same split and tokenizer as the
    stages): `blocks` blocks for perplexity, the timed prompt (the first `prompt_len` tokens of
    held-out text) and `prompts` fixed 32-token prompts for agreement."""
    import numpy as np

    from zoo_stages.lib.data import datasets

    _, data = _sections(recipe)
    ids = np.asarray(datasets.load_split(data, recipe.parent, "val").features["input_ids"])
    flat = ids.reshape(-1)
    if flat.size < prompt_len:
        raise SystemExit(f"held-out text has {flat.size} tokens, fewer than --prompt {prompt_len}")
    return ids[:blocks], flat[:prompt_len].copy(), ids[:prompts, :32].copy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="medium")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--blocks", type=int, default=16, help="held-out blocks for perplexity")
    ap.add_argument("--prompts", type=int, default=8, help="fixed prompts for greedy agreement")
    ap.add_argument("--agree-new", type=int, default=64, help="new tokens per agreement prompt")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    args = ap.parse_args()
    print(host_line(), f"load {load_average()}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="bench-llm-"))
    try:
        run(work, args)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, args) -> None:
    import onnxruntime
    import onnxruntime_genai

    folder = work / "zoo"
    folder.mkdir()
    recipe = folder / "bench.yaml"
    recipe.write_text(zoo_recipe(args.size, args.epochs))
    print(f"zoo run (size {args.size}: {SIZES[args.size]}, {args.epochs} epoch(s)) …", flush=True)
    summary, wall = run_zoo(recipe, folder / "cache", folder / "home")
    stages = {s["id"]: round(s["duration_s"], 1) for s in summary["stages"]}
    print(f"  {wall:.0f} s: " + ", ".join(f"{k} {v} s" for k, v in stages.items()), flush=True)
    export_genai = output_path(summary, "export", "genai")
    models: dict[str, tuple[Path, Path]] = {"zoo fp32": (output_path(summary, "export"), export_genai)}
    for name, stage_id in INT4.items():
        genai = output_path(summary, "export_genai", "genai") if stage_id == "quantize_genai" else export_genai
        models[name] = (output_path(summary, stage_id), genai)
    print("onnxruntime-genai's builder, -p int4 -e cpu (defaults) …", flush=True)
    built, seconds = builder_int4(work, recipe, output_path(summary, "train", "checkpoint"), export_genai)
    models["builder int4"] = (built / "model.onnx", built)
    print(f"  {seconds:.0f} s", flush=True)
    sizes = {n: sum(f.stat().st_size for f in p.parent.iterdir() if f.name.startswith(p.name)) for n, (p, _) in
             models.items()}

    blocks, prompt, prompts = held_out(recipe, args.prompt, args.blocks, args.prompts)
    print(f"quality: perplexity on {len(blocks)} held-out blocks of {blocks.shape[1]} tokens; greedy agreement "
          f"on {len(prompts)} prompts of 32 tokens, {args.agree_new} new tokens each …", flush=True)
    figures = quality(models, blocks, prompts, args.agree_new)
    timings = {}
    for threads in [int(t) for t in args.threads.split(",")]:
        print(f"timing at {threads} thread(s): prompt {len(prompt)} tokens, {args.new} new, {args.rounds} rounds, "
              "round-robin …", flush=True)
        timings[threads] = time_round_robin(models, prompt, args.new, threads, args.rounds)

    print(f"\nonnxruntime {onnxruntime.__version__}, onnxruntime-genai {onnxruntime_genai.__version__}; "
          f"{host_line()}; load {load_average()}")
    header = ["model", "size MB", "perplexity", "agreement"]
    for t in timings:
        header += [f"prefill ms ({t}t)", f"tok/s ({t}t)"]
    rows = []
    for name in models:
        row = [name, f"{sizes[name] / 1e6:.1f}", f"{figures[name]['perplexity']:.3f}",
               f"{figures[name]['agreement']:.1%}"]
        for t in timings:
            row += [f"{timings[t][name]['prefill_ms']:.1f}", f"{timings[t][name]['tokens_per_s']:.1f}"]
        rows.append(row)
    print(table(header, rows))

    one = min(timings)
    best = max(INT4, key=lambda n: timings[one][n]["tokens_per_s"])
    fastest = {t: max(INT4, key=lambda n: timings[t][n]["tokens_per_s"]) for t in timings}
    fp32, peer = "zoo fp32", "builder int4"
    speed = timings[one][best]["tokens_per_s"] / timings[one][fp32]["tokens_per_s"]
    ppl_up = figures[best]["perplexity"] / figures[fp32]["perplexity"] - 1
    goals = [
        (f"{best} decode >= {SPEED_GOAL}x zoo fp32 ({one} thread)", speed >= SPEED_GOAL, f"{speed:.2f}x"),
        *[(f"zoo int4 ({fastest[t]}, the fastest at {t} thread(s)) at least as fast as the builder's int4",
           timings[t][fastest[t]]["tokens_per_s"] >= timings[t][peer]["tokens_per_s"],
           f"{timings[t][fastest[t]]['tokens_per_s']:.1f} vs {timings[t][peer]['tokens_per_s']:.1f} tok/s")
          for t in timings],
        (f"{best} perplexity no worse than the builder's int4", figures[best]["perplexity"] <= figures[peer]["perplexity"],
         f"{figures[best]['perplexity']:.3f} vs {figures[peer]['perplexity']:.3f}"),
        (f"{best} perplexity <= {PPL_GOAL:.0%} above fp32", ppl_up <= PPL_GOAL, f"{ppl_up:+.2%}"),
        (f"{best} greedy agreement >= {AGREEMENT_GOAL:.0%} of tokens", figures[best]["agreement"] >= AGREEMENT_GOAL,
         f"{figures[best]['agreement']:.1%}"),
    ]
    print("\ngoals (zoo int4 = " + best + ", the faster of zoo's int4 builds at 1 thread):")
    for text, ok, value in goals:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}: {value}")


if __name__ == "__main__":
    main()
