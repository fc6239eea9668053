"""Write the small ONNX models that recipes import as "existing ONNX files" (deterministic bytes).

- ``recipes/models/sobel-edges.onnx``: a label-less image model, the Sobel edge detector:
  grey images float32 [batch, 1, height, width] in [0, 1] -> edge magnitude
  ``sqrt(gx^2 + gy^2)`` of the same shape (3x3 Sobel kernels, edge padding by reflection).
  It stands for the models zoo imports without labels (detectors, encoders): `task: generic`.

Run ``python scripts/make_models.py`` to rewrite them; ``--check`` exits 1 when a committed file
differs from what this script writes (the test suite runs it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "recipes" / "models"
IR_VERSION = 13  # onnxruntime 1.32 loads at most IR 13; onnx 1.23 would stamp 14


def sobel_edges() -> bytes:
    """The Sobel edge detector as serialised ONNX (opset 17)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    gx = np.array([[-1, 0, 1], [-2, 0, 2], [-1, 0, 1]], dtype=np.float32)
    kernels = np.stack([gx, gx.T])[:, None]  # [2 out, 1 in, 3, 3]: horizontal, vertical gradients
    nodes = [
        helper.make_node("Pad", ["image", "pads"], ["padded"], mode="reflect"),
        helper.make_node("Conv", ["padded", "kernels"], ["gradients"]),
        helper.make_node("Mul", ["gradients", "gradients"], ["squared"]),
        helper.make_node("ReduceSum", ["squared", "channel_axis"], ["energy"], keepdims=1),
        helper.make_node("Sqrt", ["energy"], ["edges"]),
    ]
    inits = [numpy_helper.from_array(kernels, "kernels"),
             numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], dtype=np.int64), "pads"),
             numpy_helper.from_array(np.array([1], dtype=np.int64), "channel_axis")]
    dims = ["batch", 1, "height", "width"]
    graph = helper.make_graph(nodes, "sobel_edges",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("edges", TensorProto.FLOAT, dims)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="zoo-scripts",
                              doc_string="Sobel edge magnitude of grey images; no labels (task: generic)")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


OUTPUTS = {"sobel-edges.onnx": sobel_edges}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the committed files")
    args = parser.parse_args(argv)
    stale = []
    for name, make in OUTPUTS.items():
        path, data = MODELS / name, make()
        if args.check:
            if not path.is_file() or path.read_bytes() != data:
                stale.append(name)
        else:
            MODELS.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            print(f"wrote {path.relative_to(ROOT)} ({len(data)} bytes)")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python scripts/make_models.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
