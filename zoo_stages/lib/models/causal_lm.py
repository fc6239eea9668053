"""Causal language models (``*ForCausalLM`` of ``framework: transformers``) as decoders with a KV cache.

Which families zoo exports as generative builds (`FAMILIES`: Llama, Qwen2, Qwen3, Phi3, each with
the model type onnxruntime-genai's genai_config.json names), the module torch.onnx traces
(`CacheModule`: the architecture's own forward on zoo's decoder ports, `zoo/decoder_io.py`: the
flat ``past_key_values.N.key/value`` tensors rebuilt into transformers' `DynamicCache`, the
``logits`` and ``present.N.key/value`` returned), and the export itself (`export`: named ports,
dynamic ``batch_size``, ``sequence_length``, ``past_sequence_length`` and
``total_sequence_length``).

Which torch exporter: both of torch.onnx's handle the cache this way with torch 2.13 and
transformers 5.23 (checked on a tiny Llama: prompts with an empty cache, single-token steps and
several-token steps after a cache, batch 1 and 2, all within 3e-7 of transformers). dynamo is the
default (torch's own, the TorchScript tracer is deprecated); ``exporter: torchscript`` is kept
for models dynamo cannot trace (it exports the tiny Llama in 0.25 s against dynamo's 9 s).

torch and transformers are imported inside functions.
"""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, Mapping

# architecture -> the model type of onnxruntime-genai's genai_config.json (its builder's name too)
FAMILIES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Phi3ForCausalLM": "phi3",
}
BATCH, SEQUENCE, PAST, TOTAL = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"
DEFAULT_EXPORTER = "dynamo"
DEFAULT_OPSET = {"dynamo": 18, "torchscript": 17}


def is_causal_lm(architecture: str | None) -> bool:
    """Whether a transformers class name is a causal language model (exported with a KV cache)."""
    return bool(architecture) and str(architecture).endswith("ForCausalLM")


def unsupported(architecture: str) -> str | None:
    """Why a causal LM cannot be exported as a generative build (None: it can)."""
    if architecture in FAMILIES:
        return None
    return (f"{architecture} is not among the causal LM families zoo exports with a KV cache "
            f"({', '.join(sorted(FAMILIES))})")


@dataclass(frozen=True)
class Geometry:
    """What the cache looks like: layers, key/value heads and the head size."""

    layers: int
    kv_heads: int
    head_size: int
    vocab_size: int

    @classmethod
    def of(cls, config: Any) -> "Geometry":
        heads = int(config.num_attention_heads)
        head_size = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(int(config.num_hidden_layers), int(getattr(config, "num_key_value_heads", None) or heads),
                   head_size, int(config.vocab_size))

    def past_names(self) -> list[str]:
        return [f"past_key_values.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")]

    def present_names(self) -> list[str]:
        return [f"present.{i}.{kv}" for i in range(self.layers) for kv in ("key", "value")]


INPUTS = ("input_ids", "attention_mask", "position_ids")


