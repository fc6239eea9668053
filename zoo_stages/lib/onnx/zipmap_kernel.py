"""ZipMap (ai.onnx.ml) for onnx's reference evaluator, which ships no kernel for it (onnx 1.23).

ZipMap is the last node of most scikit-learn classifiers exported with skl2onnx or onnxmltools:
it turns a float (samples, classes) tensor into one ``{class label: score}`` map per sample, the
labels from ``classlabels_int64s`` or ``classlabels_strings`` (ONNX-ML operator spec). The kernel
does exactly that in numpy, so a classifier that ends in ZipMap stays portable ONNX; the maps it
returns go through `onnx_run.run` like onnxruntime's (a per-class matrix). onnx is imported when
the kernel is made (`kernel()`), so importing this module is cheap.
"""

from __future__ import annotations

from typing import Any

DOMAIN = "ai.onnx.ml"


def uses_zipmap(model: Any) -> bool:
    """Whether the graph (its top level: skl2onnx puts ZipMap there) has a ZipMap node."""
    return any(n.op_type == "ZipMap" and n.domain == DOMAIN for n in model.graph.node)


def kernel() -> type:
    """The ZipMap kernel class for `ReferenceEvaluator(new_ops=[...])`."""
    import numpy as np
    from onnx.reference.ops.aionnxml._op_run_aionnxml import OpRunAiOnnxMl

    class ZipMap(OpRunAiOnnxMl):
        op_domain = DOMAIN

        def _run(self, x, classlabels_int64s=None, classlabels_strings=None):
            labels = ([int(k) for k in classlabels_int64s] if classlabels_int64s is not None and len(classlabels_int64s)
                      else [k.decode() if isinstance(k, bytes) else str(k) for k in classlabels_strings or ()])
            rows = np.asarray(x, dtype=np.float32)
            rows = rows.reshape(1, -1) if rows.ndim == 1 else rows
            if rows.ndim != 2 or rows.shape[1] != len(labels):
                raise ValueError(f"ZipMap: input of shape {list(rows.shape)} for {len(labels)} class labels")
            return ([{k: float(v) for k, v in zip(labels, row)} for row in rows],)

    return ZipMap
