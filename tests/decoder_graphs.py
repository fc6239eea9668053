"""Small decoder ONNX models written with onnx.helper, in zoo's decoder I/O convention (`zoo/decoder_io.py`).

`attention_decoder` is a real one-layer causal self-attention decoder (token embedding, one head
with a KV cache, a residual, an LM head) in standard ONNX operators only: onnx.checker accepts it
and onnx's reference evaluator runs it, which onnxruntime-genai's builder's models (contrib
operators) do not allow. Its cache inputs declare their head size, so no genai_config.json is
needed. `int4_of` quantizes its MatMuls to onnxruntime's MatMulNBits (4 bits, RTN), an
onnxruntime-only build. `uniform_decoder` gives every token the same logit (its perplexity is the
vocabulary size exactly).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from zoo_stages.lib.onnx import onnx_io


def _weights(seed: int, vocab: int, hidden: int, head: int, lm_scale: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {"E": normal(vocab, hidden), "Wq": normal(hidden, head, scale=hidden ** -0.5),
            "Wk": normal(hidden, head, scale=hidden ** -0.5), "Wv": normal(hidden, head, scale=hidden ** -0.5),
            "Wo": normal(head, hidden, scale=head ** -0.5), "Wlm": normal(hidden, vocab, scale=lm_scale * hidden ** -0.5)}


def attention_decoder(*, seed: int = 0, vocab: int = 96, hidden: int = 32, head: int = 16, lm_scale: float = 3.0,
                      weights: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A one-layer, one-head causal attention decoder: inputs input_ids, attention_mask,
    past_key_values.0.key|value [batch_size, 1, past_sequence_length, head]; outputs logits
    [batch_size, sequence_length, vocab] and present.0.key|value. `weights` replaces the seeded
    ones (see `decoder_weights`)."""
    w = weights if weights is not None else _weights(seed, vocab, hidden, head, lm_scale)
    vocab, hidden = w["E"].shape
    head = w["Wq"].shape[1]
    f = TensorProto.FLOAT
    consts = [numpy_helper.from_array(a, name) for name, a in w.items()] + [
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array(head ** -0.5, np.float32), "scale"),
        numpy_helper.from_array(np.array(-1e9, np.float32), "blocked_value"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
    ]
    n = helper.make_node
    nodes = [
        n("Gather", ["E", "input_ids"], ["x"]),
        n("MatMul", ["x", "Wq"], ["q3"]), n("Unsqueeze", ["q3", "axis1"], ["q"]),
        n("MatMul", ["x", "Wk"], ["k3"]), n("Unsqueeze", ["k3", "axis1"], ["k"]),
        n("MatMul", ["x", "Wv"], ["v3"]), n("Unsqueeze", ["v3", "axis1"], ["v"]),
        n("Concat", ["past_key_values.0.key", "k"], ["present.0.key"], axis=2),
        n("Concat", ["past_key_values.0.value", "v"], ["present.0.value"], axis=2),
        n("Transpose", ["present.0.key"], ["kT"], perm=[0, 1, 3, 2]),
        n("MatMul", ["q", "kT"], ["raw"]), n("Mul", ["raw", "scale"], ["scores"]),
        # causal: the query at absolute position past + i sees the keys at positions <= past + i
        n("Shape", ["present.0.key"], ["T1"], start=2, end=3), n("Shape", ["input_ids"], ["S1"], start=1, end=2),
        n("Squeeze", ["T1", "axis0"], ["T"]), n("Squeeze", ["S1", "axis0"], ["S"]), n("Sub", ["T", "S"], ["P"]),
        n("Range", ["P", "T", "one"], ["qpos"]), n("Range", ["zero", "T", "one"], ["kpos"]),
        n("Unsqueeze", ["kpos", "axis0"], ["kpos_row"]), n("Unsqueeze", ["qpos", "axis1"], ["qpos_col"]),
        n("Greater", ["kpos_row", "qpos_col"], ["future"]),
        # and no padded key (attention_mask 0)
        n("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL), n("Not", ["mask_bool"], ["padded2"]),
        n("Unsqueeze", ["padded2", "axis1"], ["padded3"]), n("Unsqueeze", ["padded3", "axis1"], ["padded"]),
        n("Or", ["future", "padded"], ["blocked"]),
        n("Where", ["blocked", "blocked_value", "scores"], ["masked"]),
        n("Softmax", ["masked"], ["p"], axis=-1),
        n("MatMul", ["p", "present.0.value"], ["a4"]), n("Squeeze", ["a4", "axis1"], ["a"]),
        n("MatMul", ["a", "Wo"], ["o"]), n("Add", ["x", "o"], ["h"]),
        n("MatMul", ["h", "Wlm"], ["logits"]),
    ]
    cache = ["batch_size", 1, "past_sequence_length", head]
    present = ["batch_size", 1, "total_sequence_length", head]
    graph = helper.make_graph(
        nodes, "attention_decoder",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
         helper.make_tensor_value_info("past_key_values.0.key", f, cache),
         helper.make_tensor_value_info("past_key_values.0.value", f, cache)],
        [helper.make_tensor_value_info("logits", f, ["batch_size", "sequence_length", vocab]),
         helper.make_tensor_value_info("present.0.key", f, present),
         helper.make_tensor_value_info("present.0.value", f, present)],
        consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = onnx_io.MAX_IR_VERSION
    return model


def with_symbolic_head_size(model: onnx.ModelProto, name: str = "kv_cache_dim") -> onnx.ModelProto:
    """`model` with the head size of its cache inputs and outputs left symbolic, as onnxruntime-genai's
    builder leaves it (a runtime then reads it from genai_config.json)."""
    for value in list(model.graph.input) + list(model.graph.output):
        if value.name.startswith(("past_key_values.", "present.")):
            value.type.tensor_type.shape.dim[3].dim_param = name
    return model


def genai_config(folder: Path, *, head_size: int = 16, context_length: int = 256) -> Path:
    """A minimal genai_config.json (what zoo.textgen reads of one) in `folder`."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "genai_config.json"
    path.write_text(json.dumps({"model": {"context_length": context_length, "eos_token_id": 0, "vocab_size": 96,
                                          "decoder": {"head_size": head_size, "filename": "model.onnx"}}}))
    return path


def decoder_weights(seed: int = 0, vocab: int = 96, hidden: int = 32, head: int = 16,
                    lm_scale: float = 3.0) -> dict[str, np.ndarray]:
    """The seeded weights `attention_decoder` uses (to perturb them, or zero the LM head)."""
    return _weights(seed, vocab, hidden, head, lm_scale)


def uniform_decoder(vocab: int = 96) -> onnx.ModelProto:
    """An attention decoder whose LM head is zero: every logit 0, every token probability 1/vocab."""
    w = decoder_weights(vocab=vocab)
    w["Wlm"] = np.zeros_like(w["Wlm"])
    return attention_decoder(weights=w)


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return onnx_io.save_model(model, path)


def int4_of(source: Path, target: Path, block_size: int = 16) -> Path:
    """`source`'s MatMuls with constant weights as MatMulNBits (4 bits, symmetric, the quantizer's
    default round-to-nearest): an onnxruntime-only model (com.microsoft), which onnx's reference
    evaluator cannot run. (Its `RTNWeightOnlyQuantConfig` path, through neural-compressor's graph
    walk, kept 2 of this graph's 34 nodes in onnxruntime 1.32: the default config is used.)"""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quant = MatMulNBitsQuantizer(onnx_io.load_model(source), block_size=block_size, is_symmetric=True)
    quant.process()
    model = quant.model.model
    model.ir_version = min(model.ir_version, onnx_io.MAX_IR_VERSION)
    return save(model, target)
