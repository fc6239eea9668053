"""The parity gate of a generative (decoder) export: its ONNX model against transformers.

Two checks, both on the same prompts (`prompts`: [N, L] token ids):

- **prefill**: the logits of all N prompts in one batch, nothing cached, against transformers'
  forward (`zoo_stages.lib.quality.parity`: every element within ``atol + rtol·|ref|``);
- **greedy decoding with the cache**: for each prompt alone, `new_tokens` steps of the ONNX model
  fed its own ``present.*`` back as ``past_key_values.*`` (zoo's convention, `zoo/decoder_io.py`),
  taking the argmax each step, against transformers' ``generate(do_sample=False)``: every token
  must be the same, and each step's logits within the tolerance.

`GenerationParity.require` fails the stage (GateFailed) naming the first prompt and step where
the tokens part, or the logits table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoo.errors import GateFailed


def onnx_greedy(session: Any, prompt: Any, new_tokens: int, head_size: int | None = None) -> tuple[list[int], list[Any]]:
    """Greedy decoding of `new_tokens` tokens after `prompt` (1-D token ids) with the ONNX model's
    cache: (the tokens, each step's logits [vocab])."""
    import numpy as np

    from zoo import decoder_io

    ports = decoder_io.ports_of(session.get_inputs())
    outputs = [o.name for o in session.get_outputs()]
    ids = np.asarray(prompt, dtype=np.int64)[None, :]
    past = decoder_io.empty_cache(ports, 1, head_size)
    length = 0
    tokens: list[int] = []
    logits: list[Any] = []
    for _ in range(int(new_tokens)):
        feeds = decoder_io.step_feeds(ports, ids, past, length)
        got = dict(zip(outputs, session.run(outputs, feeds)))
        last = np.asarray(got[decoder_io.LOGITS])[0, -1].astype(np.float32)
        logits.append(last)
        token = int(np.argmax(last))
        tokens.append(token)
        past = decoder_io.next_past(got, ports)
        length += ids.shape[1]
        ids = np.array([[token]], dtype=np.int64)
    return tokens, logits


def onnx_prefill(session: Any, prompts: Any, head_size: int | None = None) -> Any:
    """The ONNX model's logits of a batch of prompts ([batch, length]), nothing cached."""
    import numpy as np

    from zoo import decoder_io

    ports = decoder_io.ports_of(session.get_inputs())
    got = session.run([decoder_io.LOGITS], decoder_io.prefill_feeds(ports, np.asarray(prompts), head_size))
    return got[0]


@dataclass
class GenerationParity:
    """What the gate found: the prefill comparison, and per prompt the tokens of both sides."""

    prefill: Any  # a parity.ParityReport of the logits
    decode: Any  # a parity.ParityReport of the logits of the steps, while the tokens agreed
    reference_tokens: list[list[int]] = field(default_factory=list)
    onnx_tokens: list[list[int]] = field(default_factory=list)

    @property
    def tokens_matched(self) -> int:
        """Tokens equal to transformers' before each prompt's first divergence, summed."""
        total = 0
        for ref, got in zip(self.reference_tokens, self.onnx_tokens):
            for a, b in zip(ref, got):
                if a != b:
                    break
                total += 1
        return total

    @property
    def tokens(self) -> int:
        return sum(len(t) for t in self.reference_tokens)

    @property
    def passed(self) -> bool:
        return self.prefill.passed and self.decode.passed and self.tokens_matched == self.tokens

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "prefill": self.prefill.to_json(), "decode": self.decode.to_json(),
                "prompts": len(self.reference_tokens), "new_tokens": len(self.reference_tokens[0])
                if self.reference_tokens else 0, "tokens": self.tokens, "tokens_matched": self.tokens_matched}

    def require(self, what: str, hint: str | None = None) -> None:
        """GateFailed unless the prefill logits, every greedy token and every step's logits agree."""
        if not self.prefill.passed:
            raise GateFailed(f"{what}: the prefill logits differ from transformers' beyond the tolerance",
                             table=self.prefill.table(), hint=hint)
        for i, (ref, got) in enumerate(zip(self.reference_tokens, self.onnx_tokens)):
            for step, (a, b) in enumerate(zip(ref, got)):
                if a != b:
                    raise GateFailed(f"{what}: greedy decoding with the cache parts from transformers' generate() "
                                     f"at prompt {i}, step {step}: token {b} where transformers chose {a} "
                                     f"({self.tokens_matched} of {self.tokens} tokens matched)", hint=hint)
        if not self.decode.passed:
            raise GateFailed(f"{what}: the logits of greedy decoding with the cache differ from transformers' "
                             "beyond the tolerance (same tokens)", table=self.decode.table(), hint=hint)


def check(model: Any, session: Any, prompts: Any, new_tokens: int, tolerance: Any,
          head_size: int | None = None) -> GenerationParity:
    """Run both checks of the module docstring (`model`: the transformers causal LM, `session`:
    onnxruntime's on the export, `tolerance`: a parity.Tolerance)."""
    import numpy as np

    from zoo_stages.lib.models import causal_lm
    from zoo_stages.lib.quality import parity

    prompts = np.asarray(prompts, dtype=np.int64)
    prefill = parity.compare({"logits": causal_lm.reference_prefill(model, prompts)},
                             {"logits": onnx_prefill(session, prompts, head_size)}, tolerance=tolerance)
    ref_tokens, got_tokens, ref_logits, got_logits = [], [], [], []
    for prompt in prompts:
        ref, ref_steps = causal_lm.reference_greedy(model, prompt, new_tokens)
        got, got_steps = onnx_greedy(session, prompt, new_tokens, head_size)
        ref_tokens.append(ref)
        got_tokens.append(got)
        agreed = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), len(ref))
        # a step's logits are comparable only while both sides were fed the same tokens
        ref_logits += ref_steps[:agreed + 1]
        got_logits += got_steps[:agreed + 1]
    decode = parity.compare({"logits": np.stack(ref_logits)}, {"logits": np.stack(got_logits)}, tolerance=tolerance)
    return GenerationParity(prefill, decode, ref_tokens, got_tokens)
