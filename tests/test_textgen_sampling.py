"""The torch-free parts of zoo/textgen.py: the distribution sampling draws from (temperature, top-k,
top-p), the seeded draw, the numerically stable log-softmax, genai_config.json read and checked,
and the refusals. The decoder itself is tested against transformers in tests/test_textgen.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from zoo.errors import InvalidInput
from zoo.textgen import Decoder, Sampling, _draw, log_softmax, read_genai_config, sample_probabilities

LOGITS = np.log(np.array([0.1, 0.5, 0.2, 0.15, 0.05]))


def test_temperature_divides_the_logits():
    probs = sample_probabilities(LOGITS, Sampling(temperature=2.0))
    expected = np.exp(LOGITS / 2) / np.exp(LOGITS / 2).sum()
    np.testing.assert_allclose(probs, expected, rtol=1e-12)


def test_top_k_keeps_the_k_most_likely_renormalised():
    probs = sample_probabilities(LOGITS, Sampling(top_k=2))
    np.testing.assert_allclose(probs, [0, 0.5 / 0.7, 0.2 / 0.7, 0, 0], rtol=1e-12)


@pytest.mark.parametrize("top_p, kept", [(0.4, [1]), (0.5, [1]), (0.6, [1, 2]), (0.8, [1, 2, 3]), (0.9, [1, 2, 3, 0]),
                                         (1.0, [1, 2, 3, 0, 4])])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, kept):
    probs = sample_probabilities(LOGITS, Sampling(top_p=top_p))
    assert sorted(np.flatnonzero(probs).tolist()) == sorted(kept)
    assert probs.sum() == pytest.approx(1.0)


def test_top_k_and_top_p_together_take_the_smaller_set():
    assert np.flatnonzero(sample_probabilities(LOGITS, Sampling(top_k=2, top_p=0.9))).tolist() == [1, 2]


def test_ties_are_cut_in_token_order():
    probs = sample_probabilities(np.zeros(4), Sampling(top_k=2))
    assert probs.tolist() == [0.5, 0.5, 0.0, 0.0]


def test_the_seeded_draw_follows_the_distribution_and_repeats():
    probs = np.array([0.1, 0.6, 0.3])
    draws = [_draw(probs, rng) for rng in [np.random.default_rng(5)] for _ in range(20000)]
    freq = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(freq, probs, atol=0.015)
    again = [_draw(probs, rng) for rng in [np.random.default_rng(5)] for _ in range(20000)]
    assert draws == again
    assert _draw(np.array([0.0, 1.0, 0.0]), np.random.default_rng(0)) == 1


def test_log_softmax_is_stable_for_huge_logits():
    out = log_softmax(np.array([[1e4, 1e4 - 1.0, -1e4]], dtype=np.float32))
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(np.exp(out).sum(), 1.0)
    assert out[0, 0] - out[0, 1] == pytest.approx(1.0)


@pytest.mark.parametrize("bad, match", [(dict(temperature=0), "temperature"), (dict(temperature=float("nan")), "temperature"),
                                        (dict(top_k=0), "top_k"), (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"),
                                        (dict(seed=-1), "seed")])
def test_bad_sampling_settings_are_refused(bad, match):
    with pytest.raises(InvalidInput, match=match):
        Sampling(**bad)


def _config(tmp_path, **decoder):
    doc = {"model": {"context_length": 128, "eos_token_id": [2, 3], "vocab_size": 100,
                     "decoder": {"head_size": 8, "filename": "model.onnx", **decoder}}}
    (tmp_path / "genai_config.json").write_text(json.dumps(doc))
    return tmp_path


def test_genai_config_read(tmp_path):
    settings = read_genai_config(_config(tmp_path))
    assert (settings.head_size, settings.context_length, settings.eos_token_ids, settings.filename) == \
        (8, 128, (2, 3), "model.onnx")


@pytest.mark.parametrize("decoder, match", [(dict(head_size=0), "head_size"), (dict(head_size="8"), "head_size"),
                                            (dict(filename=3), "filename")])
def test_a_bad_genai_config_field_is_named(tmp_path, decoder, match):
    with pytest.raises(InvalidInput, match=f"genai_config.json: model.decoder.{match}"):
        read_genai_config(_config(tmp_path, **decoder))


def test_a_genai_config_without_head_size_is_named(tmp_path):
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {}}}))
    with pytest.raises(InvalidInput, match="no field model.decoder.head_size"):
        read_genai_config(tmp_path)


def test_a_missing_huge_or_linked_genai_config_is_refused(tmp_path):
    with pytest.raises(InvalidInput, match="does not exist"):
        read_genai_config(tmp_path)
    (tmp_path / "genai_config.json").write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(InvalidInput, match="larger than"):
        read_genai_config(tmp_path)
    (tmp_path / "genai_config.json").write_text("{")
    with pytest.raises(InvalidInput, match="not JSON"):
        read_genai_config(tmp_path)
    (tmp_path / "real").mkdir()
    real = _config(tmp_path / "real") / "genai_config.json"
    link = tmp_path / "link"
    link.mkdir()
    (link / "genai_config.json").symlink_to(real)
    with pytest.raises(InvalidInput, match="cannot be read"):
        read_genai_config(link)


def _stand_in_session(inputs, outputs=("logits",)):
    port = lambda name, shape=("b", 2, "p", 4), type_="tensor(float)": SimpleNamespace(name=name, shape=shape, type=type_)
    return SimpleNamespace(get_inputs=lambda: [port(n) for n in inputs], get_outputs=lambda: [port(n) for n in outputs])


def test_a_model_without_a_kv_cache_is_refused_stand_in_session():
    """A stand-in session (its ports only): an encoder's inputs are no decoder's."""
    with pytest.raises(InvalidInput, match="not a decoder with a KV cache"):
        Decoder(_stand_in_session(["input_ids", "attention_mask"]))


def test_a_decoder_without_logits_is_refused_stand_in_session():
    with pytest.raises(InvalidInput, match="no output 'logits'"):
        Decoder(_stand_in_session(["input_ids", "past_key_values.0.key"], outputs=["present.0.key"]))


def test_a_prompt_must_be_token_ids_stand_in_session():
    decoder = Decoder(_stand_in_session(["input_ids", "past_key_values.0.key"], ["logits", "present.0.key"]))
    with pytest.raises(InvalidInput, match="non-empty sequence"):
        decoder.greedy([], 3)
    with pytest.raises(InvalidInput, match="max_new_tokens"):
        decoder.greedy([1, 2], -1)
