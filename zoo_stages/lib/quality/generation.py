"""What verify measures of a generative build: a decoder with a KV cache in zoo's decoder I/O
convention (`zoo.decoder_io`), run by zoo's one decoding loop (`zoo.textgen`).

- `TextSet` / `text_set`: what every build is scored on — the held-out split's `input_ids` blocks
  (perplexity) and the fixed prompt set (the first P tokens of the first K held-out blocks), or
  without data seeded random token prompts (and no perplexity);
- `open_decoder`: a `textgen.Decoder` over a build's session, its head size, context length and
  end-of-sequence ids from the genai_config.json beside the model when there is one;
- `perplexity`: exp of the mean next-token negative log-likelihood, teacher-forced;
- `greedy_tokens` / `agreement`: N greedy tokens per prompt, and how many of them match the
  reference's before the first divergence (mean, and as a share of N) and the share of prompts
  whose N tokens all match;
- `prefill_outputs`: every output of the prompts' prefill, for parity with the reference.

numpy is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import FieldError, InvalidInput

if TYPE_CHECKING:
    import numpy as np

    from zoo.textgen import Decoder

# metric -> meaning: greedy continuation against the reference's on the fixed prompt set
GREEDY: dict[str, str] = {
    "greedy_matched_tokens": "mean number of greedy tokens equal to the reference's before the first one that "
                             "differs, over the fixed prompts",
    "greedy_agreement": "greedy_matched_tokens as a share of the new tokens per prompt (1.0: every prompt's "
                        "continuation equals the reference's)",
    "greedy_exact_match": "share of the fixed prompts whose new tokens all equal the reference's",
}
# metric -> meaning: timings at batch 1 (they differ on every run: metrics, never in the report)
TIMINGS: dict[str, str] = {
    "latency_p50_ms": "median time of one decode step (one new token at batch 1, after the prefill) in ms",
    "latency_p90_ms": "90th percentile time of one decode step in ms",
    "latency_prefill_ms": "median time of the prefill of a prompt of `generation.latency_prompt_tokens` tokens "
                          "at batch 1 (its first token included) in ms",
    "latency_prefill_p90_ms": "90th percentile prefill time in ms",
    "throughput_tokens_per_s": "new tokens per second at batch 1 while decoding after the prefill (median run)",
    "speedup": "reference decode-step p50 / this build's",
}
# verify config fields that live under `generation:` (for FieldError's recipe path)
CONFIG = "generation"

TEXT_FROM_DATA = "held-out input_ids blocks"
RANDOM_PROMPTS = "seeded random token prompts (no `data:`: perplexity not measured)"


@dataclass
class TextSet:
    """What every decoder build is scored on."""

    blocks: "np.ndarray | None"  # [N, L] held-out token blocks for perplexity; None without data
    prompts: "np.ndarray"  # [K, P] the fixed prompt set
    description: str
    vocab_size: int

    def __len__(self) -> int:
        return 0 if self.blocks is None else int(self.blocks.shape[0])


def config_field(stage_id: str, *names: str) -> tuple[str, ...]:
    """The recipe path of verify's `generation` (or of `generation.<name>`), which FieldError places."""
    return ("stages", stage_id, "config", CONFIG, *names)


def held_out_blocks(data: Mapping[str, Any], recipe_dir: Path) -> "np.ndarray":
    """The val split's `input_ids` [N, L] (InvalidInput when the data has none)."""
    import numpy as np

    from zoo import decoder_io
    from zoo_stages.lib.data.datasets import load_split

    split = load_split(dict(data), recipe_dir, "val")
    features = dict(split.features)
    if decoder_io.INPUT_IDS not in features:
        raise FieldError(f"task text-generation scores the data's `{decoder_io.INPUT_IDS}` token blocks; the data "
                         f"has {', '.join(features) or 'no arrays'}", field=("data",),
                         hint="give the data an int64 [N, L] array named input_ids (tokenized text in fixed-length "
                              "blocks), or drop `data:` to measure latency and agreement on random prompts")
    blocks = np.asarray(features[decoder_io.INPUT_IDS])
    if blocks.ndim != 2 or blocks.dtype.kind not in "iu":
        raise FieldError(f"the data's `{decoder_io.INPUT_IDS}` is {blocks.dtype} {list(blocks.shape)}; a generative "
                         "build's data is integer token ids [N, L]", field=("data",),
                         hint="store fixed-length blocks of token ids as an int64 [N, L] array")
    if blocks.shape[0] == 0:
        raise InvalidInput("the held-out split has no input_ids blocks", hint="raise data.val_fraction or add text")
    return blocks.astype(np.int64)


def text_set(data: Mapping[str, Any] | None, recipe_dir: Path, *, stage_id: str, prompts: int,
             prompt_tokens: int, text_blocks: int | None, vocab_size: int, seed: int) -> TextSet:
    """The held-out blocks (the first `text_blocks`, default all) and the prompt set (the first
    `prompt_tokens` tokens of the first `prompts` blocks; fewer when the split holds fewer), or
    without data `prompts` seeded random prompts of `prompt_tokens` ids below `vocab_size`."""
    import numpy as np

    if not data:
        rng = np.random.default_rng(seed)
        return TextSet(None, rng.integers(0, vocab_size, size=(prompts, prompt_tokens), dtype=np.int64),
                       RANDOM_PROMPTS, vocab_size)
    blocks = held_out_blocks(data, recipe_dir)
    length = blocks.shape[1]
    if prompt_tokens > length:
        raise FieldError(f"generation.prompt_tokens is {prompt_tokens}, and the held-out blocks hold {length} tokens",
                         field=config_field(stage_id, "prompt_tokens"),
                         hint=f"prompts are the first tokens of held-out blocks: ask for at most {length}")
    if length < 2:
        raise FieldError(f"the held-out input_ids blocks hold {length} token; perplexity needs at least 2 per block",
                         field=("data",), hint="store longer blocks of token ids")
    high = int(blocks.max(initial=0))
    if high >= vocab_size or int(blocks.min(initial=0)) < 0:
        raise FieldError(f"the data's input_ids hold token id {high if high >= vocab_size else int(blocks.min())}, "
                         f"outside the model's vocabulary of {vocab_size}", field=("data",),
                         hint="tokenize the text with the model's own tokenizer")
    scored = blocks if text_blocks is None else blocks[:text_blocks]
    return TextSet(scored, np.ascontiguousarray(blocks[:prompts, :prompt_tokens]), TEXT_FROM_DATA, vocab_size)


