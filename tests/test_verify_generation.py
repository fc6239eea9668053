"""verify for `task: text-generation`: perplexity, greedy agreement, decode timings, decoder test
vectors, and what does not apply (tests/decoder_graphs.py's standard-op attention decoder and its
int4 MatMulNBits build; onnxruntime-genai's tiny Llama in the slow tests at the end)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pydantic
import pytest
from onnx import TensorProto, helper, numpy_helper

import decoder_graphs as dg
from cli_helpers import zoo
from zoo import textgen
from zoo.errors import FieldError, GateFailed, InvalidInput
from zoo.stage import Inputs, RecipeInfo, StageContext, Upstream
from zoo_stages.lib.onnx import onnx_io, portability, reference_run
from zoo_stages.lib.quality import generation as genlib
from zoo_stages.lib.release import vectors as vectorlib
from zoo_stages.verify import BATCHED_REASON, Verify, VerifyConfig, metric_names

VOCAB = 96
FAST = {"warmup": 1, "runs": 3, "threads": 1}
GEN = {"prompts": 6, "prompt_tokens": 8, "new_tokens": 10, "latency_prompt_tokens": 8, "latency_new_tokens": 4,
       "vector_steps": 2}
DATA = {"source": "npz", "path": "tokens.npz", "label": None, "val_fraction": 0.25}


# -- fixtures ----------------------------------------------------------------------------------


def perturbed(scale: float, seed: int = 5) -> onnx.ModelProto:
    """The seed-0 attention decoder with noise of `scale` added to its LM head."""
    w = dg.decoder_weights()
    w["Wlm"] = w["Wlm"] + np.random.default_rng(seed).standard_normal(w["Wlm"].shape).astype(np.float32) * scale
    return dg.attention_decoder(weights=w)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory):
    """The fp32 decoder, a byte-identical twin, a perturbed one, the int4 build, the uniform one,
    and held-out token blocks (an npz standing in for a tokenized corpus)."""
    base = tmp_path_factory.mktemp("decoders")
    fp32 = dg.save(dg.attention_decoder(), base / "fp32" / "model.onnx")
    twin = base / "twin" / "model.onnx"
    twin.parent.mkdir()
    shutil.copy(fp32, twin)
    rng = np.random.default_rng(0)
    # text the decoder finds likely: its own seeded samples, so perplexity is far below the vocabulary's
    session = ort.InferenceSession(str(fp32))
    decoder = textgen.Decoder(session)
    blocks = np.concatenate([rng.integers(0, VOCAB, (40, 4)),
                             np.asarray(decoder.sample(rng.integers(0, VOCAB, (40, 4)), 20, seed=1, eos=[]).run()
                                        .tokens)], axis=1).astype(np.int64)
    np.savez(base / "tokens.npz", input_ids=blocks)
    return {"base": base, "fp32": fp32, "twin": twin, "perturbed": dg.save(perturbed(0.3), base / "pert" / "model.onnx"),
            "int4": dg.int4_of(fp32, base / "int4" / "model.onnx"),
            "uniform": dg.save(dg.uniform_decoder(VOCAB), base / "uniform" / "model.onnx"),
            "blocks": blocks}


def context(tmp_path: Path, decoders, *, data=DATA, task="text-generation", name="run") -> StageContext:
    run = tmp_path / name
    (run / "out").mkdir(parents=True)
    if decoders is not None and not (tmp_path / "tokens.npz").exists():
        shutil.copy(decoders["base"] / "tokens.npz", tmp_path / "tokens.npz")
    recipe = RecipeInfo(name="t", version="0.1.0", description="", license="", path=tmp_path / "recipe.yaml", digest="")
    return StageContext(stage_id="verify", out_dir=run / "out", work_dir=run / "work", recipe=recipe,
                        shared={"data": data, "task": task, "model": {}}, matrix={})


def verify(tmp_path, decoders, builds: dict[str, str], *, gates=(), data=DATA, task="text-generation", name="run",
           **overrides):
    """verify over `builds` (name -> key of `decoders`), the first the reference."""
    ctx = context(tmp_path, decoders, data=data, task=task, name=name)
    inputs = Inputs([Upstream(key, "export", {"model": decoders[key]}, {}) for key in dict.fromkeys(builds.values())])
    cfg = VerifyConfig(**{"builds": builds, "reference": next(iter(builds)), "latency": FAST, "generation": GEN,
                          "vectors": {"count": 1, "seed": 0}, "gates": list(gates), **overrides})
    out = Verify().run(inputs, cfg, ctx)
    return json.loads(out["report"].read_text()), ctx, out


def val_blocks(tmp_path) -> np.ndarray:
    from zoo_stages.lib.data.datasets import load_split

    return np.asarray(load_split(DATA, tmp_path, "val").features["input_ids"])


def nll_by_hand(model_path: Path, blocks: np.ndarray) -> float:
    """Mean next-token negative log-likelihood from the logits of one onnxruntime run per block,
    computed here without zoo's decoding loop."""
    session = ort.InferenceSession(str(model_path))
    total, count = 0.0, 0
    for row in blocks:
        ids = row[None, :].astype(np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "past_key_values.0.key": np.zeros((1, 1, 0, 16), np.float32),
                 "past_key_values.0.value": np.zeros((1, 1, 0, 16), np.float32)}
        logits = session.run(["logits"], feeds)[0][0].astype(np.float64)
        for t in range(len(row) - 1):
            z = logits[t]
            total += math.log(np.exp(z - z.max()).sum()) + z.max() - z[row[t + 1]]
            count += 1
    return total / count


