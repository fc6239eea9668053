"""zoo/textgen.py against transformers on a real decoder: a tiny random Llama (tests/decoder_models.py)
exported by onnxruntime-genai's model builder (fp32, zoo's decoder I/O convention), run through
onnxruntime with its KV cache. Greedy continuations are transformers' own ``generate``'s tokens,
token log-probabilities are torch's within float32 noise, seeded sampling repeats itself and keeps
to top-k/top-p, EOS stops, a batch of equal-length prompts gives each row's batch-1 tokens.

The torch-free parts (the sampler's distribution, genai_config.json, refusals) are in
tests/test_textgen_sampling.py."""

from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformers' generate is the reference (torch extra)")

from decoder_models import genai_build, tiny_llama_folder  # noqa: E402
from zoo.errors import InvalidInput  # noqa: E402
from zoo.textgen import Decoder, perplexity, read_genai_config  # noqa: E402

PROMPTS = ["The function returns", "A class definition", "import"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(the Hugging Face folder, the builder's fp32 ONNX folder, transformers' model, its tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("llama")
    hf = tiny_llama_folder(base / "hf")
    build = genai_build(hf, base / "fp32")
    model = AutoModelForCausalLM.from_pretrained(str(hf)).eval()
    return hf, build, model, AutoTokenizer.from_pretrained(str(hf))


@pytest.fixture(scope="module")
def decoder(llama):
    import onnxruntime as ort

    _, build, _, _ = llama
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(build / "model.onnx"), options, providers=["CPUExecutionProvider"])
    return Decoder.from_folder(session, build)


def _ids(llama, text):
    return llama[3](text)["input_ids"]


def _hf_greedy(model, ids, new, eos=None):
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=eos,
                         pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def _hf_log_probs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits.double()
    logp = torch.log_softmax(logits, dim=-1)[0, :-1]
    return logp.gather(-1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_gives_transformers_generate_tokens(llama, decoder, prompt):
    ids = _ids(llama, prompt)
    ours = decoder.greedy(ids, 30, eos=[]).run()
    reference = _hf_greedy(llama[2], ids, 30)
    assert len(set(reference)) > 3, "a continuation of one repeated token would prove little"
    assert ours.tokens == reference
    assert ours.decode_steps == 29 and not ours.stopped_by_eos


def test_the_settings_come_from_the_builds_genai_config(llama, decoder):
    settings = read_genai_config(llama[1])
    assert settings.head_size == 16 and settings.context_length == 256 and settings.eos_token_ids == (0,)
    assert decoder.head_size == 16 and decoder.num_layers == 2 and decoder.eos_token_ids == (0,)


def test_generation_streams_token_by_token_with_its_timings(llama, decoder):
    generation = decoder.greedy(_ids(llama, PROMPTS[0]), 8, eos=[])
    stream = iter(generation)
    first = next(stream)
    assert isinstance(first, int) and generation.tokens == [first] and generation.decode_steps == 0
    assert generation.prefill_s > 0 and generation.decode_tokens_per_s is None
    rest = list(stream)
    assert generation.tokens == [first, *rest] and len(rest) == 7
    assert generation.decode_steps == 7 and generation.decode_s > 0 and generation.decode_tokens_per_s > 0
    assert list(generation) == []  # over: iterating again yields nothing new


def test_eos_stops_where_transformers_stops(llama, decoder):
    ids = _ids(llama, PROMPTS[1])
    free = decoder.greedy(ids, 30, eos=[]).run().tokens
    # an id the continuation first produces at its 7th token, taken as the end of sequence
    k = next(i for i in range(6, 30) if free[i] not in free[:i])
    stopped = decoder.greedy(ids, 30, eos=free[k]).run()
    assert stopped.tokens == free[:k + 1] and stopped.stopped_by_eos
    assert stopped.tokens == _hf_greedy(llama[2], ids, 30, eos=free[k])


def test_the_decoders_own_eos_applies_when_none_is_given(llama, decoder):
    """genai_config's eos_token_id is the decoder's default end; here a decoder on the same session
    told another id (the one the continuation reaches at its 5th token) stops there by itself."""
    ids = _ids(llama, PROMPTS[2])
    free = decoder.greedy(ids, 20, eos=[]).run().tokens
    k = next(i for i in range(4, 20) if free[i] not in free[:i])
    told = Decoder(decoder.session, head_size=16, eos_token_ids=[free[k]])
    assert told.greedy(ids, 20).run().tokens == free[:k + 1]


def test_token_log_probs_are_torchs(llama, decoder):
    ids = _ids(llama, PROMPTS[0])
    block = ids + _hf_greedy(llama[2], ids, 20)
    ours = decoder.token_log_probs(block)
    reference = _hf_log_probs(llama[2], block)
    assert ours.shape == (len(block) - 1,) and ours.dtype == np.float64
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)
    assert np.all(ours < 0)


def test_perplexity_is_the_exp_of_the_mean_negative_log_likelihood(llama, decoder):
    blocks = np.array([_ids(llama, "The function returns the value of the argument")[:8],
                       _ids(llama, "A class definition is an executable statement")[:8]])
    reference = np.concatenate([_hf_log_probs(llama[2], row.tolist()) for row in blocks])
    expected = float(np.exp(-reference.mean()))
    assert perplexity(decoder, blocks) == pytest.approx(expected, rel=1e-5)
    assert perplexity(decoder, blocks, batch_size=2) == pytest.approx(expected, rel=1e-5)
    assert decoder.token_log_probs(blocks).shape == (2, 7)


def test_a_batch_of_equal_length_prompts_gives_each_rows_tokens(llama, decoder):
    a = _ids(llama, "The function returns the")
    b = _ids(llama, "A class definition is an")
    n = min(len(a), len(b))
    prompts = np.array([a[:n], b[:n]])
    batch = decoder.greedy(prompts, 12, eos=[]).run()
    assert batch.tokens.shape == (2, 12)
    for row, prompt in zip(batch.tokens, prompts):
        assert row.tolist() == decoder.greedy(prompt.tolist(), 12, eos=[]).run().tokens


def test_a_batch_row_that_ended_repeats_the_pad(llama, decoder):
    a = _ids(llama, "The function returns the")
    b = _ids(llama, "A class definition is an")
    n = min(len(a), len(b))
    free = decoder.greedy(a[:n], 10, eos=[]).run().tokens
    other = decoder.greedy(b[:n], 10, eos=[]).run().tokens
    k = next(i for i in range(2, 10) if free[i] not in free[:i] and free[i] not in other)
    batch = decoder.greedy(np.array([a[:n], b[:n]]), 10, eos=free[k], pad=7).run()
    assert batch.tokens[0].tolist() == free[:k + 1] + [7] * (9 - k)
    assert batch.tokens[1].tolist() == other and not batch.stopped_by_eos


def test_seeded_sampling_repeats_itself_and_seeds_differ(llama, decoder):
    ids = _ids(llama, PROMPTS[0])
    first = decoder.sample(ids, 20, seed=3, eos=[]).run().tokens
    again = decoder.sample(ids, 20, seed=3, eos=[]).run().tokens
    other = decoder.sample(ids, 20, seed=4, eos=[]).run().tokens
    assert first == again and first != other
    assert first != decoder.greedy(ids, 20, eos=[]).run().tokens


def test_top_k_1_and_a_tiny_top_p_are_greedy(llama, decoder):
    ids = _ids(llama, PROMPTS[1])
    greedy = decoder.greedy(ids, 15, eos=[]).run().tokens
    assert decoder.sample(ids, 15, top_k=1, seed=9, eos=[]).run().tokens == greedy
    assert decoder.sample(ids, 15, top_p=1e-6, temperature=2.0, seed=9, eos=[]).run().tokens == greedy


def test_top_k_sampling_keeps_to_the_k_most_likely_tokens(llama, decoder):
    ids = _ids(llama, PROMPTS[2])
    sampled = decoder.sample(ids, 25, top_k=3, temperature=5.0, seed=1, eos=[]).run().tokens
    logits = decoder.logits(ids + sampled)[0, len(ids) - 1:-1]
    ranks = [int((row > row[t]).sum()) for row, t in zip(logits, sampled)]
    assert max(ranks) < 3 and max(ranks) > 0  # a high temperature reaches past the first


def test_a_prompt_and_continuation_past_the_context_length_are_refused(llama, decoder):
    with pytest.raises(InvalidInput, match="context length of 256") as e:
        decoder.greedy(_ids(llama, PROMPTS[0]), 300)
    assert "at most" in e.value.hint
