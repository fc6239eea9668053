"""How quantize feeds, judges and times a decoder (zoo's decoder convention, `zoo.decoder_io`).

- quality: the logits of one prefill (nothing cached) over token rows: the held-out split's
  ``input_ids`` (at most `eval_samples` rows), or without data seeded random token ids;
  compared with the fp32 parent's position by position (cosine, next-token top-1 agreement);
- calibration (GPTQ): prefill feeds of a seeded sample of the train split's ``input_ids`` rows;
- latency: one generation at batch 1, a prefill of `PROMPT_TOKENS` tokens then `DECODE_STEPS`
  greedy decode steps through the KV cache, timed end to end (interleaved with the fp32 parent).

The cache's head size comes from ``genai_config.json`` beside the model when the upstream ships
one (onnxruntime-genai's builder leaves it symbolic in the graph), else from the declared shape.
numpy and onnxruntime are imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from zoo import decoder_io
from zoo.errors import InvalidInput

PROMPT_TOKENS = 32
DECODE_STEPS = 16
RANDOM_ROWS, RANDOM_LENGTH = 8, 32  # token rows a decoder is judged on without data


def head_size(model: Path, *sources: Path) -> int | None:
    """The head size of `genai_config.json` beside `model` or one of `sources` (None: none there)."""
    for folder in [Path(model).parent, *(Path(s) if Path(s).is_dir() else Path(s).parent for s in sources)]:
        config = folder / "genai_config.json"
        if config.is_file():
            try:
                return int(json.loads(config.read_text())["model"]["decoder"]["head_size"])
            except (ValueError, KeyError, TypeError) as e:
                raise InvalidInput(f"{config}: no model.decoder.head_size ({e})",
                                   hint="onnxruntime-genai's genai_config.json names it") from None
    return None


def token_rows(split: Any | None, *, vocab: int, limit: int | None) -> Any:
    """int64 [N, L] rows: the split's ``input_ids`` (at most `limit`), or seeded random ids."""
    import numpy as np

    if split is None:
        return np.random.default_rng(0).integers(0, vocab, (RANDOM_ROWS, RANDOM_LENGTH)).astype(np.int64)
    features = split.features
    if decoder_io.INPUT_IDS not in features:
        raise InvalidInput(f"the data has no `input_ids` array for the decoder (it has: {', '.join(features)})",
                           hint="a causal language model reads its token rows as the named array input_ids")
    ids = np.asarray(features[decoder_io.INPUT_IDS], dtype=np.int64)
    if ids.ndim != 2 or not len(ids):
        raise InvalidInput(f"input_ids must be [rows, tokens] with at least one row (got shape {ids.shape})")
    return ids[:limit] if limit else ids


def vocab_size(session: Any) -> int:
    """The logits' last dimension as declared (or read from one step)."""
    out = next((o for o in session.get_outputs() if o.name == decoder_io.LOGITS), None)
    if out is None:
        raise InvalidInput("the decoder has no `logits` output", hint="zoo's decoder convention: zoo/decoder_io.py")
    last = (out.shape or [None])[-1]
    if isinstance(last, int) and last > 0:
        return last
    ports = decoder_io.ports_of(session.get_inputs())
    return int(session.run([decoder_io.LOGITS], decoder_io.prefill_feeds(ports, [[0]]))[0].shape[-1])


def prefill_logits(session: Any, rows: Any, head: int | None, batch: int = 4) -> dict[str, Any]:
    """``{"logits": [rows * tokens, vocab]}``: each position's next-token logits of a prefill."""
    import numpy as np

    ports = decoder_io.ports_of(session.get_inputs())
    parts = []
    for start in range(0, len(rows), batch):
        feeds = decoder_io.prefill_feeds(ports, rows[start:start + batch], head)
        logits = session.run([decoder_io.LOGITS], feeds)[0]
        parts.append(logits.reshape(-1, logits.shape[-1]))
    return {decoder_io.LOGITS: np.concatenate(parts).astype(np.float32)}


def calibration_reader(rows: Any, session: Any, head: int | None, batch_size: int):
    """A CalibrationDataReader of prefill feeds over `rows`, `batch_size` rows a batch."""
    from onnxruntime.quantization import CalibrationDataReader

    ports = decoder_io.ports_of(session.get_inputs())
    batches = [decoder_io.prefill_feeds(ports, rows[i:i + batch_size], head) for i in range(0, len(rows), batch_size)]

    class PrefillReader(CalibrationDataReader):
        def __init__(self):
            self.pos = 0

        def get_next(self):
            if self.pos >= len(batches):
                return None
            self.pos += 1
            return batches[self.pos - 1]

        def rewind(self):
            self.pos = 0

    return PrefillReader()


def generate(session: Any, prompt: Any, head: int | None, steps: int) -> list[int]:
    """Greedy tokens after `prompt` ([1, P]): a prefill, then `steps` decode steps through the cache."""
    import numpy as np

    ports = decoder_io.ports_of(session.get_inputs())
    names = [o.name for o in session.get_outputs()]
    feeds = decoder_io.prefill_feeds(ports, prompt, head)
    length = prompt.shape[1]
    tokens = []
    for _ in range(steps + 1):
        outputs = dict(zip(names, session.run(None, feeds)))
        token = int(np.argmax(outputs[decoder_io.LOGITS][0, -1]))
        tokens.append(token)
        feeds = decoder_io.step_feeds(ports, [[token]], decoder_io.next_past(outputs, ports), length)
        length += 1
    return tokens


def time_generation(sessions: Mapping[str, Any], prompt: Any, head: int | None, *, warmup: int, runs: int,
                    progress: Callable[[int], None] | None = None) -> dict[str, dict[str, Any]]:
    """p50/p90 ms of `generate` (prefill + DECODE_STEPS) per session, in interleaved rounds."""
    import numpy as np

    for _ in range(max(0, warmup)):
        for session in sessions.values():
            generate(session, prompt, head, DECODE_STEPS)
    times: dict[str, list[float]] = {key: [] for key in sessions}
    for i in range(runs):
        for key, session in sessions.items():
            t0 = time.perf_counter_ns()
            generate(session, prompt, head, DECODE_STEPS)
            times[key].append((time.perf_counter_ns() - t0) / 1e6)
        if progress is not None:
            progress(i + 1)
    return {key: {"p50_ms": float(np.percentile(v, 50)), "p90_ms": float(np.percentile(v, 90)), "runs": runs}
            for key, v in times.items()}


def measured(prompt_tokens: int) -> str:
    """What a decoder's latency_p50_ms is (recorded beside it)."""
    return f"batch 1: prefill of {prompt_tokens} tokens + {DECODE_STEPS} greedy decode steps"