def greedy_without_cache(model_path: Path, prompt: np.ndarray, n: int) -> list[int]:
    """Greedy tokens by re-running the whole sequence each step (no KV cache): an independent loop."""
    session = ort.InferenceSession(str(model_path))
    ids = list(prompt)
    for _ in range(n):
        seq = np.asarray([ids], np.int64)
        feeds = {"input_ids": seq, "attention_mask": np.ones_like(seq),
                 "past_key_values.0.key": np.zeros((1, 1, 0, 16), np.float32),
                 "past_key_values.0.value": np.zeros((1, 1, 0, 16), np.float32)}
        ids.append(int(np.argmax(session.run(["logits"], feeds)[0][0, -1])))
    return ids[len(prompt):]


def matched_before_divergence(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))


# -- metrics -----------------------------------------------------------------------------------


def test_a_uniform_decoder_has_the_vocabulary_size_as_perplexity(tmp_path, decoders):
    report, _, _ = verify(tmp_path, decoders, {"uniform": "uniform"})
    assert report["builds"]["uniform"]["perplexity"] == pytest.approx(VOCAB, rel=1e-9)


def test_perplexity_and_its_increase_match_a_hand_computation_from_the_logits(tmp_path, decoders):
    report, ctx, _ = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"})
    blocks = val_blocks(tmp_path)
    fp32, int4 = report["builds"]["cpu-fp32"], report["builds"]["cpu-int4"]
    assert fp32["perplexity"] == pytest.approx(math.exp(nll_by_hand(decoders["fp32"], blocks)), rel=1e-6)
    assert int4["perplexity"] == pytest.approx(math.exp(nll_by_hand(decoders["int4"], blocks)), rel=1e-6)
    # the decoder's own samples are likely text to it: well below the uniform decoder's perplexity
    assert fp32["perplexity"] < VOCAB / 2
    assert int4["perplexity_increase"] == pytest.approx(int4["perplexity"] / fp32["perplexity"] - 1, rel=1e-9)
    assert fp32["perplexity_increase"] == 0.0
    assert report["eval_samples"] == len(blocks) and report["eval_data"] == genlib.TEXT_FROM_DATA
    assert report["task_kind"] == "generation" and report["task_metrics"] == ["perplexity"]
    # text_blocks uses the first blocks of the split only
    report2, _, _ = verify(tmp_path, decoders, {"cpu-fp32": "fp32"}, name="two",
                           generation={**GEN, "text_blocks": 2})
    assert report2["eval_samples"] == 2
    assert report2["builds"]["cpu-fp32"]["perplexity"] == pytest.approx(
        math.exp(nll_by_hand(decoders["fp32"], blocks[:2])), rel=1e-6)


def test_agreement_is_complete_for_the_same_model_twice_and_partial_for_a_perturbed_one(tmp_path, decoders):
    report, ctx, _ = verify(tmp_path, decoders, {"ref": "fp32", "twin": "twin", "perturbed": "perturbed"})
    twin, pert = report["builds"]["twin"], report["builds"]["perturbed"]
    n = GEN["new_tokens"]
    assert (twin["greedy_agreement"], twin["greedy_exact_match"], twin["greedy_matched_tokens"]) == (1.0, 1.0, n)
    assert twin["max_abs"] == 0.0 and twin["cosine"] == pytest.approx(1.0)
    # the perturbed build's figures, recomputed with a loop of our own that keeps no cache
    prompts = val_blocks(tmp_path)[:GEN["prompts"], :GEN["prompt_tokens"]]
    matched = [matched_before_divergence(greedy_without_cache(decoders["fp32"], p, n),
                                         greedy_without_cache(decoders["perturbed"], p, n)) for p in prompts]
    assert pert["greedy_matched_tokens"] == pytest.approx(np.mean(matched))
    assert pert["greedy_agreement"] == pytest.approx(np.mean(matched) / n)
    assert pert["greedy_exact_match"] == pytest.approx(np.mean([m == n for m in matched]))
    assert pert["greedy_agreement"] < 1.0 and pert["cosine"] < 1.0 and pert["max_abs"] > 0


