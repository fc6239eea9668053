"""The quantized operators `zoo.onnx_to_torch` turns back into float torch: what each computes,
from the operator specifications, and a record of what was dequantized.

- ``com.microsoft::MatMulNBits`` (onnxruntime's blockwise weight-only quantization; zoo's
  ``linear: blockwise``, onnxruntime's MatMulNBitsQuantizer): ``Y = A @ W^T (+ bias)`` with W (N, K)
  dequantized from B, uint8 (N, blocks, block_size * bits / 8), the ``bits``-wide values packed
  low bits first, ``W[n, k] = (q - zero_point) * scale`` per block of ``block_size`` inputs;
  scales (N * blocks) float; zero points uint8 packed the same way, ``ceil(blocks * bits / 8)``
  bytes per row, or absent (``2^(bits-1)``). It becomes an ``nn.Linear`` holding W as a float32
  parameter. Float zero points and ``g_idx`` (act-order) are refused.
- ``DynamicQuantizeLinear`` + ``MatMulInteger`` (onnxruntime's dynamic quantization): computed as
  the ONNX specification says, in float32 (uint8 activations quantized per batch with a computed
  scale and zero point, integer products summed exactly below 2^24), the rounding passing
  gradients straight through. The int8 weights stay int8 buffers: the module computes what the
  build computes, and only the float parts around them train.

`Dequantized` counts what a conversion did; the converter puts its lines on the module
(``module.dequantized``) and `zoo.api.load_torch` logs them. torch and numpy are imported inside
functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from zoo.errors import InvalidInput

HANDLED = ("MatMulNBits", "DynamicQuantizeLinear", "MatMulInteger")


@dataclass
class Dequantized:
    """What a conversion turned from quantized into float: one counter per kind."""

    counts: dict[str, int] = field(default_factory=dict)

    def add(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def lines(self) -> list[str]:
        return [f"{what} x{n}" for what, n in sorted(self.counts.items())]


def unpack(packed: Any, bits: int, count: int) -> Any:
    """uint8 rows of `bits`-wide values packed low bits first -> the first `count` values per row (int32)."""
    import numpy as np

    if bits not in (2, 4, 8):
        raise ValueError(f"{bits}-bit values")
    rows = np.asarray(packed, dtype=np.uint8).reshape(packed.shape[0], -1)
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).reshape(1, 1, per_byte)
    values = (rows[:, :, None] >> shifts) & np.uint8((1 << bits) - 1)
    return values.reshape(rows.shape[0], -1)[:, :count].astype(np.int32)


def matmul_nbits_weight(b: Any, scales: Any, zero_points: Any, *, k: int, n: int, bits: int,
                        block_size: int) -> Any:
    """The float32 (N, K) weight a MatMulNBits node's B, scales and zero points encode."""
    import numpy as np

    blocks = -(-k // block_size)
    q = unpack(np.asarray(b).reshape(n, -1), bits, blocks * block_size).reshape(n, blocks, block_size)
    s = np.asarray(scales, dtype=np.float32).reshape(n, blocks, 1)
    if zero_points is None:
        zp = np.full((n, blocks, 1), 1 << (bits - 1), dtype=np.int32)
    else:
        zp = unpack(np.asarray(zero_points).reshape(n, -1), bits, blocks).reshape(n, blocks, 1)
    return ((q - zp).astype(np.float32) * s).reshape(n, blocks * block_size)[:, :k]


def matmul_nbits_layer(node: Any, attrs: dict, constants: dict, where: str) -> tuple[Any, str]:
    """(nn.Linear with the dequantized weight and the node's bias, what it was) for a MatMulNBits node."""
    import numpy as np
    import torch

    name = f"node {node.name or '(unnamed)'!r}"
    ins = list(node.input) + [""] * (6 - len(node.input))
    b_name, scales_name, zp_name, g_idx, bias_name = ins[1], ins[2], ins[3], ins[4], ins[5]
    if b_name not in constants or scales_name not in constants:
        raise InvalidInput(f"{where}: com.microsoft::MatMulNBits at {name} has a computed weight or scale",
                           hint="only constant (initializer) weights dequantize")
    if g_idx:
        raise InvalidInput(f"{where}: com.microsoft::MatMulNBits at {name} has g_idx (act-order), which the "
                           "torch converter does not dequantize")
    zero_points = constants.get(zp_name) if zp_name else None
    if zp_name and zero_points is None:
        raise InvalidInput(f"{where}: com.microsoft::MatMulNBits at {name} has computed zero points")
    if zero_points is not None and zero_points.dtype != torch.uint8:
        raise InvalidInput(f"{where}: com.microsoft::MatMulNBits at {name} has float zero points, which the "
                           "torch converter does not dequantize", hint="only packed uint8 zero points are handled")
    k, n, bits, block = (int(attrs[a]) for a in ("K", "N", "bits", "block_size"))
    if bits not in (2, 4, 8):
        raise InvalidInput(f"{where}: com.microsoft::MatMulNBits at {name} packs {bits}-bit weights; the torch "
                           "converter unpacks 2, 4 and 8 bits")
    weight = matmul_nbits_weight(constants[b_name].numpy(), constants[scales_name].float().numpy(),
                                 None if zero_points is None else zero_points.numpy(),
                                 k=k, n=n, bits=bits, block_size=block)
    bias = constants.get(bias_name) if bias_name else None
    if bias_name and bias is None:
        raise InvalidInput(f"{where}: com.microsoft::MatMulNBits at {name} adds a computed bias")
    with torch.device("meta"):
        layer = torch.nn.Linear(k, n, bias=bias is not None)
    layer.weight = torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(weight)))
    if bias is not None:
        layer.bias = torch.nn.Parameter(bias.float().reshape(n).clone())
    return layer, f"MatMulNBits ({bits}-bit, block {block}) -> float32 Linear weight"


def dynamic_quantize_linear() -> Callable:
    """DynamicQuantizeLinear (ONNX): uint8 y, float scale, uint8 zero point of x, as float tensors
    (y's rounding passes gradients straight through)."""
    import torch

    def step(module, xs):
        x = xs[0]
        lo = torch.clamp(x.detach().min(), max=0.0)
        hi = torch.clamp(x.detach().max(), min=0.0)
        scale = (hi - lo) / 255.0
        safe = torch.where(scale == 0, torch.ones_like(scale), scale)
        zero = torch.clamp(torch.round(-lo / safe), 0, 255)
        exact = x / safe + zero
        y = torch.clamp(torch.round(exact.detach()), 0, 255)
        return (y + (exact - exact.detach()), scale, zero)

    return step


def matmul_integer() -> Callable:
    """MatMulInteger (ONNX): (A - a_zero_point) @ (B - b_zero_point), summed in float32."""
    import torch

    def step(module, xs):
        a, b = xs[0], xs[1]
        a_zero = xs[2] if len(xs) > 2 and xs[2] is not None else 0
        b_zero = xs[3] if len(xs) > 3 and xs[3] is not None else 0
        a = a.to(torch.float32) - (a_zero.to(torch.float32) if torch.is_tensor(a_zero) else a_zero)
        if torch.is_tensor(b_zero) and b_zero.dim() == 1 and b_zero.numel() > 1:  # per column of B
            b_zero = b_zero.reshape(1, -1)
        b = b.to(torch.float32) - (b_zero.to(torch.float32) if torch.is_tensor(b_zero) else b_zero)
        return (torch.matmul(a, b),)

    return step
