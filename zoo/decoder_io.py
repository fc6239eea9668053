"""The input/output convention of a generative (decoder) ONNX model, and the feeds of its steps.

zoo's decoder builds follow onnxruntime-genai's convention, so that a `genai_config.json` describes
them and `onnxruntime_genai` runs them as they are:

- inputs ``input_ids`` int64 [batch_size, sequence_length], ``attention_mask`` int64
  [batch_size, total_sequence_length], optionally ``position_ids`` int64 [batch_size,
  sequence_length] (onnxruntime-genai's builder drops it where attention applies the rotary
  embedding itself), and per layer ``past_key_values.{i}.key`` / ``past_key_values.{i}.value``
  [batch_size, num_kv_heads, past_sequence_length, head_size];
- outputs ``logits`` [batch_size, sequence_length, vocab_size] and per layer ``present.{i}.key`` /
  ``present.{i}.value`` [batch_size, num_kv_heads, total_sequence_length, head_size].

A step's feeds are built here from the model's declared ports (name, shape, element type as
onnxruntime reports them), never from a runtime session, so every part of zoo that runs a decoder
(quantize's quality check, verify's generation metrics, test vectors, ``zoo generate``) feeds it
the same way. numpy only; nothing heavy is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from zoo.errors import InvalidInput

PAST_RE = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
PRESENT_RE = re.compile(r"^present\.(\d+)\.(key|value)$")
LOGITS = "logits"
INPUT_IDS, ATTENTION_MASK, POSITION_IDS = "input_ids", "attention_mask", "position_ids"
# onnxruntime's element type names of the float caches a decoder may keep
_FLOAT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "float32"}


@dataclass(frozen=True)
class Port:
    """One declared input or output: its name, shape (ints and symbolic names) and element type
    as onnxruntime spells it (``tensor(float)``)."""

    name: str
    shape: tuple[Any, ...]
    type: str


def ports_of(args: Iterable[Any]) -> list[Port]:
    """`Port`s from onnxruntime's ``session.get_inputs()``/``get_outputs()`` (or anything with
    ``name``, ``shape`` and ``type``)."""
    return [Port(a.name, tuple(a.shape or ()), a.type) for a in args]


def is_decoder(input_names: Iterable[str]) -> bool:
    """Whether a model with these inputs is a decoder with a KV cache in zoo's convention."""
    names = set(input_names)
    return INPUT_IDS in names and any(PAST_RE.match(n) for n in names)


def present_of(past_name: str) -> str:
    """The output that holds the next step's value of cache input `past_name`."""
    m = PAST_RE.match(past_name)
    if not m:
        raise ValueError(f"{past_name!r} is not a KV-cache input (past_key_values.N.key|value)")
    return f"present.{m.group(1)}.{m.group(2)}"


def num_layers(input_names: Iterable[str]) -> int:
    """How many layers keep a cache (the number of distinct N in past_key_values.N.*)."""
    return len({PAST_RE.match(n).group(1) for n in input_names if PAST_RE.match(n)})


def cache_shape(port: Port, batch: int, past_length: int, head_size: int | None = None) -> tuple[int, ...]:
    """The concrete shape of cache input `port` for `batch` rows and `past_length` cached tokens.

    Its heads come from the declared shape; its last dimension from the declared shape or, where the
    model leaves it symbolic (onnxruntime-genai's builder does), from `head_size`."""
    if len(port.shape) != 4:
        raise InvalidInput(f"KV-cache input {port.name!r} has shape {list(port.shape)}; expected 4 dimensions "
                           "[batch_size, num_kv_heads, past_sequence_length, head_size]")
    heads, last = port.shape[1], port.shape[3]
    if not isinstance(heads, int):
        raise InvalidInput(f"KV-cache input {port.name!r} does not declare its number of heads (dimension 1 is "
                           f"{heads!r})", hint="export the decoder with a fixed num_kv_heads dimension")
    if not isinstance(last, int):
        if head_size is None:
            raise InvalidInput(f"KV-cache input {port.name!r} leaves its head size symbolic ({last!r}) and no "
                               "head_size was given", hint="read it from the build's genai_config.json "
                                                           "(model.decoder.head_size)")
        last = head_size
    return (batch, heads, past_length, last)


def empty_cache(ports: Sequence[Port], batch: int, head_size: int | None = None) -> dict[str, Any]:
    """Every cache input with no token cached yet (past_sequence_length 0)."""
    import numpy as np

    return {p.name: np.zeros(cache_shape(p, batch, 0, head_size), dtype=_FLOAT_TYPES.get(p.type, "float32"))
            for p in ports if PAST_RE.match(p.name)}


def step_feeds(ports: Sequence[Port], input_ids: Any, past: Mapping[str, Any], past_length: int,
               attention_mask: Any | None = None) -> dict[str, Any]:
    """The feeds of one step: `input_ids` [batch, n] new tokens after `past_length` cached ones.

    `past` maps each cache input to its array (`empty_cache` for the first step, the previous step's
    ``present.*`` outputs after it). `attention_mask` [batch, past_length + n] defaults to ones; the
    position ids, where the model takes them, count from `past_length`."""
    import numpy as np

    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, sequence] (got shape {ids.shape})")
    batch, n = ids.shape
    names = {p.name for p in ports}
    feeds: dict[str, Any] = {INPUT_IDS: ids}
    if ATTENTION_MASK in names:
        mask = np.ones((batch, past_length + n), dtype=np.int64) if attention_mask is None else \
            np.asarray(attention_mask, dtype=np.int64)
        feeds[ATTENTION_MASK] = mask
    if POSITION_IDS in names:
        feeds[POSITION_IDS] = np.broadcast_to(np.arange(past_length, past_length + n, dtype=np.int64),
                                              (batch, n)).copy()
    for p in ports:
        if PAST_RE.match(p.name):
            if p.name not in past:
                raise ValueError(f"no value for KV-cache input {p.name!r}")
            feeds[p.name] = past[p.name]
    unknown = names - set(feeds)
    if unknown:
        raise InvalidInput(f"the decoder takes inputs zoo's convention does not name: {', '.join(sorted(unknown))}",
                           hint="inputs: input_ids, attention_mask, position_ids, past_key_values.N.key|value")
    return feeds


def prefill_feeds(ports: Sequence[Port], input_ids: Any, head_size: int | None = None) -> dict[str, Any]:
    """The feeds of a prompt's first step (nothing cached)."""
    import numpy as np

    ids = np.asarray(input_ids, dtype=np.int64)
    return step_feeds(ports, ids, empty_cache(ports, ids.shape[0], head_size), 0)


def next_past(outputs: Mapping[str, Any], ports: Sequence[Port]) -> dict[str, Any]:
    """The next step's cache inputs from a step's named outputs (``present.N.*`` → ``past_key_values.N.*``)."""
    past = {}
    for p in ports:
        if PAST_RE.match(p.name):
            name = present_of(p.name)
            if name not in outputs:
                raise InvalidInput(f"the decoder has no output {name!r} for its cache input {p.name!r}")
            past[p.name] = outputs[name]
    return past