def test_agreement_counts_tokens_before_the_first_divergence():
    ref = np.array([[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8]])
    got = np.array([[1, 2, 3, 4], [1, 9, 3, 4], [0, 6, 7, 8]])  # a later match after a divergence counts nothing
    assert genlib.agreement(ref, got) == {"greedy_matched_tokens": pytest.approx(5 / 3),
                                          "greedy_agreement": pytest.approx(5 / 12),
                                          "greedy_exact_match": pytest.approx(1 / 3)}
    with pytest.raises(ValueError):
        genlib.agreement(ref, got[:, :2])


def test_timings_are_metrics_and_never_in_the_report(tmp_path, decoders):
    report, ctx, _ = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"})
    m = ctx.metrics["builds"]["cpu-int4"]
    for name in ("latency_p50_ms", "latency_p90_ms", "latency_prefill_ms", "latency_prefill_p90_ms"):
        assert m[name] > 0 and name not in report["builds"]["cpu-int4"]
    assert m["latency_p50_ms"] <= m["latency_p90_ms"] and m["latency_prefill_ms"] <= m["latency_prefill_p90_ms"]
    assert m["throughput_tokens_per_s"] == pytest.approx(1000 / m["latency_p50_ms"])
    assert m["speedup"] == pytest.approx(ctx.metrics["builds"]["cpu-fp32"]["latency_p50_ms"] / m["latency_p50_ms"])
    assert set(report["measured"]) == {"latency_p50_ms", "latency_p90_ms", "latency_prefill_ms",
                                       "latency_prefill_p90_ms", "throughput_tokens_per_s", "speedup"}
    assert report["generation"]["prompts"] == GEN["prompts"] and report["generation"]["vocab_size"] == VOCAB


def test_the_timing_progress_lines_and_the_run_summary_table(tmp_path, decoders, caplog):
    import logging

    caplog.set_level(logging.INFO)
    ctx = context(tmp_path, decoders)
    ctx.log = logging.getLogger("test-verify-generation")
    inputs = Inputs([Upstream("fp32", "export", {"model": decoders["fp32"]}, {}),
                     Upstream("int4", "export", {"model": decoders["int4"]}, {})])
    cfg = VerifyConfig(builds={"cpu-fp32": "fp32", "cpu-int4": "int4"}, latency=FAST, generation=GEN,
                       gates=["cpu-int4.greedy_agreement >= 0.1"])
    Verify().run(inputs, cfg, ctx)
    assert "latency cpu-int4 3/3" in caplog.text
    tables = Verify().report("verify", ctx.metrics, [])
    assert [t.title for t in tables] == ["generation (verify)", "gates (verify)"]
    gen = tables[0]
    assert [c.header for c in gen.columns] == ["build", "perplexity", "vs ref", "greedy agreement", "exact",
                                               "prefill ms", "decode ms", "tokens/s"]
    rows = {r[0]: r for r in gen.rows}
    b = ctx.metrics["builds"]["cpu-int4"]
    assert rows["cpu-int4"][1:] == (b["perplexity"], b["perplexity_increase"], b["greedy_agreement"],
                                    b["greedy_exact_match"], b["latency_prefill_ms"], b["latency_p50_ms"],
                                    b["throughput_tokens_per_s"])


# -- gates -------------------------------------------------------------------------------------


def test_gates_on_generation_metrics_pass_and_fail(tmp_path, decoders):
    gates = ["pert.perplexity_increase <= 10", "pert.greedy_agreement >= 1", "pert.throughput_tokens_per_s > 0",
             "pert.latency_prefill_ms < 1e6", "pert.cosine >= 0.5"]
    with pytest.raises(GateFailed) as err:
        verify(tmp_path, decoders, {"ref": "fp32", "pert": "perturbed"}, gates=gates)
    assert "pert.greedy_agreement >= 1" in str(err.value) and "pert.perplexity_increase" not in str(err.value)
    report = json.loads((tmp_path / "run" / "out" / "report.json").read_text())
    assert [g["passed"] for g in report["gates"] if not g["implicit"] and "value" in g] == [True, False, True]
    assert report["passed"] is False
    for name in ("perplexity", "perplexity_increase", "greedy_agreement", "greedy_exact_match",
                 "greedy_matched_tokens", "latency_prefill_ms", "throughput_tokens_per_s"):
        assert name in metric_names([1])


# -- what does not apply -----------------------------------------------------------------------

CLASSIFIER_ONLY = ("accuracy", "accuracy_drop", "top5_accuracy", "macro_f1", "mae", "r2", "top1_agreement",
                   "exact_match", "throughput_bs1")
GENERATION_ONLY = ("perplexity", "perplexity_increase", "greedy_agreement", "greedy_exact_match",
                   "greedy_matched_tokens", "latency_prefill_ms", "throughput_tokens_per_s")


