"""Text generation with a decoder ONNX model and its KV cache: greedy and seeded sampling,
streamed token by token, and the log-probabilities of a teacher-forced sequence.

One loop for every part of zoo that generates or scores text (verify's generation metrics,
quantize's quality check, test vectors, ``zoo generate``), over the decoder I/O convention of
`zoo.decoder_io` (onnxruntime-genai's). A `Decoder` wraps an onnxruntime session, or anything with
its interface (``run``, ``get_inputs``, ``get_outputs``): a prompt's prefill is one run over all
of its tokens with an empty cache, each further token one run over that token with the previous
run's ``present.*`` as ``past_key_values.*``.

- `Decoder.greedy` / `Decoder.sample` return a `Generation`: iterate it to get the tokens as they
  come (streaming); once it is over, ``tokens`` holds them and ``prefill_s``, ``decode_s`` and
  ``decode_tokens_per_s`` the timings (of the model's runs and the choice of each token, never of
  what the caller does between tokens). Sampling draws from a numpy ``Generator`` seeded with
  `seed`, so a seed gives the same tokens on every run.
- `Decoder.token_log_probs`: log p(token t+1 | tokens ≤ t) of a block, from one prefill over the
  whole block (log-softmax in float64, shifted by the row's maximum); `perplexity` of blocks.
- `GenaiSettings` / `read_genai_config`: what the loop needs from a build's genai_config.json
  (head size, context length, the end-of-sequence ids), read within a size bound.

A prompt is a 1-D sequence of token ids (batch 1: each step yields an ``int``) or a 2-D array of
prompts of equal length (batch > 1: each step yields an int64 array, one token per row; a row
that has ended repeats `pad`, the end-of-sequence id by default). numpy and onnxruntime only,
imported inside functions: importing this module is cheap.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from zoo import decoder_io
from zoo.errors import InvalidInput

GENAI_CONFIG = "genai_config.json"
GENAI_CONFIG_MAX_BYTES = 1 << 20  # a genai_config.json is a few KiB; a bigger file is not one


@dataclass(frozen=True)
class GenaiSettings:
    """What generation reads of a build's genai_config.json: the decoder's file name, its head size
    (the cache inputs leave it symbolic), its context length and the end-of-sequence ids."""

    filename: str
    head_size: int
    context_length: int | None
    eos_token_ids: tuple[int, ...]
    vocab_size: int | None


def _read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of regular file `path` (never a link or a device), at most `limit` of them."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist",
                           hint="a generative build ships genai_config.json beside its model.onnx") from None
    except OSError as e:
        raise InvalidInput(f"{path} cannot be read: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InvalidInput(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InvalidInput(f"{path} is larger than {limit} bytes: not a genai_config.json")
    return data


def read_genai_config(path: Path) -> GenaiSettings:
    """`GenaiSettings` from genai_config.json at `path` (a file, or the folder that holds it)."""
    path = Path(path)
    if path.is_dir():
        path = path / GENAI_CONFIG
    try:
        doc = json.loads(_read_bounded(path, GENAI_CONFIG_MAX_BYTES))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInput(f"{path} is not JSON: {e}") from None

    def field(where: Any, name: str, dotted: str) -> Any:
        if not isinstance(where, dict) or name not in where:
            raise InvalidInput(f"{path}: no field {dotted}", hint="onnxruntime-genai's builder writes it")
        return where[name]

    model = field(doc, "model", "model")
    decoder = field(model, "decoder", "model.decoder")
    head_size = field(decoder, "head_size", "model.decoder.head_size")
    if not _is_int(head_size) or head_size < 1:
        raise InvalidInput(f"{path}: model.decoder.head_size is {head_size!r}; expected a positive integer")
    filename = decoder.get("filename", "model.onnx")
    if not isinstance(filename, str) or not filename:
        raise InvalidInput(f"{path}: model.decoder.filename is {filename!r}; expected a file name")
    context = model.get("context_length")
    if context is not None and (not _is_int(context) or context < 1):
        raise InvalidInput(f"{path}: model.context_length is {context!r}; expected a positive integer")
    eos = model.get("eos_token_id", [])
    eos_ids = [eos] if _is_int(eos) else eos
    if not isinstance(eos_ids, list) or not all(_is_int(i) and i >= 0 for i in eos_ids):
        raise InvalidInput(f"{path}: model.eos_token_id is {eos!r}; expected a token id or a list of them")
    vocab = model.get("vocab_size")
    if vocab is not None and (not _is_int(vocab) or vocab < 1):
        raise InvalidInput(f"{path}: model.vocab_size is {vocab!r}; expected a positive integer")
    return GenaiSettings(filename, head_size, context, tuple(eos_ids), vocab)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Sampling:
    """How `Decoder.sample` picks a token: the logits divided by `temperature`, then only the
    `top_k` most likely tokens (None: all), then only the smallest set of the most likely whose
    probabilities add up to `top_p` (1.0: all; the most likely token always stays), drawn with a
    numpy Generator seeded with `seed`."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature > 0):
            raise InvalidInput(f"temperature must be a positive number (got {self.temperature!r})",
                               hint="greedy decoding is the choice of the most likely token: use it instead of "
                                    "temperature 0")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise InvalidInput(f"top_k must be a positive integer (got {self.top_k!r})")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise InvalidInput(f"top_p must be in (0, 1] (got {self.top_p!r})")
        if not _is_int(self.seed) or self.seed < 0:
            raise InvalidInput(f"seed must be a non-negative integer (got {self.seed!r})")