def cache_module(model: Any) -> Any:
    """`model` (a ``*ForCausalLM``, zoo's positional subclass or transformers' own class) as a module
    whose forward takes zoo's decoder inputs positionally (input_ids, attention_mask,
    position_ids, then past_key_values.N.key/value in layer order) and returns (logits,
    present.0.key, present.0.value, ...)."""
    import torch

    from transformers import DynamicCache

    own = next(c for c in type(model).__mro__ if c.__module__.startswith("transformers."))
    layers = Geometry.of(model.config).layers

    class CacheModule(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache([(past[2 * i], past[2 * i + 1]) for i in range(layers)], config=self.inner.config)
            out = own.forward(self.inner, input_ids=input_ids, attention_mask=attention_mask,
                              position_ids=position_ids, past_key_values=cache, use_cache=True, return_dict=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return CacheModule(model).eval()


def example(geometry: Geometry, seed: int = 0) -> tuple[Any, ...]:
    """The traced example: batch 2, 3 new tokens after 4 cached ones (sizes of 0 and 1 would be
    specialised by torch.export; the graph still takes them, the parity gate runs them)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    batch, new, cached = 2, 3, 4
    ids = torch.randint(0, geometry.vocab_size, (batch, new), generator=gen)
    mask = torch.ones(batch, cached + new, dtype=torch.int64)
    pos = torch.arange(cached, cached + new, dtype=torch.int64).expand(batch, new).contiguous()
    past = [torch.randn(batch, geometry.kv_heads, cached, geometry.head_size, generator=gen)
            for _ in range(2 * geometry.layers)]
    return (ids, mask, pos, *past)


def export(model: Any, exporter: str, opset: int, work: Any) -> Any:
    """The ModelProto of `model` with a KV cache (zoo's decoder ports, dynamic dimensions named as
    onnxruntime-genai names them), exported by torch.onnx's `exporter` (dynamo or torchscript)."""
    import shutil
    import warnings
    from pathlib import Path

    import onnx
    import torch

    geometry = Geometry.of(model.config)
    module = cache_module(model)
    args = example(geometry)
    names = [*INPUTS, *geometry.past_names()]
    outputs = ["logits", *geometry.present_names()]
    work = Path(work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    raw = work / "raw.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        warnings.simplefilter("ignore", category=UserWarning)
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        if exporter == "dynamo":
            b, s, p, t = (torch.export.Dim(n) for n in (BATCH, SEQUENCE, PAST, TOTAL))
            dynamic = ({0: b, 1: s}, {0: b, 1: t}, {0: b, 1: s}, tuple({0: b, 2: p} for _ in geometry.past_names()))
            torch.onnx.export(module, args, str(raw), dynamo=True, external_data=False, input_names=names,
                              output_names=outputs, opset_version=opset, dynamic_shapes=dynamic, optimize=True,
                              verbose=False)
        else:
            axes: dict[str, dict[int, str]] = {"input_ids": {0: BATCH, 1: SEQUENCE},
                                               "attention_mask": {0: BATCH, 1: TOTAL},
                                               "position_ids": {0: BATCH, 1: SEQUENCE},
                                               "logits": {0: BATCH, 1: SEQUENCE}}
            axes.update({n: {0: BATCH, 2: PAST} for n in geometry.past_names()})
            axes.update({n: {0: BATCH, 2: TOTAL} for n in geometry.present_names()})
            torch.onnx.export(module, args, str(raw), dynamo=False, input_names=names, output_names=outputs,
                              opset_version=opset, dynamic_axes=axes, do_constant_folding=True)
    proto = onnx.load(str(raw))
    name_dimensions(proto)
    name_weight_nodes(proto)
    return proto


def name_weight_nodes(proto: Any) -> None:
    """Name each node that reads a weight (a MatMul's or Gemm's constant matrix, a Gather's table)
    after the module it comes from, as onnxruntime-genai's builder names them: ``/lm_head/MatMul``,
    ``/model/layers.0/self_attn/q_proj/MatMul``, ``/model/embed_tokens/Gather``. Dynamo calls them
    ``node_linear_14``; with module names, quantize's `exclude`/`keep_8bit` patterns (``*lm_head*``)
    mean the same layers for either exporter. The module path is read from the node's
    ``pkg.torch.onnx.name_scopes`` metadata (dropped later with the rest); a node without it keeps
    its name. TorchScript's names are module paths already."""
    import ast

    weights = {i.name for i in proto.graph.initializer}
    taken = {n.name for n in proto.graph.node}
    for node in proto.graph.node:
        reads = node.input[1] if node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 else \
            node.input[0] if node.op_type == "Gather" and node.input else None
        if reads not in weights:
            continue
        scopes = next((m.value for m in node.metadata_props if m.key == "pkg.torch.onnx.name_scopes"), None)
        try:
            modules = [x for x in ast.literal_eval(scopes) if isinstance(x, str) and x.startswith("inner.")]
        except (ValueError, SyntaxError):
            continue
        if not modules:
            continue
        path = re.sub(r"/(\d+)(?=/|$)", r".\1", modules[-1].removeprefix("inner.").replace(".", "/"))  # layers.0
        base = f"/{path}/{node.op_type}"
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.discard(node.name)
        taken.add(name)
        node.name = name


def name_dimensions(proto: Any) -> None:
    """The convention's dimension names on every port: dynamo names the present length
    ``past_sequence_length + sequence_length``, the TorchScript exporter may invent names."""
    for value in (*proto.graph.input, *proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        name = value.name
        wanted: dict[int, str] = {0: BATCH}
        if name in ("input_ids", "position_ids", "logits"):
            wanted[1] = SEQUENCE
        elif name == "attention_mask":
            wanted[1] = TOTAL
        elif name.startswith("past_key_values."):
            wanted[2] = PAST
        elif name.startswith("present."):
            wanted[2] = TOTAL
        for j, dim_name in wanted.items():
            if j < len(dims) and not dims[j].HasField("dim_value"):
                dims[j].Clear()
                dims[j].dim_param = dim_name


def reference_greedy(model: Any, prompt: Any, new_tokens: int) -> tuple[list[int], list[Any]]:
    """transformers' ``generate(do_sample=False)`` of `new_tokens` tokens after `prompt` (a 1-D
    int64 numpy array): (the tokens, the logits of each step as numpy [vocab]). End-of-text does
    not stop it (the ONNX loop runs as many steps)."""
    import numpy as np
    import torch

    from transformers import GenerationConfig

    own = next(c for c in type(model).__mro__ if c.__module__.startswith("transformers."))
    ids = torch.from_numpy(np.asarray(prompt, dtype=np.int64)[None, :])
    config = GenerationConfig(do_sample=False, max_new_tokens=int(new_tokens), min_new_tokens=0, eos_token_id=None,
                              pad_token_id=0, num_beams=1, use_cache=True, return_dict_in_generate=True,
                              output_logits=True)
    # generate() calls the model by keyword: zoo's positional subclass (hf_models) steps aside meanwhile
    cls = type(model)
    model.__class__ = own
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    finally:
        model.__class__ = cls
    tokens = [int(t) for t in out.sequences[0, ids.shape[1]:]]
    return tokens, [step[0].numpy().astype(np.float32) for step in out.logits]


def reference_prefill(model: Any, prompts: Any) -> Any:
    """transformers' logits of a batch of prompts ([batch, length] int64 numpy), no cache."""
    import numpy as np
    import torch

    own = next(c for c in type(model).__mro__ if c.__module__.startswith("transformers."))
    ids = torch.from_numpy(np.asarray(prompts, dtype=np.int64))
    with torch.no_grad():
        out = own.forward(model, input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False, return_dict=True)
    return out.logits.numpy()


def family_of(config: Mapping[str, Any] | Any) -> str | None:
    """The genai model type of a config (its ``architectures[0]``)."""
    names = (config.get("architectures") if isinstance(config, Mapping) else getattr(config, "architectures", None)) \
        or []
    return FAMILIES.get(str(names[0])) if names else None
