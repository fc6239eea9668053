"""Name the first difference between two ONNX models: a tensor, an attribute, a node, metadata."""

from __future__ import annotations

from pathlib import Path


def first_difference(old: Path, new: Path) -> str:
    """A one-line description of the first difference, or '' when the graphs are identical."""
    import onnx
    from onnx import numpy_helper

    a = onnx.load(str(old), load_external_data=False)
    b = onnx.load(str(new), load_external_data=False)
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        if getattr(a, field) != getattr(b, field):
            return f"model {field}: {getattr(a, field)!r} → {getattr(b, field)!r}"
    if [(o.domain, o.version) for o in a.opset_import] != [(o.domain, o.version) for o in b.opset_import]:
        return "opset imports differ"
    meta_a = {p.key: p.value for p in a.metadata_props}
    meta_b = {p.key: p.value for p in b.metadata_props}
    for key in sorted(set(meta_a) | set(meta_b)):
        if meta_a.get(key) != meta_b.get(key):
            return f"metadata_props[{key!r}]: {meta_a.get(key)!r} → {meta_b.get(key)!r}"
    inits_a = {t.name: t for t in a.graph.initializer}
    inits_b = {t.name: t for t in b.graph.initializer}
    for name in list(inits_a) + [n for n in inits_b if n not in inits_a]:
        ta, tb = inits_a.get(name), inits_b.get(name)
        if ta is None or tb is None:
            return f"initializer {name!r} only in the {'new' if ta is None else 'old'} model"
        if ta.SerializeToString() != tb.SerializeToString():
            return _tensor_difference(name, numpy_helper.to_array(ta), numpy_helper.to_array(tb))
    if len(a.graph.node) != len(b.graph.node):
        return f"node count {len(a.graph.node)} → {len(b.graph.node)}"
    for i, (na, nb) in enumerate(zip(a.graph.node, b.graph.node)):
        label = f"node {i} ({na.op_type} {na.name!r})"
        if (na.op_type, na.domain) != (nb.op_type, nb.domain):
            return f"{label}: op {na.domain}.{na.op_type} → {nb.domain}.{nb.op_type}"
        if list(na.input) != list(nb.input) or list(na.output) != list(nb.output):
            return f"{label}: inputs/outputs {list(na.input)}→{list(na.output)} vs {list(nb.input)}→{list(nb.output)}"
        attrs_a = {x.name: x for x in na.attribute}
        attrs_b = {x.name: x for x in nb.attribute}
        for attr in sorted(set(attrs_a) | set(attrs_b)):
            xa, xb = attrs_a.get(attr), attrs_b.get(attr)
            if xa is None or xb is None or xa.SerializeToString() != xb.SerializeToString():
                return f"{label}: attribute {attr!r} differs"
        if na.name != nb.name:
            return f"node {i}: name {na.name!r} → {nb.name!r}"
    for kind in ("input", "output", "value_info"):
        if [x.SerializeToString() for x in getattr(a.graph, kind)] != [x.SerializeToString() for x in getattr(b.graph, kind)]:
            return f"graph {kind} declarations differ"
    if a.SerializeToString() != b.SerializeToString():
        return "serialised bytes differ outside graph tensors/attributes (doc strings or field order)"
    return ""


def _tensor_difference(name: str, x, y) -> str:
    import numpy as np

    if x.shape != y.shape or x.dtype != y.dtype:
        return f"initializer {name!r}: {x.dtype}{list(x.shape)} → {y.dtype}{list(y.shape)}"
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    diff = np.flatnonzero(flat_x != flat_y)
    if diff.size == 0:
        return f"initializer {name!r}: same values, different encoding"
    i = int(diff[0])
    return (f"initializer {name!r}: {diff.size} of {flat_x.size} values differ, first at flat index {i} "
            f"({flat_x[i]!r} → {flat_y[i]!r})")