def log_softmax(logits: Any) -> Any:
    """log softmax over the last axis in float64, shifted by each row's maximum (no overflow)."""
    import numpy as np

    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def sample_probabilities(logits: Any, sampling: Sampling) -> Any:
    """The distribution `sampling` draws from, for one row of logits (float64, sums to 1; tokens
    that top_k or top_p leave out have probability 0)."""
    import numpy as np

    scaled = np.asarray(logits, dtype=np.float64) / sampling.temperature
    # most likely first; ties kept in token order, so the cut is the same on every run
    order = np.argsort(-scaled, kind="stable")
    keep = len(order) if sampling.top_k is None else min(sampling.top_k, len(order))
    if sampling.top_p < 1.0:
        top = scaled[order[:keep]]
        p = np.exp(top - top[0])
        cumulative = np.cumsum(p / p.sum())
        # the smallest prefix whose mass reaches top_p (at least the most likely token)
        keep = min(keep, int(np.searchsorted(cumulative, sampling.top_p, side="left")) + 1)
    kept = order[:keep]
    probs = np.zeros_like(scaled)
    top = scaled[kept]
    e = np.exp(top - top.max())
    probs[kept] = e / e.sum()
    return probs


def _draw(probs: Any, rng: Any) -> int:
    """One token from `probs` with one uniform draw of `rng` (inverse CDF: the same draw, the same
    token, whatever numpy's choice() does between versions)."""
    import numpy as np

    cumulative = np.cumsum(probs)
    u = rng.random() * cumulative[-1]
    return int(min(np.searchsorted(cumulative, u, side="right"), len(probs) - 1))


