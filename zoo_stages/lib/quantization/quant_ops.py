"""Model operations the quantize kind runs around onnxruntime's quantizer.

- naming the fully connected layers (the quantizer excludes nodes by name);
- quantizing them blockwise to MatMulNBits (``linear: blockwise``);
- the calibration data reader over a fixed, seeded sample of every named input.

onnx, onnxruntime and numpy are imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path

from zoo.errors import StageFailed


def name_nodes(model):
    """`model` with every node named (onnxruntime's quantizers exclude and configure nodes by name):
    an unnamed node becomes OPTYPE_INDEX, underscores added until the name is free."""
    taken = {n.name for n in model.graph.node if n.name}
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{i}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
    return model


def linear_nodes(path: Path, named: Path) -> tuple[Path, list[str]]:
    """(model path, names of its fully connected nodes): Gemm, and MatMul whose second input is
    an initializer (the layers MatMulNBits can take). The quantizer excludes nodes by name, so
    when one of them has none, every unnamed node gets ``<op>_<index>`` in a copy at `named`."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    linear = [n for n in model.graph.node
              if n.op_type == "Gemm" or (n.op_type == "MatMul" and len(n.input) > 1 and n.input[1] in weights)]
    if all(n.name for n in linear):
        return path, [n.name for n in linear]
    from zoo_stages.lib.onnx import onnx_io

    model = name_nodes(onnx_io.load_model(path))
    onnx_io.save_model(model, named)
    return linear_nodes(named, named)


def blockwise_linear(path: Path, block_size: int) -> None:
    """Quantize the float fully connected layers left in the model at `path` (in place) to
    onnxruntime's MatMulNBits: 8-bit symmetric weights, one scale per `block_size` inputs,
    accuracy_level 4 (activations quantized per block at run time, int8 dot products).

    Gemm nodes are first rewritten as MatMul + Add by onnxruntime's own helper (MatMulNBits
    takes MatMul only). Why: at batch 1 a fully connected layer streams its weights once per
    inference, and with VNNI MatMulNBits' kernels stream them faster than QGemm's (AlexNet-224's
    classifier: 2.8 ms instead of 3.8 ms on an AVX-512 VNNI host; on AVX2 without VNNI QGemm is
    slightly faster, so this stays opt-in).
    """
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    from onnxruntime.quantization.onnx_model import ONNXModel

    from zoo_stages.lib.onnx import onnx_io

    model = onnx_io.load_model(path, cap_ir_version=False)  # external data checked to stay in its folder
    wrapped = ONNXModel(model)
    wrapped.replace_gemm_with_matmul()
    quantizer = MatMulNBitsQuantizer(wrapped.model, bits=8, block_size=block_size, is_symmetric=True,
                                     accuracy_level=4, op_types_to_quantize=("MatMul",))
    previous = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").level
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(previous)
    result = quantizer.model.model
    if not any(n.op_type == "MatMulNBits" for n in result.graph.node):
        raise StageFailed("linear: blockwise found no fully connected layer with a constant weight to quantize",
                          hint="use `linear: qdq` for this model")
    onnx_io.save_model(result, path)  # IR capped, deterministic bytes


def calibration_reader(feeds, batch_size: int, fixed: bool, log=None):
    """A CalibrationDataReader over `feeds` (``{input name: array}``, prepared: every input of the
    model, samples along axis 0) in fixed-order batches (the last one padded if `fixed`).
    With `log` (a stage's logger), ``calibration i/N`` progress lines: i batches went through
    the calibrator (written when it asks for the next one, see `zoo_stages.lib.runtimes.step_log`)."""
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader

    from zoo_stages.lib.runtimes.step_log import StepLog

    count = max((len(v) for v in feeds.values() if np.ndim(v) > 0), default=1)

    class ArrayReader(CalibrationDataReader):
        def __init__(self):
            self.batches = []
            for start in range(0, count, batch_size):
                batch = {}
                for name, values in feeds.items():
                    if np.ndim(values) == 0:  # a rank-0 input is a constant, fed whole to every batch
                        batch[name] = values
                        continue
                    chunk = values[start:start + batch_size]
                    if fixed and len(chunk) < batch_size:
                        chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch_size - len(chunk), axis=0)])
                    batch[name] = np.ascontiguousarray(chunk)
                self.batches.append(batch)
            self.pos = 0
            self.progress = StepLog(log, "calibration", len(self.batches))

        def get_next(self):
            if self.pos:
                self.progress(self.pos)
            if self.pos >= len(self.batches):
                return None
            self.pos += 1
            return self.batches[self.pos - 1]

        def rewind(self):
            self.pos = 0

    return ArrayReader()
