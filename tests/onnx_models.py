"""Small ONNX models built with onnx.helper for the tests of the ONNX plumbing
(zoo_stages.lib.onnx.onnx_io, ort_session, onnx_run, parity, timing), with numpy references."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def linear_model(features: int = 16, classes: int = 3, batch="N", seed: int = 0, ir_version: int = 13) -> onnx.ModelProto:
    """Flatten + Gemm on (batch, 1, 4, 4) float inputs ("input" -> "logits"), fixed random weights."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 1, (classes, features)).astype(np.float32)
    b = rng.normal(0, 1, (classes,)).astype(np.float32)
    side = int(features ** 0.5)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"], axis=1),
         helper.make_node("Gemm", ["flat", "W", "B"], ["logits"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 1, side, side])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def numpy_logits(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """What `linear_model` computes, in numpy."""
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "W"))
    b = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "B"))
    return x.reshape(len(x), -1) @ w.T + b


TOKENS = 5
CLASSES = 4


def multi_io_model(batch="N", seed: int = 0) -> onnx.ModelProto:
    """A text-classifier-shaped model: two int64 inputs ("ids", "types", (batch, 5)) and a bool
    "mask"; outputs "probs" (float32 softmax), "scores16" (float16 scores), "label" (int64
    argmax) and "total" (a float32 scalar with no batch axis, the sum of all scores)."""
    w = np.random.default_rng(seed).normal(0, 1, (TOKENS, CLASSES)).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["ids", "types"], ["summed"]),
        helper.make_node("Cast", ["summed"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["mask"], ["mask_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["as_float", "mask_float"], ["masked"]),
        helper.make_node("MatMul", ["masked", "W"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=1),
        helper.make_node("Cast", ["scores"], ["scores16"], to=TensorProto.FLOAT16),
        helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0),
        helper.make_node("ReduceSum", ["scores"], ["total"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "multi_io",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [batch, TOKENS]),
         helper.make_tensor_value_info("types", TensorProto.INT64, [batch, TOKENS]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, [batch, TOKENS])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, CLASSES]),
         helper.make_tensor_value_info("scores16", TensorProto.FLOAT16, [batch, CLASSES]),
         helper.make_tensor_value_info("label", TensorProto.INT64, [batch]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    return model


def multi_io_feeds(samples: int, seed: int = 1) -> dict[str, np.ndarray]:
    """Random feeds for `multi_io_model`."""
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, 50, (samples, TOKENS), dtype=np.int64),
            "types": rng.integers(0, 2, (samples, TOKENS), dtype=np.int64),
            "mask": rng.random((samples, TOKENS)) > 0.3}


def multi_io_reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What `multi_io_model` computes, in numpy (float64, then cast like the model)."""
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "W")).astype(np.float64)
    scores = ((feeds["ids"] + feeds["types"]) * feeds["mask"]).astype(np.float64) @ w
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return {"probs": (e / e.sum(axis=1, keepdims=True)).astype(np.float32),
            "scores16": scores.astype(np.float16),
            "label": scores.argmax(axis=1).astype(np.int64),
            "total": np.float32(scores.sum())}


def unknown_op_model() -> onnx.ModelProto:
    """A well-formed ONNX file onnxruntime cannot load: its only node is an operator no runtime has."""
    graph = helper.make_graph(
        [helper.make_node("NoSuchOperator", ["x"], ["y"])], "unknown",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    return model


def reshape_model() -> onnx.ModelProto:
    """(N, 4) -> reshaped to (-1, 3): loads, but fails at run time unless 4*N is a multiple of 3."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(np.array([-1, 3], dtype=np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    return model


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 13
    return model


def regression_model(w: np.ndarray, b: float, batch="N") -> onnx.ModelProto:
    """A linear regressor: "features" (batch, F) float -> "prediction" (batch, 1) = features @ w + b."""
    w = np.asarray(w, dtype=np.float32).reshape(1, -1)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["features", "W", "B"], ["prediction"], transB=1)],
        "regressor",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, [batch, w.shape[1]])],
        [helper.make_tensor_value_info("prediction", TensorProto.FLOAT, [batch, 1])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([b], dtype=np.float32), "B")],
    )
    return _model(graph)


def sklearn_classifier_model(w: np.ndarray, b: np.ndarray, label_w: np.ndarray, label_b: np.ndarray) -> onnx.ModelProto:
    """Shaped like a scikit-learn classifier converted to ONNX: "features" (batch, F) float ->
    "label" (batch,) int64 and "probabilities" (batch, C) float. The label is the argmax of
    ``features @ label_w.T + label_b``, the probabilities the softmax of ``features @ w.T + b``,
    so with different weights the two can disagree (as a converted model's decision rule can)."""
    classes, features = w.shape
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["features", "W", "B"], ["scores"], transB=1),
         helper.make_node("Softmax", ["scores"], ["probabilities"], axis=1),
         helper.make_node("Gemm", ["features", "LW", "LB"], ["decision"], transB=1),
         helper.make_node("ArgMax", ["decision"], ["label"], axis=1, keepdims=0)],
        "sklearn_like",
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["N", features])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, ["N"]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", classes])],
        [numpy_helper.from_array(np.asarray(w, np.float32), "W"), numpy_helper.from_array(np.asarray(b, np.float32), "B"),
         numpy_helper.from_array(np.asarray(label_w, np.float32), "LW"),
         numpy_helper.from_array(np.asarray(label_b, np.float32), "LB")],
    )
    return _model(graph)


def detector_model(channels: int = 1, side: int = 8, seed: int = 0) -> onnx.ModelProto:
    """Shaped like a dense detector / segmenter: "image" (N, channels, side, side) -> "heatmap"
    (N, 1, side, side), a 3x3 convolution and a sigmoid. No class scores anywhere."""
    w = np.random.default_rng(seed).normal(0, 1, (1, channels, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["image", "W"], ["conv"], pads=[1, 1, 1, 1]),
         helper.make_node("Sigmoid", ["conv"], ["heatmap"])],
        "detector",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", channels, side, side])],
        [helper.make_tensor_value_info("heatmap", TensorProto.FLOAT, ["N", 1, side, side])],
        [numpy_helper.from_array(w, "W")],
    )
    return _model(graph)


def sequence_model(vocab: int = 8, dim: int = 4, seed: int = 0) -> onnx.ModelProto:
    """An encoder-shaped model with a dynamic sequence axis: "ids" (batch, sequence) int64 ->
    "embedding" (batch, dim), the mean of the ids' embedding rows."""
    table = np.random.default_rng(seed).normal(0, 1, (vocab, dim)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["rows"]),
         helper.make_node("ReduceMean", ["rows"], ["embedding"], axes=[1], keepdims=0)],
        "encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", dim])],
        [numpy_helper.from_array(table, "E")],
    )
    return _model(graph)