class Generation:
    """A continuation being generated: iterate it for the tokens as they come (an ``int`` per step
    for a 1-D prompt, an int64 array of one token per row for a batch). Generation stops after
    `max_new_tokens`, or once every row has produced an end-of-sequence id (which is yielded and
    kept, as transformers' ``generate`` does). Iterating again yields nothing new.

    After (or during) iteration: ``tokens`` (list of ints, or an int64 array [batch, n]),
    ``prefill_s`` (seconds of the prompt's run and its first token), ``decode_s`` and
    ``decode_steps`` (the runs over one new token each), ``decode_tokens_per_s``, ``stopped_by_eos``.
    """

    def __init__(self, decoder: "Decoder", prompt: Any, max_new_tokens: int, eos: Iterable[int],
                 sampling: Sampling | None, pad: int | None) -> None:
        import numpy as np

        ids = np.asarray(prompt, dtype=np.int64)
        self._batched = ids.ndim == 2
        if ids.ndim == 1:
            ids = ids[None, :]
        if ids.ndim != 2 or ids.shape[1] == 0 or ids.shape[0] == 0:
            raise InvalidInput(f"a prompt is a non-empty sequence of token ids, or a [batch, length] array of them "
                               f"(got shape {list(np.shape(prompt))})")
        if not _is_int(max_new_tokens) or max_new_tokens < 0:
            raise InvalidInput(f"max_new_tokens must be a non-negative integer (got {max_new_tokens!r})")
        decoder.check_length(ids.shape[1], max_new_tokens)
        self._decoder = decoder
        self._prompt = ids
        self._max_new = max_new_tokens
        self._eos = frozenset(int(e) for e in eos)
        self._pad = pad if pad is not None else (min(self._eos) if self._eos else 0)
        self._sampling = sampling
        self._rng = np.random.default_rng(sampling.seed) if sampling is not None else None
        self._new: list[Any] = []
        self._iterator: Iterator[Any] | None = None
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.decode_steps = 0
        self.stopped_by_eos = False

    @property
    def prompt_length(self) -> int:
        return int(self._prompt.shape[1])

    @property
    def tokens(self) -> Any:
        """The tokens generated so far: a list for a 1-D prompt, an int64 array [batch, n] for a batch."""
        import numpy as np

        if self._batched:
            return np.stack(self._new, axis=1) if self._new else np.zeros((self._prompt.shape[0], 0), np.int64)
        return [int(t[0]) for t in self._new]

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens per second of the decode steps (the first token comes from the prefill and is not
        counted); None before a step ran."""
        return self.decode_steps / self.decode_s if self.decode_steps and self.decode_s > 0 else None

    def __iter__(self) -> Iterator[Any]:
        if self._iterator is None:
            self._iterator = self._run()
        return self._iterator

    def run(self) -> "Generation":
        """Generate to the end (no streaming); returns self."""
        for _ in self:
            pass
        return self

    def _pick(self, logits: Any, done: Any) -> Any:
        import numpy as np

        if self._sampling is None:
            picked = np.argmax(logits, axis=-1).astype(np.int64)
        else:
            picked = np.array([_draw(sample_probabilities(row, self._sampling), self._rng) for row in logits],
                              dtype=np.int64)
        return np.where(done, self._pad, picked)

    def _run(self) -> Iterator[Any]:
        import numpy as np

        if self._max_new == 0:
            return
        done = np.zeros(self._prompt.shape[0], dtype=bool)
        start = time.perf_counter()
        logits, state = self._decoder.prefill(self._prompt)
        token = self._pick(logits, done)
        self.prefill_s = time.perf_counter() - start
        while True:
            self._new.append(token)
            if self._eos:
                done = done | np.isin(token, list(self._eos))
            yield token.copy() if self._batched else int(token[0])
            if done.all() and self._eos:
                self.stopped_by_eos = True
                return
            if len(self._new) >= self._max_new:
                return
            start = time.perf_counter()
            logits, state = self._decoder.step(state, token[:, None])
            token = self._pick(logits, done)
            self.decode_s += time.perf_counter() - start
            self.decode_steps += 1


@dataclass
class CacheState:
    """The KV cache after a run: each ``past_key_values.*`` input's next value, and how many
    tokens it holds."""

    past: dict[str, Any]
    length: int


class Decoder:
    """A decoder model in zoo's decoder I/O convention, behind an onnxruntime session (or anything
    with its ``run``/``get_inputs``/``get_outputs``). `head_size` is needed where the cache inputs
    leave it symbolic (onnxruntime-genai's builder does): give it, or build the decoder with
    `from_folder` from the build's genai_config.json. `context_length`, where known, bounds a
    prompt and its continuation."""

    def __init__(self, session: Any, head_size: int | None = None, context_length: int | None = None,
                 eos_token_ids: Sequence[int] = ()) -> None:
        self.session = session
        self.inputs = decoder_io.ports_of(session.get_inputs())
        self.outputs = decoder_io.ports_of(session.get_outputs())
        names = [p.name for p in self.inputs]
        if not decoder_io.is_decoder(names):
            raise InvalidInput(f"the model is not a decoder with a KV cache (its inputs: {', '.join(names)})",
                               hint="a generative build takes input_ids and past_key_values.N.key|value "
                                    "(onnxruntime-genai's convention)")
        self.output_names = [p.name for p in self.outputs]
        if decoder_io.LOGITS not in self.output_names:
            raise InvalidInput(f"the decoder has no output {decoder_io.LOGITS!r} (its outputs: "
                               f"{', '.join(self.output_names)})")
        self.head_size = head_size
        self.context_length = context_length
        self.eos_token_ids = tuple(int(e) for e in eos_token_ids)
        self.num_layers = decoder_io.num_layers(names)
        # a symbolic head size with none given fails here, not at the first prompt
        decoder_io.empty_cache(self.inputs, 1, head_size)

    @classmethod
    def from_folder(cls, session: Any, folder: Path) -> "Decoder":
        """A decoder whose head size, context length and end-of-sequence ids come from the
        genai_config.json in `folder` (the build's folder)."""
        settings = read_genai_config(Path(folder))
        return cls(session, settings.head_size, settings.context_length, settings.eos_token_ids)

    def check_length(self, prompt_length: int, max_new_tokens: int) -> None:
        """InvalidInput where a prompt and its continuation would not fit the context length."""
        if self.context_length is not None and prompt_length + max_new_tokens > self.context_length:
            room = self.context_length - prompt_length
            hint = (f"ask for at most {room} new tokens" if room > 0 else
                    f"shorten the prompt below {self.context_length} tokens")
            raise InvalidInput(f"a prompt of {prompt_length} tokens and {max_new_tokens} new ones exceed the "
                               f"model's context length of {self.context_length} tokens", hint=hint)

    def _run(self, feeds: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        import numpy as np

        values = self.session.run(self.output_names, feeds)
        outputs = dict(zip(self.output_names, values))
        logits = np.asarray(outputs[decoder_io.LOGITS])
        return logits, decoder_io.next_past(outputs, self.inputs)

    def prefill(self, input_ids: Any) -> tuple[Any, CacheState]:
        """One run over a prompt [batch, length] with nothing cached: the last position's logits
        [batch, vocab] (float32) and the cache that follows."""
        import numpy as np

        ids = np.asarray(input_ids, dtype=np.int64)
        logits, past = self._run(decoder_io.prefill_feeds(self.inputs, ids, self.head_size))
        return logits[:, -1, :].astype(np.float32), CacheState(past, ids.shape[1])

    def step(self, state: CacheState, input_ids: Any) -> tuple[Any, CacheState]:
        """One run over new tokens [batch, n] after the cached ones: the last position's logits
        [batch, vocab] (float32) and the cache that follows."""
        import numpy as np

        ids = np.asarray(input_ids, dtype=np.int64)
        logits, past = self._run(decoder_io.step_feeds(self.inputs, ids, state.past, state.length))
        return logits[:, -1, :].astype(np.float32), CacheState(past, state.length + ids.shape[1])

    def logits(self, input_ids: Any) -> Any:
        """Every position's logits [batch, length, vocab] from one prefill over `input_ids`."""
        import numpy as np

        ids = np.asarray(input_ids, dtype=np.int64)
        if ids.ndim == 1:
            ids = ids[None, :]
        logits, _ = self._run(decoder_io.prefill_feeds(self.inputs, ids, self.head_size))
        return logits

    def token_log_probs(self, input_ids: Any) -> Any:
        """log p(token t+1 | tokens ≤ t) for t = 0..length-2 of a teacher-forced block (float64;
        [length-1] for a 1-D block, [batch, length-1] for a batch), from one prefill over it."""
        import numpy as np

        ids = np.asarray(input_ids, dtype=np.int64)
        flat = ids.ndim == 1
        block = ids[None, :] if flat else ids
        if block.ndim != 2 or block.shape[1] < 2:
            raise InvalidInput(f"a block to score holds at least 2 tokens per row (got shape {list(ids.shape)})")
        logp = log_softmax(self.logits(block)[:, :-1, :])
        picked = np.take_along_axis(logp, block[:, 1:, None], axis=-1)[..., 0]
        return picked[0] if flat else picked

    def greedy(self, prompt_ids: Any, max_new_tokens: int, eos: int | Iterable[int] | None = None,
               pad: int | None = None) -> Generation:
        """The most likely token at each step. `eos` (an id or several; None: the decoder's own,
        `from_folder`'s genai_config) ends a row; an empty list never stops early."""
        return Generation(self, prompt_ids, max_new_tokens, self._eos(eos), None, pad)

    def sample(self, prompt_ids: Any, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
               top_p: float = 1.0, seed: int = 0, eos: int | Iterable[int] | None = None,
               pad: int | None = None) -> Generation:
        """Tokens drawn as `Sampling` says, seeded: the same seed gives the same tokens."""
        sampling = Sampling(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        return Generation(self, prompt_ids, max_new_tokens, self._eos(eos), sampling, pad)

    def _eos(self, eos: int | Iterable[int] | None) -> tuple[int, ...]:
        if eos is None:
            return self.eos_token_ids
        if _is_int(eos):
            return (int(eos),)
        return tuple(int(e) for e in eos)  # type: ignore[union-attr]


def perplexity(decoder: Decoder, blocks: Any, batch_size: int = 1) -> float:
    """exp of the mean negative log-likelihood of every next token of `blocks` [N, length]
    (each row teacher-forced from its start), scored `batch_size` rows per run."""
    import numpy as np

    rows = np.asarray(blocks, dtype=np.int64)
    if rows.ndim == 1:
        rows = rows[None, :]
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise InvalidInput(f"blocks to score are a [N, length] array of token ids (got shape {list(rows.shape)})")
    total, count = 0.0, 0
    for i in range(0, rows.shape[0], max(1, batch_size)):
        logp = decoder.token_log_probs(rows[i:i + batch_size])
        total += float(-logp.sum())
        count += logp.size
    return math.exp(total / count)
