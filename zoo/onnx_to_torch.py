"""ONNX → torch: rebuild an ONNX graph as a trainable `torch.nn.Module` (zoo's own converter).

onnx2torch would do this, but it imports torchvision at import time, which does not install
beside zoo's torch; this converter covers the ops zoo's exports, optimizer and quantizer emit
(`SUPPORTED`) and names any other as "unsupported op X at node Y". Nothing in the model is
executed: initializers are read as arrays (`onnx.numpy_helper`) and the graph is interpreted by
the module's ``forward``, node by node, in topological order.

What the module looks like (`OnnxModule`):

- Conv / FusedConv with constant weights become ``nn.Conv1d/2d/3d``, Gemm / FusedGemm with a
  constant B become ``nn.Linear`` (alpha, beta and transB folded into the weights),
  BatchNormalization and LayerNormalization small modules with torch's parameter names. Each is
  placed at the path its weight's name gives (``features.0.weight`` → module ``features.0``), so a
  model exported from torch gets its original state-dict keys back (``features.0.weight``...).
- Every other float initializer is a parameter when its name ends in ``weight`` or ``bias``
  (a torch parameter), else a buffer (the constants an exporter made, e.g. pooling matrices),
  under ``constants``.
- Constant sub-graphs are folded at conversion (``Constant``, ``DequantizeLinear`` of a stored
  int8 weight, shape arithmetic on constants).
- int8 QDQ builds: weights are dequantized into float32 parameters, and each activation
  QuantizeLinear → DequantizeLinear pair becomes a fake-quantize step (round and clamp with
  the build's scale and zero point). The module computes what the int8 build computes (outputs
  agree to within about one quantization step of the build's, since onnxruntime runs integer
  kernels), and its gradients pass straight through the rounding, so it can be fine-tuned
  quantization-aware. Operator-format int8 (QLinearConv...) is unsupported.
- ``com.microsoft::MatMulNBits`` (blockwise 2/4/8-bit weights) becomes an ``nn.Linear`` whose
  float32 weight is dequantized from its blocks; ``DynamicQuantizeLinear`` + ``MatMulInteger``
  (dynamic int8) are computed as ONNX specifies, in float32 (`zoo.onnx_to_torch_quant`). What was
  dequantized is listed in ``module.dequantized`` ([] for a float build).
- fp16 builds keep their float16 weights and casts (``model.float()`` makes a float32 copy only
  when the graph has no Cast back to fp16).

Dropout nodes drop in training mode (``module.train()``) with their ratio, as torch's did.
torch and onnx are imported inside functions.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from zoo.errors import InvalidInput

__all__ = ["convert", "replace_head", "SUPPORTED"]

_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "")
_ELEMENTWISE = ("Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Neg", "Abs", "Reciprocal", "Floor",
                "Ceil", "Softplus")
_BINARY = ("Add", "Sub", "Mul", "Div", "Pow", "MatMul", "Equal", "Greater", "Less", "Max", "Min")
SUPPORTED = tuple(sorted({
    "Conv", "FusedConv", "Gemm", "FusedGemm", "BatchNormalization", "LayerNormalization", *(_ELEMENTWISE),
    *(_BINARY), "LeakyRelu", "Elu", "Clip", "Gelu", "FastGelu", "Softmax", "LogSoftmax", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "Flatten", "Reshape", "Transpose", "Identity", "Dropout", "Concat",
    "Squeeze", "Unsqueeze", "Cast", "Constant", "Shape", "Gather", "ReduceMean", "ReduceSum", "Where",
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "MatMulNBits",
}))
# inputs a step reads as a shape or axes list, not as data: folded to Python ints at conversion
SHAPE_INPUTS = {"Reshape": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "ReduceMean": (1,), "ReduceSum": (1,)}
# ONNX TensorProto element types -> torch dtype names
_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16",
           11: "float64", 16: "bfloat16"}


def convert(model: Any, *, where: str = "the model") -> Any:
    """The `OnnxModule` of `model` (an ``onnx.ModelProto`` or a path to a .onnx file), in eval mode.

    Raises InvalidInput for an op outside `SUPPORTED` (naming the op and the node), for ORT-format
    files, and for graphs with subgraphs (If/Loop).
    """
    import onnx

    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        with open(path, "rb") as f:
            head = f.read(8)
        if head[4:8] == b"ORTM":
            raise InvalidInput(f"{where} is in ORT format, which only onnxruntime reads",
                               hint="convert one of the version's ONNX builds (e.g. cpu-fp32)")
        model = onnx.load(str(path))  # external data next to it (the pull checked its locations)
    return _Builder(model, where).build().eval()


def replace_head(module: Any, num_classes: int) -> str:
    """Replace the module's last Linear layer (its classifier head) by a fresh one with
    `num_classes` outputs (weights N(0, 0.01), zero bias, as zoo's own architectures start);
    returns the head's path (``classifier.4``). InvalidInput when the graph has no Linear layer."""
    import torch

    heads = [(path, m) for path, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    if not heads:
        raise InvalidInput("the model has no Linear (Gemm) layer to replace as its head",
                           hint="keep the parent's head (`head: keep`)")
    path, old = heads[-1]
    new = torch.nn.Linear(old.in_features, int(num_classes), bias=True, device=old.weight.device,
                          dtype=old.weight.dtype)
    if not new.weight.is_meta:  # built on the meta device for loaded weights: nothing to initialise
        with torch.no_grad():
            new.weight.normal_(0.0, 0.01)
            new.bias.zero_()
    parent_path, _, name = path.rpartition(".")
    parent = module.get_submodule(parent_path) if parent_path else module
    setattr(parent, name, new)
    module._replace_layer(old, new)
    return path


# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _module_class():
    """OnnxModule, defined on first use (torch imported only now)."""
    import torch

    class OnnxModule(torch.nn.Module):
        """An ONNX graph as a torch module: ``forward(*inputs)`` in the graph's input order returns
        its output (a tuple when the graph has several). ``input_names`` / ``output_names`` are the
        graph's."""

        def __init__(self):
            super().__init__()
            self.input_names: list[str] = []
            self.output_names: list[str] = []
            # what the conversion turned from quantized into float ([] for a float build), e.g.
            # "MatMulNBits (8-bit, block 32) -> float32 Linear weight x3" (zoo.onnx_to_torch_quant)
            self.dequantized: list[str] = []
            self._steps: list[tuple[Callable, list[str], list[str]]] = []
            self._consts: dict[str, tuple[torch.nn.Module, str]] = {}  # value name -> (owner, attribute)
            self._static: dict[str, Any] = {}  # folded non-tensor constants (shapes, axes)

        def _value(self, env: dict, name: str):
            if name in env:
                return env[name]
            if name in self._consts:
                owner, attr = self._consts[name]
                return getattr(owner, attr)
            return self._static.get(name)  # "" (an omitted optional input) gives None

        def _replace_layer(self, old, new) -> None:
            self._steps = [(fn.rebind(old, new) if isinstance(fn, _LayerStep) else fn, ins, outs)
                           for fn, ins, outs in self._steps]

        def forward(self, *inputs):
            if len(inputs) != len(self.input_names):
                raise TypeError(f"the model takes {len(self.input_names)} input(s) "
                                f"({', '.join(self.input_names)}), got {len(inputs)}")
            env = dict(zip(self.input_names, inputs))
            for fn, ins, outs in self._steps:
                results = fn(self, [self._value(env, n) for n in ins])
                for name, value in zip(outs, results):
                    if name:
                        env[name] = value
            out = [self._value(env, n) for n in self.output_names]
            return out[0] if len(out) == 1 else tuple(out)

    OnnxModule.__module__ = __name__
    return OnnxModule


class _LayerStep:
    """A step that calls one of the module's layers (Conv, Linear, norms), then an activation."""

    def __init__(self, layer, activation: Callable | None = None, pre: Callable | None = None):
        self.layer, self.activation, self.pre = layer, activation, pre

    def rebind(self, old, new) -> "_LayerStep":
        return _LayerStep(new, self.activation, self.pre) if self.layer is old else self

    def __call__(self, module, xs):
        x = xs[0]
        if self.pre is not None:
            x = self.pre(x)
        y = self.layer(x)
        return (self.activation(y) if self.activation is not None else y,)


def _sanitize(part: str) -> str:
    part = re.sub(r"\W", "_", part).strip("_")
    return part or "x"


class _Builder:
    """One conversion: walks the graph once, folding constants and creating layers and steps."""

    def __init__(self, proto, where: str):
        import torch

        self.torch = torch
        self.proto, self.where = proto, where
        self.graph = proto.graph
        self.module = _module_class()()
        self.constants: dict[str, Any] = {}  # name -> torch tensor known at conversion
        self.consumers: dict[str, int] = {}
        self.tensor_reads: set[str] = set()  # constants a step reads as a tensor (not only as a shape)
        from zoo.onnx_to_torch_quant import Dequantized

        self.dequantized = Dequantized()

    # -- graph walking ----------------------------------------------------------------------

    def build(self):
        from onnx import numpy_helper

        torch = self.torch
        for sub in self.graph.node:
            if any(a.g.node or a.graphs for a in sub.attribute):
                raise InvalidInput(f"{self.where}: node {sub.name or sub.op_type!r} ({sub.op_type}) has a subgraph, "
                                   "which the torch converter does not support",
                                   hint="export the model without control flow")
        for init in self.graph.initializer:
            array = numpy_helper.to_array(init)
            self.constants[init.name] = torch.from_numpy(array.copy())
        inits = set(self.constants)
        self.module.input_names = [i.name for i in self.graph.input if i.name not in inits]
        self.module.output_names = [o.name for o in self.graph.output]
        nodes = self._sorted_nodes()
        for node in nodes:
            for name in node.input:
                self.consumers[name] = self.consumers.get(name, 0) + 1
        self.producers = {out: node for node in nodes for out in node.output}
        fused_q = self._fake_quant_pairs(nodes)
        for node in nodes:
            if id(node) in fused_q:
                continue
            self._node(node)
        self._register_constants()
        self.module.dequantized = self.dequantized.lines()
        return self.module

    def _sorted_nodes(self) -> list:
        """The nodes in a topological order (the file's own order where it is one already)."""
        available = {i.name for i in self.graph.input} | set(self.constants) | {""}
        pending = list(self.graph.node)
        out = []
        while pending:
            rest = []
            for node in pending:
                if all(n in available for n in node.input):
                    out.append(node)
                    available.update(node.output)
                else:
                    rest.append(node)
            if len(rest) == len(pending):
                missing = sorted({n for node in rest for n in node.input if n not in available})
                raise InvalidInput(f"{self.where}: the graph uses values nothing produces ({', '.join(missing[:5])})",
                                   hint="check the model with onnx.checker")
            pending = rest
        return out

    def _fake_quant_pairs(self, nodes) -> set[int]:
        """QuantizeLinear nodes on activations whose output only feeds one DequantizeLinear with the
        same scale and zero point: the pair becomes one fake-quantize step (the Q node is skipped)."""
        skipped: set[int] = set()
        self.fake_quant: dict[int, Any] = {}
        for node in nodes:
            if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
                continue
            q = self.producers.get(node.input[0])
            if q is None or q.op_type != "QuantizeLinear" or self.consumers.get(q.output[0]) != 1:
                continue
            if list(q.input[1:3]) != list(node.input[1:3]) or q.input[0] in self.constants:
                continue
            skipped.add(id(q))
            self.fake_quant[id(node)] = q
        return skipped

    # -- one node ---------------------------------------------------------------------------

    def _node(self, node) -> None:
        op, attrs = node.op_type, _attributes(node)
        where = f"node {node.name or '(unnamed)'!r}"
        if node.domain not in ("", "ai.onnx", "com.microsoft") or op not in SUPPORTED:
            domain = f"{node.domain}::" if node.domain not in ("", "ai.onnx") else ""
            raise InvalidInput(f"{self.where}: unsupported op {domain}{op} at {where}",
                               hint=f"the torch converter (zoo/onnx_to_torch.py) handles: {', '.join(SUPPORTED)}")
        if op == "MatMulNBits":
            from zoo.onnx_to_torch_quant import matmul_nbits_layer

            layer, what = matmul_nbits_layer(node, attrs, self.constants, self.where)
            self.dequantized.add(what)
            self._place(node.input[1], node, layer)
            self._step(_LayerStep(layer), [node.input[0]], [node.output[0]])
            return
        if op in ("DynamicQuantizeLinear", "MatMulInteger"):
            self.dequantized.add(f"{op} -> computed in float32 (its int8 weights kept as buffers)")
        if id(node) in self.fake_quant:
            self.dequantized.add("QuantizeLinear/DequantizeLinear on an activation -> fake-quantize step")
            self._step(_fake_quant(self, self.fake_quant[id(node)], node), [self.fake_quant[id(node)].input[0]],
                       list(node.output))
            return
        if op == "Constant":
            self.constants[node.output[0]] = self._constant_attr(node, attrs)
            return
        if op in ("Conv", "FusedConv") and node.input[1] in self.constants:
            self._conv(node, attrs)
            return
        if op in ("Gemm", "FusedGemm") and node.input[1] in self.constants and not attrs.get("transA"):
            self._gemm(node, attrs)
            return
        if op in ("BatchNormalization", "LayerNormalization") and all(
                n in self.constants for n in node.input[1:] if n):
            self._norm(node, attrs)
            return
        fn = _functional(op, attrs, node, self)
        if all(n in self.constants or not n for n in node.input) and op not in ("Dropout",):
            # fold: every input is known now (dequantized weights, shapes, casts of constants)
            results = fn(self.module, [self.constants.get(n) if n else None for n in node.input])
            if op == "DequantizeLinear":
                self.dequantized.add("DequantizeLinear of a stored int8/int32 weight or bias -> float32")
            for name, value in zip(node.output, results):
                if name:
                    self.constants[name] = value
            return
        static = SHAPE_INPUTS.get(op, ())
        self.tensor_reads.update(n for i, n in enumerate(node.input) if i not in static)
        self._step(fn, list(node.input), list(node.output))

    def _step(self, fn: Callable, ins: list[str], outs: list[str]) -> None:
        self.module._steps.append((fn, ins, outs))

    def _constant_attr(self, node, attrs):
        from onnx import numpy_helper

        torch = self.torch
        for a in node.attribute:
            if a.name == "value":
                return torch.from_numpy(numpy_helper.to_array(a.t).copy())
        for key, dtype in (("value_float", torch.float32), ("value_floats", torch.float32),
                           ("value_int", torch.int64), ("value_ints", torch.int64)):
            if key in attrs:
                return torch.tensor(attrs[key], dtype=dtype)
        raise InvalidInput(f"{self.where}: Constant node {node.name!r} has no supported value attribute",
                           hint="give it a tensor `value`")

    # -- layers -----------------------------------------------------------------------------

    def _place(self, weight_name: str, node, layer) -> None:
        """Put `layer` at the path its weight's name gives (``features.0.weight`` → ``features.0``)."""
        torch = self.torch
        base = re.sub(r"(_DequantizeLinear_Output|_quantized|_Q\d+(?:G\d+)?)$", "", weight_name)
        if base.endswith(".weight") or base.endswith("_weight"):
            parts = [_sanitize(p) for p in base[: -len(".weight")].split(".")]
        else:
            parts = ["layers", _sanitize(node.name or f"{node.op_type}_{len(self.module._steps)}")]
        owner = self.module
        for p in parts[:-1]:
            child = getattr(owner, p, None) if p in owner._modules else None
            if child is None:
                child = torch.nn.Module()
                owner.add_module(p, child)
            owner = child
        name, n = parts[-1], 1
        while name in owner._modules or hasattr(owner, name):
            name, n = f"{parts[-1]}_{n}", n + 1
        owner.add_module(name, layer)

    def _weight(self, name: str):
        return self.torch.nn.Parameter(self.constants[name].clone())

    def _conv(self, node, attrs) -> None:
        torch = self.torch
        w = self.constants[node.input[1]]
        dims = w.dim() - 2
        if dims not in (1, 2, 3):
            raise InvalidInput(f"{self.where}: Conv at node {node.name!r} is {dims}-D; the converter handles 1-3-D",
                               hint="only 1-D, 2-D and 3-D convolutions convert")
        pads, pre = _padding(attrs, dims, node, self.where)
        cls = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[dims - 1]
        bias = len(node.input) > 2 and bool(node.input[2])
        group = int(attrs.get("group", 1))
        with torch.device("meta"):  # the real weights are assigned just below
            layer = cls(w.shape[1] * group, w.shape[0], tuple(w.shape[2:]), stride=tuple(attrs.get("strides") or [1] * dims),
                        padding=pads, dilation=tuple(attrs.get("dilations") or [1] * dims), groups=group, bias=bias)
        layer.weight = self._weight(node.input[1])
        if bias:
            layer.bias = self._weight(node.input[2])
        self._place(node.input[1], node, layer)
        self._step(_LayerStep(layer, _activation(node, attrs, self.where), pre), [node.input[0]], [node.output[0]])

    def _gemm(self, node, attrs) -> None:
        torch = self.torch
        b = self.constants[node.input[1]]
        if b.dim() != 2:
            raise InvalidInput(f"{self.where}: Gemm at node {node.name!r} has a {b.dim()}-D B", hint="B must be 2-D")
        weight = b if attrs.get("transB") else b.t()
        alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
        c = node.input[2] if len(node.input) > 2 and node.input[2] else None
        bias = None
        if c is not None:
            if c not in self.constants:
                raise InvalidInput(f"{self.where}: Gemm at node {node.name!r} adds a computed C",
                                   hint="the converter handles constant biases only")
            bias = (self.constants[c] * beta).reshape(-1).expand(weight.shape[0]).clone()
        with torch.device("meta"):
            layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
        layer.weight = torch.nn.Parameter((weight * alpha).contiguous().clone())
        if bias is not None:
            layer.bias = torch.nn.Parameter(bias)
        self._place(node.input[1], node, layer)
        self._step(_LayerStep(layer, _activation(node, attrs, self.where)), [node.input[0]], [node.output[0]])

    def _norm(self, node, attrs) -> None:
        eps = float(attrs.get("epsilon", 1e-5))
        if node.op_type == "BatchNormalization":
            scale, bias, mean, var = (self.constants[n] for n in node.input[1:5])
            layer = _batch_norm_class()(scale.clone(), bias.clone(), mean.clone(), var.clone(), eps,
                                        1.0 - float(attrs.get("momentum", 0.9)))
        else:
            axis = int(attrs.get("axis", -1))
            scale = self.constants[node.input[1]]
            bias = self.constants[node.input[2]] if len(node.input) > 2 and node.input[2] else None
            layer = _layer_norm_class()(scale.clone(), None if bias is None else bias.clone(), axis, eps)
        self._place(node.input[1], node, layer)
        self._step(_LayerStep(layer), [node.input[0]], [node.output[0]])

    def _register_constants(self) -> None:
        """The constants steps still read: parameters (names ending in weight/bias) or buffers."""
        torch = self.torch
        used = {n for _, ins, _ in self.module._steps for n in ins} | set(self.module.output_names)
        holder = torch.nn.Module()
        names: set[str] = set()
        for name in sorted(used):
            if name not in self.constants:
                continue
            value = self.constants[name]
            if isinstance(value, torch.Tensor) and name not in self.tensor_reads and name not in \
                    self.module.output_names and not value.is_floating_point():
                # a shape or axes: a Python list, so torch.export sees constants, not a buffer's data
                value = [int(v) for v in value.reshape(-1).tolist()]
            if not isinstance(value, torch.Tensor):
                self.module._static[name] = value
                continue
            attr, n = _sanitize(name), 1
            while attr in names or hasattr(holder, attr):  # a constant called `half` is not Module.half
                attr, n = f"{_sanitize(name)}_{n}", n + 1
            names.add(attr)
            if value.is_floating_point() and re.search(r"(weight|bias)$", name):
                holder.register_parameter(attr, torch.nn.Parameter(value.clone()))
            else:
                holder.register_buffer(attr, value.clone())
            self.module._consts[name] = (holder, attr)
        if names:
            self.module.add_module("constants", holder)


def _attributes(node) -> dict[str, Any]:
    import onnx

    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def _padding(attrs: dict, dims: int, node, where: str):
    """(padding for the layer, an F.pad to run first or None) from ONNX pads/auto_pad."""
    auto = attrs.get("auto_pad", "NOTSET")
    if auto == "VALID":
        return 0, None
    if auto not in ("NOTSET", ""):
        raise InvalidInput(f"{where}: auto_pad={auto} at node {node.name!r} is not supported",
                           hint="export with explicit pads")
    pads = list(attrs.get("pads") or [0] * (2 * dims))
    begin, end = pads[:dims], pads[dims:]
    if begin == end:
        return tuple(begin), None
    import torch

    flat = [p for b, e in reversed(list(zip(begin, end))) for p in (b, e)]  # F.pad: last dim first
    return 0, lambda x: torch.nn.functional.pad(x, flat)


def _activation(node, attrs: dict, where: str) -> Callable | None:
    """FusedConv / FusedGemm's fused activation (com.microsoft), or None."""
    if node.op_type not in ("FusedConv", "FusedGemm"):
        return None
    import torch

    name = attrs.get("activation", "")
    params = list(attrs.get("activation_params") or [])
    F = torch.nn.functional
    if name == "Relu":
        return F.relu
    if name == "Sigmoid":
        return torch.sigmoid
    if name == "Tanh":
        return torch.tanh
    if name == "LeakyRelu":
        return lambda x: F.leaky_relu(x, params[0] if params else 0.01)
    if name == "Clip" and len(params) == 2:
        return lambda x: torch.clamp(x, params[0], params[1])
    if not name:
        return None
    raise InvalidInput(f"{where}: unsupported op {node.op_type} activation {name} at node {node.name!r}",
                       hint="fused activations handled: Relu, Sigmoid, Tanh, LeakyRelu, Clip")


def _fake_quant(builder: _Builder, q, dq) -> Callable:
    """QuantizeLinear → DequantizeLinear on an activation as one fake-quantize step."""
    import torch

    consts = builder.constants
    scale, zero = consts.get(q.input[1]), consts.get(q.input[2]) if len(q.input) > 2 and q.input[2] else None
    if scale is None or scale.numel() != 1:
        raise InvalidInput(f"{builder.where}: unsupported op QuantizeLinear at node {q.name!r} (a computed or "
                           "per-channel activation scale)", hint="quantize activations per tensor")
    signed = zero is not None and zero.dtype == torch.int8
    qmin, qmax = (-128, 127) if signed else (0, 255)
    s, z = float(scale.reshape(())), int(zero.reshape(()).item()) if zero is not None else 0

    def fake_quantize(module, xs):
        x = xs[0]
        q = (torch.clamp(torch.round(x.detach() / s) + z, qmin, qmax) - z) * s
        # the quantized value forward, the identity backward (straight-through); written out
        # rather than torch.fake_quantize_per_tensor_affine, which torch.export cannot trace
        return (q + (x - x.detach()),)

    return fake_quantize


def _functional(op: str, a: dict, node, b: _Builder) -> Callable:
    """The step computing a node from its input values: fn(module, [tensors]) -> outputs."""
    import torch

    F = torch.nn.functional
    one = {
        "Relu": F.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Erf": torch.erf, "Exp": torch.exp,
        "Log": torch.log, "Sqrt": torch.sqrt, "Neg": torch.neg, "Abs": torch.abs, "Reciprocal": torch.reciprocal,
        "Floor": torch.floor, "Ceil": torch.ceil, "Softplus": F.softplus, "Identity": lambda x: x,
    }
    two = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": _div, "Pow": torch.pow,
           "MatMul": torch.matmul, "Equal": torch.eq, "Greater": torch.gt, "Less": torch.lt,
           "Max": torch.maximum, "Min": torch.minimum}
    if op in one:
        f = one[op]
        return lambda m, xs: (f(xs[0]),)
    if op in two:
        f = two[op]
        return lambda m, xs: (f(xs[0], xs[1]),)
    if op == "LeakyRelu":
        alpha = float(a.get("alpha", 0.01))
        return lambda m, xs: (F.leaky_relu(xs[0], alpha),)
    if op == "Elu":
        alpha = float(a.get("alpha", 1.0))
        return lambda m, xs: (F.elu(xs[0], alpha),)
    if op == "Clip":
        lo, hi = a.get("min"), a.get("max")
        return lambda m, xs: (torch.clamp(xs[0], _scalar(xs, 1, lo), _scalar(xs, 2, hi)),)
    if op in ("Gelu", "FastGelu"):
        approx = "tanh" if op == "FastGelu" or a.get("approximate") == "tanh" else "none"
        if op == "FastGelu" and len(node.input) > 1 and node.input[1]:
            return lambda m, xs: (F.gelu(xs[0] + xs[1], approximate=approx),)
        return lambda m, xs: (F.gelu(xs[0], approximate=approx),)
    if op in ("Softmax", "LogSoftmax"):
        axis = int(a.get("axis", -1))
        f = torch.softmax if op == "Softmax" else torch.log_softmax
        return lambda m, xs: (f(xs[0], axis),)
    if op in ("MaxPool", "AveragePool"):
        return _pool(op, a, node, b)
    if op == "GlobalAveragePool":
        return lambda m, xs: (xs[0].mean(dim=tuple(range(2, xs[0].dim())), keepdim=True),)
    if op == "GlobalMaxPool":
        return lambda m, xs: (xs[0].amax(dim=tuple(range(2, xs[0].dim())), keepdim=True),)
    if op == "Flatten":
        axis = int(a.get("axis", 1))
        return lambda m, xs: (_flatten(xs[0], axis),)
    if op == "Reshape":
        allowzero = bool(a.get("allowzero", 0))
        return lambda m, xs: (_reshape(xs[0], xs[1], allowzero),)
    if op == "Transpose":
        perm = a.get("perm")
        return lambda m, xs: (xs[0].permute(*(perm if perm is not None else reversed(range(xs[0].dim())))),)
    if op == "Dropout":
        ratio = float(a.get("ratio", 0.5))  # opset < 12 attribute; later an input (default 0.5)
        return lambda m, xs: (F.dropout(xs[0], _scalar(xs, 1, ratio), m.training),)
    if op == "Concat":
        axis = int(a["axis"])
        return lambda m, xs: (torch.cat([x for x in xs if x is not None], axis),)
    if op in ("Squeeze", "Unsqueeze"):
        return _squeeze(op, a)
    if op == "Cast":
        dtype = _torch_dtype(int(a["to"]), node, b.where)
        return lambda m, xs: (xs[0].to(dtype),)
    if op == "Shape":
        start, end = a.get("start", 0), a.get("end")
        return lambda m, xs: (torch.tensor(list(xs[0].shape)[start:end], dtype=torch.int64),)
    if op == "Gather":
        axis = int(a.get("axis", 0))
        return lambda m, xs: (_gather(xs[0], xs[1], axis),)
    if op in ("ReduceMean", "ReduceSum"):
        keep = bool(a.get("keepdims", 1))
        attr_axes = a.get("axes")
        noop = bool(a.get("noop_with_empty_axes", 0))
        f = torch.mean if op == "ReduceMean" else torch.sum
        return lambda m, xs: (_reduce(f, xs[0], attr_axes if attr_axes is not None else _maybe_list(xs, 1), keep,
                                      noop),)
    if op == "Where":
        return lambda m, xs: (torch.where(xs[0].bool(), xs[1], xs[2]),)
    if op == "DequantizeLinear":
        axis = int(a.get("axis", 1))
        return lambda m, xs: (_dequantize(xs, axis),)
    if op == "QuantizeLinear":
        axis = int(a.get("axis", 1))
        return lambda m, xs: (_quantize(xs, axis),)
    if op == "DynamicQuantizeLinear":
        from zoo.onnx_to_torch_quant import dynamic_quantize_linear

        return dynamic_quantize_linear()
    if op == "MatMulInteger":
        from zoo.onnx_to_torch_quant import matmul_integer

        return matmul_integer()
    raise InvalidInput(f"{b.where}: unsupported op {op} at node {node.name or '(unnamed)'!r} (here with a "
                       "computed weight)", hint="the converter handles Conv/Gemm/norms with constant weights")


def _div(x, y):
    import torch

    if not x.is_floating_point() and not y.is_floating_point():
        return torch.div(x, y, rounding_mode="trunc")
    return torch.div(x, y)


def _scalar(xs: list, i: int, default):
    if len(xs) > i and xs[i] is not None:
        return xs[i].item() if hasattr(xs[i], "item") else xs[i]
    return default


def _maybe_list(xs: list, i: int):
    return _ints(xs[i]) if len(xs) > i and xs[i] is not None else None


def _ints(value) -> list[int]:
    """A shape or axes input as ints: a list folded at conversion, or a tensor computed at run time."""
    return list(value) if isinstance(value, list) else [int(v) for v in value.tolist()]


def _flatten(x, axis: int):
    if axis < 0:
        axis += x.dim()
    if axis == 0:
        return x.reshape(1, -1)
    return x.flatten(axis).flatten(0, axis - 1) if axis > 1 else x.flatten(1)


def _reshape(x, shape, allowzero: bool):
    dims = _ints(shape)
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _gather(x, idx, axis: int):
    import torch

    if idx.dim() == 0:
        return x.select(axis, int(idx) if int(idx) >= 0 else int(idx) + x.shape[axis])
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    return torch.index_select(x, axis, idx.reshape(-1)).reshape(
        *x.shape[:axis], *idx.shape, *x.shape[axis + 1:])


def _reduce(f, x, axes, keep: bool, noop: bool):
    if not axes:
        if noop:
            return x
        axes = list(range(x.dim()))
    return f(x, dim=tuple(axes), keepdim=keep)


def _squeeze(op: str, a: dict) -> Callable:
    attr_axes = a.get("axes")

    def fn(m, xs):
        x = xs[0]
        axes = attr_axes if attr_axes is not None else _maybe_list(xs, 1)
        if op == "Squeeze":
            if axes is None:
                return (x.squeeze(),)
            return (x.squeeze(tuple(ax % x.dim() for ax in axes)),)
        out_rank = x.dim() + len(axes)
        for ax in sorted(ax % out_rank for ax in axes):
            x = x.unsqueeze(ax)
        return (x,)

    return fn


def _per_axis(t, x, axis: int):
    """A scale or zero point shaped to broadcast along `axis` of `x` (per-channel), or as is."""
    if t.dim() == 1 and t.numel() > 1:
        shape = [1] * x.dim()
        shape[axis % x.dim()] = t.numel()
        return t.reshape(shape)
    return t


def _dequantize(xs: list, axis: int):
    import torch

    x, scale = xs[0], xs[1]
    zero = xs[2] if len(xs) > 2 and xs[2] is not None else torch.zeros((), dtype=x.dtype)
    scale, zero = _per_axis(scale, x, axis), _per_axis(zero, x, axis)
    return ((x.to(torch.float32) - zero.to(torch.float32)) * scale).to(scale.dtype)


def _quantize(xs: list, axis: int):
    import torch

    x, scale = xs[0], xs[1]
    zero = xs[2] if len(xs) > 2 and xs[2] is not None else torch.zeros((), dtype=torch.uint8)
    lo, hi = (-128, 127) if zero.dtype == torch.int8 else (0, 255)
    scale, zf = _per_axis(scale, x, axis), _per_axis(zero, x, axis).to(torch.float32)
    q = torch.clamp(torch.round(x / scale) + zf, lo, hi)
    return q.to(zero.dtype)


def _pool(op: str, a: dict, node, b: _Builder) -> Callable:
    import torch

    F = torch.nn.functional
    kernel = list(a["kernel_shape"])
    dims = len(kernel)
    strides = list(a.get("strides") or [1] * dims)
    pads, pre = _padding(a, dims, node, b.where)
    ceil = bool(a.get("ceil_mode", 0))
    if op == "MaxPool":
        if len(node.output) > 1 and node.output[1]:
            raise InvalidInput(f"{b.where}: unsupported op MaxPool with indices at node {node.name!r}",
                               hint="the converter handles MaxPool's first output only")
        dilation = list(a.get("dilations") or [1] * dims)
        f = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[dims - 1]
        if pre is not None:
            return lambda m, xs: (f(_pad_with(pre, xs[0], float("-inf")), kernel, strides, 0, dilation, ceil),)
        return lambda m, xs: (f(xs[0], kernel, strides, pads, dilation, ceil),)
    include = bool(a.get("count_include_pad", 0))
    if pre is not None and not include:
        raise InvalidInput(f"{b.where}: AveragePool with uneven pads at node {node.name!r} is not supported",
                           hint="export with even pads")
    f = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[dims - 1]
    if pre is not None:
        return lambda m, xs: (f(pre(xs[0]), kernel, strides, 0, ceil, True),)
    return lambda m, xs: (f(xs[0], kernel, strides, pads, ceil, include),)


def _pad_with(pre, x, value):
    """`pre` (a zero F.pad) with `value` in the padding instead (-inf around a max pool)."""
    import torch

    mask = pre(torch.ones_like(x))
    return torch.where(mask.bool(), pre(x), torch.full_like(mask, value))


def _torch_dtype(to: int, node, where: str):
    import torch

    name = _DTYPES.get(to)
    if name is None:
        raise InvalidInput(f"{where}: Cast to ONNX type {to} at node {node.name!r} is not supported",
                           hint=f"types handled: {', '.join(_DTYPES.values())}")
    return getattr(torch, name)


@lru_cache(maxsize=1)
def _batch_norm_class():
    import torch

    class BatchNorm(torch.nn.Module):
        """ONNX BatchNormalization with torch's names (weight, bias, running_mean, running_var)."""

        def __init__(self, weight, bias, mean, var, eps: float, momentum: float):
            super().__init__()
            self.weight, self.bias = torch.nn.Parameter(weight), torch.nn.Parameter(bias)
            self.register_buffer("running_mean", mean)
            self.register_buffer("running_var", var)
            self.eps, self.momentum = eps, momentum

        def forward(self, x):
            return torch.nn.functional.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                                  self.training, self.momentum, self.eps)

    return BatchNorm


@lru_cache(maxsize=1)
def _layer_norm_class():
    import torch

    class LayerNorm(torch.nn.Module):
        """ONNX LayerNormalization over the axes from `axis` on, with torch's names (weight, bias)."""

        def __init__(self, weight, bias, axis: int, eps: float):
            super().__init__()
            self.weight = torch.nn.Parameter(weight)
            self.bias = None if bias is None else torch.nn.Parameter(bias)
            self.axis, self.eps = axis, eps

        def forward(self, x):
            axis = self.axis % x.dim()
            return torch.nn.functional.layer_norm(x, tuple(x.shape[axis:]), self.weight, self.bias, self.eps)

    return LayerNorm