def genai_folder(model_path: Path, *candidates: "Path | None") -> Path | None:
    """The first folder holding a genai_config.json: the model's own folder, then `candidates`
    (an upstream stage's `genai` output: export writes one for a generative build, and its
    quantized builds share its geometry); None when none does."""
    from zoo import textgen

    for folder in (Path(model_path).parent, *candidates):
        if folder is not None and (Path(folder) / textgen.GENAI_CONFIG).is_file():
            return Path(folder)
    return None


def open_decoder(session: Any, model_path: Path, build: str, genai: Path | None = None) -> "Decoder":
    """A `textgen.Decoder` over `session` (the build at `model_path`): head size, context length and
    end-of-sequence ids from the genai_config.json in `genai` (default: beside the model) when
    there is one (its cache inputs may leave the head size symbolic, as onnxruntime-genai's builder
    does)."""
    from zoo import textgen

    folder = genai if genai is not None else genai_folder(model_path)
    settings = textgen.read_genai_config(folder) if folder is not None else None
    try:
        if settings is None:
            return textgen.Decoder(session)
        return textgen.Decoder(session, settings.head_size, settings.context_length, settings.eos_token_ids)
    except InvalidInput as e:
        raise InvalidInput(f"build {build!r}: {e.message}",
                           hint=e.hint or "a generative build ships genai_config.json beside its model.onnx") from None


def is_decoder_file(path: Path) -> bool:
    """Whether the ONNX file at `path` takes a decoder's inputs (read at the wire level: no weights)."""
    from zoo import decoder_io
    from zoo_stages.lib.onnx.ports import read_ports

    try:
        return decoder_io.is_decoder([p.name for p in read_ports(Path(path)).inputs])
    except (OSError, ValueError):
        return False


def vocab_size(decoder: "Decoder") -> int:
    """The size of the logits' last dimension: declared, or seen on a one-token prefill."""
    from zoo import decoder_io

    declared = next((p.shape[-1] for p in decoder.outputs if p.name == decoder_io.LOGITS and p.shape), None)
    if isinstance(declared, int) and declared > 0:
        return declared
    logits, _ = decoder.prefill([[0]])
    return int(logits.shape[-1])


# logits scored per run (rows x length x vocabulary): the log-softmax is float64, so about 32 MiB
LOGITS_PER_RUN = 1 << 22


def perplexity(decoder: "Decoder", blocks: "np.ndarray", vocab_size: int) -> float:
    """exp of the mean negative log-likelihood of each next token of `blocks` [N, L], teacher-forced,
    up to 8 blocks per run while their logits stay within `LOGITS_PER_RUN` (a large vocabulary and
    long blocks: one at a time)."""
    from zoo import textgen

    rows = max(1, min(8, LOGITS_PER_RUN // max(1, int(blocks.shape[1]) * vocab_size)))
    return float(textgen.perplexity(decoder, blocks, batch_size=rows))


def greedy_tokens(decoder: "Decoder", prompts: "np.ndarray", new_tokens: int) -> "np.ndarray":
    """[K, new_tokens] greedy continuations of the prompts [K, P] (no end-of-sequence stop: every
    prompt gets all its tokens, so builds compare position by position)."""
    import numpy as np

    return np.asarray(decoder.greedy(prompts, new_tokens, eos=[]).run().tokens, dtype=np.int64)


def agreement(reference: "np.ndarray", tokens: "np.ndarray") -> dict[str, float]:
    """`GREEDY`'s metrics of `tokens` [K, N] against the reference's [K, N]."""
    import numpy as np

    ref, got = np.asarray(reference), np.asarray(tokens)
    if ref.shape != got.shape or ref.ndim != 2 or ref.shape[1] == 0:
        raise ValueError(f"greedy continuations of shapes {ref.shape} and {got.shape} cannot be compared")
    differs = ref != got
    # tokens before the first difference: the index of the first True, or N when there is none
    matched = np.where(differs.any(axis=1), differs.argmax(axis=1), ref.shape[1])
    return {"greedy_matched_tokens": float(matched.mean()),
            "greedy_agreement": float(matched.mean() / ref.shape[1]),
            "greedy_exact_match": float((matched == ref.shape[1]).mean())}


def prefill_outputs(decoder: "Decoder", prompts: "np.ndarray") -> dict[str, "np.ndarray"]:
    """Every output of one prefill over the prompts [K, P] (logits and present key/values)."""
    from zoo import decoder_io
    from zoo_stages.lib.runtimes import onnx_run

    feeds = decoder_io.prefill_feeds(decoder.inputs, prompts, decoder.head_size)
    values = onnx_run.run_once(decoder.session, feeds)
    return dict(zip(decoder.output_names, values))
