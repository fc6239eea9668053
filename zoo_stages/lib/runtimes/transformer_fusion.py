"""onnxruntime's transformer optimizer (attention, LayerNorm, GELU fusions) for the optimize kind.

`fuse` runs ``onnxruntime.transformers.optimizer.optimize_model`` and returns the fused model
and the number of fused operators of each type. Its ``num_heads``/``hidden_size`` of 0 mean
"detect"; onnxruntime's own detection reads the head count from the Q projection's Reshape
shape, which exports from Hugging Face `transformers` 5 write as ``[batch, sequence, -1,
head_size]`` (no head count), so the attention fusion then silently does nothing.
`attention_shape` fills that gap: hidden size from the LayerNormalization scales (or the square
projection weights), head size from the Reshape shapes, heads = hidden / head size.

Exports with the ``eager`` attention implementation fuse to Attention; ``sdpa`` exports of
`transformers` 5 keep a mask subgraph onnxruntime's fusion does not match (LayerNorm and GELU
still fuse). onnx and onnxruntime are imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

import logging
from collections import Counter
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from zoo.errors import InvalidInput, StageFailed

if TYPE_CHECKING:
    import onnx

# the loggers of onnxruntime.transformers' fusion modules (they log under their module names)
_NOISY = ("onnxruntime.transformers", "fusion_base", "fusion_attention", "fusion_utils", "onnx_model",
          "onnx_model_bert", "fusion_skiplayernorm", "fusion_embedlayer", "fusion_options", "optimizer",
          "fusion_constant_fold", "fusion_rotary_attention", "fusion_layernorm", "fusion_gelu")


def fuse(model: "onnx.ModelProto", *, model_type: str, num_heads: int, hidden_size: int,
         opt_level: int) -> tuple["onnx.ModelProto", dict[str, int], tuple[int, int]]:
    """(fused model, {fused operator: count > 0}, (num_heads, hidden_size) used).

    InvalidInput for a model type onnxruntime's optimizer does not know; StageFailed when it
    raises on the graph.
    """
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import MODEL_TYPES, optimize_model

    if model_type not in MODEL_TYPES:
        raise InvalidInput(f"transformer.model_type {model_type!r} is not one onnxruntime's optimizer knows",
                           hint=f"use one of: {', '.join(sorted(MODEL_TYPES))}")
    if num_heads == 0 or hidden_size == 0:
        found_heads, found_hidden = attention_shape(model)
        num_heads, hidden_size = num_heads or found_heads, hidden_size or found_hidden
    options = FusionOptions(model_type)
    # The raw [batch, sequence] mask: onnxruntime's default turns it into sequence lengths, which
    # silently assumes right padding (any other mask then gives other outputs). Measured on a
    # BERT at sequence 128 the two run at the same speed on CPU.
    options.use_raw_attention_mask(True)
    try:
        with _quiet():
            optimizer = optimize_model(model, model_type=model_type, num_heads=num_heads, hidden_size=hidden_size,
                                       optimization_options=options, opt_level=opt_level, use_gpu=False)
    except Exception as e:  # the fusions raise AssertionError/ValueError/KeyError on graphs they misread
        raise StageFailed(f"onnxruntime's transformer optimizer failed on the model: {type(e).__name__}: {e}",
                          hint="check transformer.model_type, num_heads and hidden_size, or remove `transformer:`") from None
    stats = optimizer.get_fused_operator_statistics()
    fused = {op: int(n) for op, n in sorted(stats.items()) if n}
    return optimizer.model, fused, (int(num_heads), int(hidden_size))


def attention_shape(model: "onnx.ModelProto") -> tuple[int, int]:
    """(num_heads, hidden_size) read from the graph, (0, 0) where it cannot tell."""
    from onnx import numpy_helper

    consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if _small(t)}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tensor = node.attribute[0].t
            if _small(tensor):
                consts[node.output[0]] = numpy_helper.to_array(tensor)
    hidden = _hidden_size(model)
    if not hidden:
        return 0, 0
    producers = {out: node for node in model.graph.node for out in node.output}
    head_sizes: Counter[int] = Counter()
    for node in model.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2:
            continue
        dims = _shape_dims(node.input[1], consts, producers)
        if dims is None or len(dims) != 4 or dims[3] is None or dims[3] <= 0 or hidden % dims[3]:
            continue
        if dims[2] is not None and dims[2] > 0 and dims[2] * dims[3] != hidden:
            continue
        head_sizes[dims[3]] += 1
    if not head_sizes:
        return 0, 0
    head = head_sizes.most_common(1)[0][0]
    return hidden // head, hidden


def _small(tensor) -> bool:
    from onnx import TensorProto

    return tensor.data_location != TensorProto.EXTERNAL and len(tensor.dims) <= 1 and \
        (not tensor.dims or tensor.dims[0] <= 8)


def _shape_dims(name: str, consts, producers) -> list[int | None] | None:
    """The dims of a Reshape's shape input: a constant, or a Concat of (1-element) constants and
    run-time values (None)."""
    if name in consts:
        return [int(v) for v in consts[name].reshape(-1)]
    node = producers.get(name)
    if node is None or node.op_type != "Concat":
        return None
    dims: list[int | None] = []
    for part in node.input:
        if part in consts and consts[part].size == 1:
            dims.append(int(consts[part].reshape(-1)[0]))
        else:
            dims.append(None)
    return dims


def _hidden_size(model: "onnx.ModelProto") -> int:
    """The most common LayerNormalization scale length, else the most common side of square
    MatMul weights (the attention projections)."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    norms = Counter(shapes[n.input[1]][0] for n in model.graph.node
                    if n.op_type == "LayerNormalization" and len(n.input) > 1 and len(shapes.get(n.input[1], ())) == 1)
    if norms:
        return int(norms.most_common(1)[0][0])
    squares = Counter(shapes[n.input[1]][0] for n in model.graph.node
                      if n.op_type == "MatMul" and len(n.input) > 1 and len(shapes.get(n.input[1], ())) == 2
                      and shapes[n.input[1]][0] == shapes[n.input[1]][1])
    return int(squares.most_common(1)[0][0]) if squares else 0


@contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's fusions log progress and warnings to the root handlers: keep errors only."""
    loggers = [logging.getLogger(name) for name in _NOISY]
    previous = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, previous):
            lg.setLevel(level)