def test_a_generative_build_gets_no_classification_metric_and_such_gates_are_refused(tmp_path, decoders):
    report, ctx, _ = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"})
    for m in list(report["builds"].values()) + list(ctx.metrics["builds"].values()):
        assert not [k for k in m if k in CLASSIFIER_ONLY or k.startswith("throughput_bs") or k == "throughput"]
    with pytest.raises(InvalidInput, match="classification metric and task 'text-generation' is generation"):
        verify(tmp_path, decoders, {"cpu-fp32": "fp32"}, gates=["cpu-fp32.accuracy >= 0.5"], name="acc")
    with pytest.raises(InvalidInput) as err:
        verify(tmp_path, decoders, {"cpu-fp32": "fp32"}, gates=["cpu-fp32.throughput_bs1 >= 1"], name="bs")
    assert BATCHED_REASON in err.value.message and "throughput_tokens_per_s" in err.value.hint


def classifier(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Flatten", ["image"], ["flat"], axis=1),
                               helper.make_node("MatMul", ["flat", "W"], ["scores"])], "clf",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 1, 8, 8])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 10])],
                              [numpy_helper.from_array(np.random.default_rng(0).random((64, 10), np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = onnx_io.MAX_IR_VERSION
    return dg.save(model, path)


def test_a_classifier_gets_no_generation_metric_and_such_gates_are_refused(tmp_path):
    data = {"source": "digits", "image_size": 8, "channels": 1}
    model = classifier(tmp_path / "clf.onnx")

    def run(gates, name):
        ctx = context(tmp_path, None, data=data, task="image-classification", name=name)
        cfg = VerifyConfig(builds={"clf": "export"}, latency={**FAST, "batch_sizes": [1]}, gates=gates)
        Verify().run(Inputs([Upstream("export", "export", {"model": model}, {})]), cfg, ctx)
        return ctx

    ctx = run([], "plain")
    m = ctx.metrics["builds"]["clf"]
    assert "accuracy" in m and not [k for k in m if k in GENERATION_ONLY or k.startswith(("greedy", "latency_prefill"))]
    with pytest.raises(InvalidInput, match="measures a generative build .task text-generation., and task "
                                           "'image-classification' is classification"):
        run(["clf.greedy_agreement >= 0.9"], "greedy")
    with pytest.raises(InvalidInput, match="generation metric and task 'image-classification' is classification"):
        run(["clf.perplexity <= 10"], "ppl")


def test_without_data_a_decoder_gets_latency_and_agreement_on_random_prompts_and_says_so(tmp_path, decoders):
    report, ctx, _ = verify(tmp_path, decoders, {"ref": "fp32", "twin": "twin", "pert": "perturbed"}, data=None,
                            gates=["twin.greedy_agreement >= 1"])
    assert report["eval_data"] == genlib.RANDOM_PROMPTS and report["eval_samples"] == 0
    assert report["task_metrics"] == []
    for name, m in ctx.metrics["builds"].items():
        assert "perplexity" not in m and "perplexity_increase" not in m
        assert m["latency_p50_ms"] > 0 and 0 <= m["greedy_agreement"] <= 1
        assert any("perplexity not measured" in n for n in m["notes"])
    assert ctx.metrics["builds"]["twin"]["greedy_exact_match"] == 1.0
    with pytest.raises(InvalidInput, match="needs the held-out `input_ids` blocks of a `data:` section"):
        verify(tmp_path, decoders, {"ref": "fp32"}, data=None, gates=["ref.perplexity <= 100"], name="ppl")
    # the same seed, the same prompts
    again, _, _ = verify(tmp_path, decoders, {"ref": "fp32", "pert": "perturbed"}, data=None, name="again")
    assert again["builds"]["pert"]["greedy_matched_tokens"] == report["builds"]["pert"]["greedy_matched_tokens"]


# -- bad input ---------------------------------------------------------------------------------


def test_prompts_longer_than_the_held_out_blocks_are_a_field_error(tmp_path, decoders):
    with pytest.raises(FieldError) as err:
        verify(tmp_path, decoders, {"ref": "fp32"}, generation={**GEN, "prompt_tokens": 25})
    assert err.value.field == ("stages", "verify", "config", "generation", "prompt_tokens")
    assert "blocks hold 24 tokens" in err.value.message


def test_data_without_input_ids_or_with_ids_outside_the_vocabulary_is_a_field_error(tmp_path, decoders):
    np.savez(tmp_path / "other.npz", tokens=np.zeros((10, 4), np.int64))
    with pytest.raises(FieldError, match="the data has tokens") as err:
        verify(tmp_path, decoders, {"ref": "fp32"}, data={**DATA, "path": "other.npz"})
    assert err.value.field == ("data",)
    np.savez(tmp_path / "wide.npz", input_ids=np.full((10, 12), VOCAB + 3, np.int64))
    with pytest.raises(FieldError, match=f"token id {VOCAB + 3}, outside the model's vocabulary of {VOCAB}"):
        verify(tmp_path, decoders, {"ref": "fp32"}, data={**DATA, "path": "wide.npz"}, name="wide")


def test_a_symbolic_head_size_comes_from_genai_config_json_of_the_build_or_its_export(tmp_path, decoders):
    """The export stage's `genai` output holds genai_config.json; a quantized build beside it has none of its own."""
    fp32 = dg.save(dg.with_symbolic_head_size(dg.attention_decoder()), tmp_path / "export" / "model.onnx")
    int4 = dg.int4_of(fp32, tmp_path / "quantize" / "model.onnx")
    ctx = context(tmp_path, decoders)
    cfg = VerifyConfig(builds={"cpu-fp32": "export", "cpu-int4": "quantize"}, latency=FAST, generation=GEN)
    alone = Inputs([Upstream("export", "export", {"model": fp32}, {}),
                    Upstream("quantize", "quantize", {"model": int4}, {})])
    with pytest.raises(InvalidInput, match="build 'cpu-fp32': KV-cache input 'past_key_values.0.key' leaves its "
                                           "head size symbolic") as err:
        Verify().run(alone, cfg, ctx)
    assert "genai_config.json" in err.value.hint
    genai = dg.genai_config(tmp_path / "export" / "genai").parent
    inputs = Inputs([Upstream("export", "export", {"model": fp32, "genai": genai}, {}),
                     Upstream("quantize", "quantize", {"model": int4}, {})])
    Verify().run(inputs, cfg, context(tmp_path, decoders, name="with-genai"))
    report = json.loads((tmp_path / "with-genai" / "out" / "report.json").read_text())
    concrete, _, _ = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"}, name="concrete")
    for build in ("cpu-fp32", "cpu-int4"):  # the same model with its head size declared: the same figures
        assert report["builds"][build]["perplexity"] == pytest.approx(concrete["builds"][build]["perplexity"])
        assert report["builds"][build]["greedy_matched_tokens"] == concrete["builds"][build]["greedy_matched_tokens"]


def test_a_context_length_too_short_for_the_settings_is_a_field_error(tmp_path, decoders):
    short = tmp_path / "short" / "model.onnx"
    short.parent.mkdir()
    shutil.copy(decoders["fp32"], short)
    dg.genai_config(short.parent, context_length=16)
    with pytest.raises(FieldError, match="prompt_tokens \\+ new_tokens is 18 tokens, and build 'ref' has a context "
                                         "length of 16") as err:
        verify(tmp_path, {**decoders, "short": short}, {"ref": "short"})
    assert err.value.field == ("stages", "verify", "config", "generation", "new_tokens")


def test_task_and_model_must_agree(tmp_path, decoders):
    clf = classifier(tmp_path / "clf.onnx")
    with pytest.raises(InvalidInput, match="measures a decoder with a KV cache, and the reference build 'ref' is "
                                           "not one .its inputs: image."):
        verify(tmp_path, {**decoders, "clf": clf}, {"ref": "clf"}, data=None)
    with pytest.raises(InvalidInput, match="is a decoder with a KV cache, and task 'generic' is generic") as err:
        verify(tmp_path, decoders, {"ref": "fp32"}, task="generic", data=None, name="generic")
    assert "text-generation" in err.value.hint


def test_generation_settings_for_another_task_and_bad_values_are_refused(tmp_path):
    data = {"source": "digits", "image_size": 8, "channels": 1}
    ctx = context(tmp_path, None, data=data, task="image-classification")
    model = classifier(tmp_path / "clf.onnx")
    cfg = VerifyConfig(builds={"clf": "export"}, latency=FAST, generation={"new_tokens": 4})
    with pytest.raises(FieldError, match="apply to a text-generation task") as err:
        Verify().run(Inputs([Upstream("export", "export", {"model": model}, {})]), cfg, ctx)
    assert err.value.field == ("stages", "verify", "config", "generation")
    ctx = context(tmp_path, None, data=None, name="eval")
    fp32 = dg.save(dg.attention_decoder(), tmp_path / "dec.onnx")
    for field, value in (("eval_samples", 4), ("output", "logits")):
        cfg = VerifyConfig(builds={"dec": "export"}, latency=FAST, **{field: value})
        with pytest.raises(FieldError, match=f"`{field}` does not apply to a text-generation task") as err:
            Verify().run(Inputs([Upstream("export", "export", {"model": fp32}, {})]), cfg,
                         dataclasses.replace(ctx, shared={"data": None, "task": "text-generation", "model": {}}))
        assert err.value.field == ("stages", "verify", "config", field)
    for bad in ({"prompts": 0}, {"new_tokens": 0}, {"latency_new_tokens": 1}, {"text_blocks": 0},
                {"vector_steps": -1}, {"temperature": 1.0}):
        with pytest.raises(pydantic.ValidationError):
            VerifyConfig(generation=bad)


# -- test vectors ------------------------------------------------------------------------------


def test_decoder_vectors_chain_greedy_steps_and_hold_under_both_runtimes(tmp_path, decoders):
    report, ctx, out = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"},
                              vectors={"count": 2, "seed": 0})
    steps = GEN["vector_steps"]
    for build, model in (("cpu-fp32", decoders["fp32"]), ("cpu-int4", decoders["int4"])):
        sets = vectorlib.find_sets(out["vectors"] / build)
        assert len(sets) == 2 * (steps + 1) and len(report["builds"][build]["vectors"]) == len(sets)
        session = ort.InferenceSession(str(model))
        records = [vectorlib.decoder_step(s) for s in sets]
        for prompt in (0, 1):
            chain = [(s, r) for s, r in zip(sets, records) if r["prompt"] == prompt]
            assert [r["step"] for _, r in chain] == list(range(steps + 1))
            inputs0, _ = vectorlib.read_test_vectors(chain[0][0])
            assert inputs0["past_key_values.0.key"].shape == (1, 1, 0, 16)
            prompt_ids = inputs0["input_ids"][0]
            assert len(prompt_ids) == GEN["prompt_tokens"]
            tokens: list[int] = []
            previous: dict[str, np.ndarray] = {}
            for k, (set_dir, record) in enumerate(chain):
                inputs, outputs = vectorlib.read_test_vectors(set_dir)
                assert list(inputs) == [i.name for i in session.get_inputs()]
                assert list(outputs) == [o.name for o in session.get_outputs()]
                # each set runs alone and gives its stored outputs (the ORT session verify used: same bits)
                got = dict(zip(outputs, session.run(None, inputs)))
                for name in outputs:
                    np.testing.assert_allclose(got[name], outputs[name], rtol=1e-5, atol=1e-6)
                assert record["next_token"] == int(np.argmax(outputs["logits"][0, -1]))
                assert record["past_length"] == (0 if k == 0 else len(prompt_ids) + k - 1)
                if k:
                    assert inputs["input_ids"].tolist() == [[tokens[-1]]]
                    np.testing.assert_array_equal(inputs["past_key_values.0.key"], previous["present.0.key"])
                tokens.append(record["next_token"])
                previous = outputs
            # the chain is zoo's greedy continuation of the prompt
            greedy = textgen.Decoder(session).greedy(prompt_ids, steps + 1, eos=[]).run().tokens
            assert tokens == greedy
    # onnx's reference evaluator reproduces the fp32 build's vectors; the int4 build is onnxruntime-only
    fp32_sets = vectorlib.find_sets(out["vectors"] / "cpu-fp32")
    check = reference_run.check_vectors(decoders["fp32"], fp32_sets, quantized=False)
    assert check.passed and check.sets == len(fp32_sets), check.detail
    int4 = portability.assess(decoders["int4"], vectorlib.find_sets(out["vectors"] / "cpu-int4"), scratch=tmp_path)
    assert not int4.portable and int4.nonstandard_domains == ("com.microsoft",)


def test_decoder_step_records_are_versioned_and_plain_readers_ignore_them(tmp_path, decoders):
    session = ort.InferenceSession(str(decoders["fp32"]))
    written = vectorlib.write_decoder_vectors(tmp_path, textgen.Decoder(session), np.array([[3, 1, 4]]), 1)
    assert [p.name for p in written] == ["test_data_set_0", "test_data_set_1"]
    assert vectorlib.decoder_step(written[1]) == {"prompt": 0, "step": 1, "past_length": 3,
                                                  "next_token": vectorlib.decoder_step(written[1])["next_token"]}
    inputs, _ = vectorlib.read_test_vectors(written[0])  # a plain reader gets the arrays
    assert inputs["input_ids"].tolist() == [[3, 1, 4]]
    # a newer record is refused with its version, not misread
    f = written[0] / "input_0.pb"
    proto = onnx.TensorProto.FromString(f.read_bytes())
    record = json.loads(proto.doc_string)
    proto.doc_string = json.dumps({**record, "schema_version": 2})
    f.write_bytes(proto.SerializeToString())
    with pytest.raises(InvalidInput, match="schema_version 2; this zoo reads 1"):
        vectorlib.decoder_step(written[0])
    proto.doc_string = json.dumps({**record, "next_token": "x"})
    f.write_bytes(proto.SerializeToString())
    with pytest.raises(InvalidInput, match="next_token"):
        vectorlib.decoder_step(written[0])
    # a set of another model has no record
    plain = vectorlib.write_test_vectors(tmp_path / "plain", {"x": np.zeros(2, np.float32)}, {})
    assert vectorlib.decoder_step(plain) is None


def test_the_same_run_writes_the_same_report_and_vectors(tmp_path, decoders):
    one, _, out1 = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"}, name="one")
    two, _, out2 = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"}, name="two")
    assert out1["report"].read_bytes() == out2["report"].read_bytes()
    files = sorted(p.relative_to(out1["vectors"]) for p in out1["vectors"].rglob("*.pb"))
    assert files and files == sorted(p.relative_to(out2["vectors"]) for p in out2["vectors"].rglob("*.pb"))
    assert all((out1["vectors"] / f).read_bytes() == (out2["vectors"] / f).read_bytes() for f in files)


# -- a recipe ----------------------------------------------------------------------------------




@pytest.mark.slow
def test_a_recipe_imports_decoders_verifies_gates_and_refuses_to_deploy_them_without_genai_files(tmp_path, decoders):
    """The decoders come in as ONNX files (export's `onnx: {path}`), the corpus as an npz of input_ids."""
    models = tmp_path / "models"
    models.mkdir()
    for name in ("fp32", "int4"):
        shutil.copy(decoders[name], models / f"dec-{name}.onnx")
    shutil.copy(decoders["base"] / "tokens.npz", tmp_path / "tokens.npz")
    digest = {n: hashlib.sha256((models / f"dec-{n}.onnx").read_bytes()).hexdigest() for n in ("fp32", "int4")}
    (tmp_path / "gen.yaml").write_text(f"""\
schema_version: 1
name: tiny-gen
version: 0.1.0
description: imported decoders
license: MIT
task: text-generation
data: {{source: npz, path: tokens.npz, label: null}}
stages:
  export:
    config: {{onnx: {{path: models/dec-fp32.onnx, sha256: {digest['fp32']}}}}}
  export-int4:
    kind: export
    config: {{onnx: {{path: models/dec-int4.onnx, sha256: {digest['int4']}}}}}
  verify:
    needs: [export, export-int4]
    config:
      builds: {{cpu-fp32: export, cpu-int4: export-int4}}
      latency: {{warmup: 1, runs: 3}}
      generation: {{prompts: 4, prompt_tokens: 8, new_tokens: 6}}
      gates:
        - cpu-int4.perplexity_increase <= 0.5
        - cpu-int4.throughput_tokens_per_s > 0
  deploy:
    needs: [export, export-int4, verify]
    config:
      builds:
        cpu-fp32: {{from: export}}
        cpu-int4: {{from: export-int4}}
        cpu-fp16: {{from: export, convert: fp16}}
""")
    assert zoo("validate", "gen.yaml", cwd=tmp_path).code == 0
    bad = (tmp_path / "gen.yaml").read_text().replace("perplexity_increase", "perplexity_incrase")
    (tmp_path / "bad.yaml").write_text(bad)
    refused = zoo("validate", "bad.yaml", cwd=tmp_path)
    assert refused.code == 2 and "did you mean 'perplexity_increase'" in refused.text
    # without its deploy stage first (the same stages, so the full recipe below finds them cached)
    (tmp_path / "verify.yaml").write_text((tmp_path / "gen.yaml").read_text().split("  deploy:")[0])
    shown = zoo("run", "verify.yaml", cwd=tmp_path)
    assert shown.code == 0, shown.text
    assert "generation (verify)" in shown.out and "greedy agreement" in shown.out and "tokens/s" in shown.out
    done = zoo("run", "verify.yaml", "--json", cwd=tmp_path)  # cached: the metrics as recorded
    assert done.code == 0, done.text
    stages = {s["id"]: s for s in json.loads(done.out)["stages"]}
    builds = stages["verify"]["metrics"]["builds"]
    assert builds["cpu-int4"]["perplexity_increase"] <= 0.5
    assert 0 <= builds["cpu-int4"]["greedy_agreement"] <= 1
    assert not [k for b in builds.values() for k in b if k in CLASSIFIER_ONLY]
    # an ONNX file imported as it is brings no genai_config.json or tokenizer: deploy refuses to
    # publish a generative build nobody could run with onnxruntime-genai or `zoo generate`
    deployed = zoo("run", "gen.yaml", cwd=tmp_path)
    assert deployed.code == 2 and "no stage deploy needs gives its genai_config.json" in deployed.text


# -- onnxruntime-genai's builds of a tiny Llama (slow: the builder runs twice) -----------------


@pytest.fixture(scope="module")
def genai_builds(tmp_path_factory):
    """A random tiny Llama (tests/decoder_models.py), its fp32 and int4 builds by onnxruntime-genai's
    builder, and held-out blocks of the pydoc text in its own tokenizer's ids."""
    import decoder_models as dm
    from tokenizers import Tokenizer

    base = tmp_path_factory.mktemp("genai")
    hf = dm.tiny_llama_folder(base / "hf")
    builds = {p: dm.genai_build(hf, base / p, precision=p) / "model.onnx" for p in ("fp32", "int4")}
    ids = Tokenizer.from_file(str(hf / "tokenizer.json")).encode(dm.pydoc_text()[:20_000]).ids
    blocks = np.asarray(ids[:40 * 32], dtype=np.int64).reshape(40, 32)
    np.savez(base / "tokens.npz", input_ids=blocks)
    return {"base": base, "hf": hf, **builds}


@pytest.mark.slow
def test_onnxruntime_genai_builds_are_measured_and_their_checker_verdict_gates_them(tmp_path, genai_builds):
    """The builder's models keep their head size in genai_config.json only (symbolic in the graph),
    and use GroupQueryAttention and MatMulNBits; their SimplifiedLayerNormalization sits in the ONNX
    domain, which onnx.checker refuses, so verify measures everything and then fails their implicit
    `checker == 1` gates."""
    import torch
    from transformers import LlamaForCausalLM

    shutil.copy(genai_builds["base"] / "tokens.npz", tmp_path / "tokens.npz")
    with pytest.raises(GateFailed, match="checker == 1"):
        verify(tmp_path, genai_builds, {"cpu-fp32": "fp32", "cpu-int4": "int4"}, vectors={"count": 1, "seed": 0})
    report = json.loads((tmp_path / "run" / "out" / "report.json").read_text())
    fp32, int4 = report["builds"]["cpu-fp32"], report["builds"]["cpu-int4"]
    assert fp32["checker"] == 0 and "SimplifiedLayerNormalization" in fp32["checker_error"]
    # the fp32 build's perplexity is transformers' own on the same blocks
    blocks = torch.from_numpy(np.array(val_blocks(tmp_path)))  # a writable copy of the read-only split
    model = LlamaForCausalLM.from_pretrained(str(genai_builds["hf"])).eval()
    with torch.no_grad():
        loss = model(input_ids=blocks, labels=blocks).loss.item()
    assert fp32["perplexity"] == pytest.approx(math.exp(loss), rel=1e-4)
    assert math.isfinite(int4["perplexity_increase"]) and 0 <= int4["greedy_agreement"] <= 1
    assert int4["custom_domains"] == ["com.microsoft"]
    sets = vectorlib.find_sets(tmp_path / "run" / "out" / "vectors" / "cpu-int4")
    assert [vectorlib.decoder_step(s)["step"] for s in sets] == list(range(GEN["vector_steps"] + 1))
    inputs, _ = vectorlib.read_test_vectors(sets[0])
    assert inputs["past_key_values.0.key"].shape == (1, 2, 0, 16)  # the head size from genai_config.json


# -- verify's report rebuilt on another platform class -----------------------------------------


def test_a_rebuilt_report_is_judged_by_perplexity_with_greedy_agreement_reported(tmp_path, decoders):
    """Another CPU's int4 kernels may pick another greedy token: agreement with the reference is a
    parity figure there (reported), perplexity a quality metric (judged), its increase a ratio."""
    from zoo_stages.lib.quality import equivalence

    report, _, _ = verify(tmp_path, decoders, {"cpu-fp32": "fp32", "cpu-int4": "int4"})

    def rebuilt(name, **changes):
        doc = json.loads(json.dumps(report))
        doc["builds"]["cpu-int4"].update(changes)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc))
        return path

    locked = rebuilt("locked")
    int4 = report["builds"]["cpu-int4"]
    close = rebuilt("close", perplexity=int4["perplexity"] * 1.005, greedy_agreement=int4["greedy_agreement"] / 2,
                    greedy_matched_tokens=1.0, greedy_exact_match=0.0,
                    perplexity_increase=int4["perplexity_increase"] + 0.005)
    judged = equivalence.compare_outputs({"report": locked}, {"report": close})
    assert judged.equivalent, judged.details
    assert "parity figures reported" in " ".join(judged.details)
    far = rebuilt("far", perplexity=int4["perplexity"] * 1.1)
    assert not equivalence.compare_outputs({"report": locked}, {"report": far}).equivalent
    ratio = rebuilt("ratio", perplexity_increase=int4["perplexity_increase"] + 0.02)
    assert not equivalence.compare_outputs({"report": locked}, {"report": ratio}).equivalent


def test_perplexity_is_the_same_one_block_per_run_under_a_stand_in_logits_budget(decoders, monkeypatch):
    """A stand-in budget (`LOGITS_PER_RUN` patched to one element) makes every block its own run,
    as a large vocabulary would: the figure does not depend on how the blocks are batched."""
    decoder = textgen.Decoder(ort.InferenceSession(str(decoders["fp32"])))
    blocks = decoders["blocks"][:10]
    batched = genlib.perplexity(decoder, blocks, VOCAB)
    calls = []
    real = textgen.perplexity
    monkeypatch.setattr(genlib, "LOGITS_PER_RUN", 1)
    monkeypatch.setattr(textgen, "perplexity", lambda d, b, batch_size: calls.append(batch_size) or real(d, b, batch_size))
    assert genlib.perplexity(decoder, blocks, VOCAB) == pytest.approx(batched, rel=1e-6)
    assert calls == [1]
