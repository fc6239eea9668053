"""The torch exporter: the recipe's torch architecture (``model.arch`` or ``model.entry``) with
the checkpoint's or the fetched ``weights:``'s tensors, exported to ONNX (the export kind's
docstring, `zoo_stages.export`, says what a recipe gets).

torch's dynamo exporter (torch.export + onnxscript, torch's default since 2.9) builds opset 18,
its lowest, and onnx's version converter takes the optimised graph down to a lower configured
``opset`` (`_convert_opset`); ``exporter: torchscript`` runs the deprecated TorchScript tracer
(constant folding; opset 17 by default). Without ``exporter:`` the architecture decides
(`archs.default_exporter`). Below protobuf's 2 GB limit the model is taken in memory; above it
both exporters write external data (`zoo_stages.lib.onnx.export_io`). The exported graph's inputs are
the architecture's, with the recipe's declared shapes or the data's (`_ports`), and the parity
gate runs onnxruntime and torch on the same seeded random inputs.
"""

from __future__ import annotations

import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import GateFailed, InvalidInput
from zoo.stage import StageContext
from zoo_stages.exporters.base import ExportJob, Exporter, ModelFieldError, refuse_transformers_fields
from zoo_stages.lib.models import checkpoints
from zoo_stages.lib.onnx import export_io, onnx_io

DYNAMO_MIN_OPSET = 18  # the lowest opset torch's dynamo exporter implements; lower ones are converted down
# the export kind's config models (zoo_stages.export's ExportConfig, ParityConfig, WeightsRef): the kind
# imports its exporters, never the reverse, so their fields are read here without importing the classes
ExportConfig = ParityConfig = WeightsRef = Any


class TorchExporter(Exporter):
    name = "torch"
    extra = "torch"
    modules = ("torch", "safetensors")
    tools = ("torch", "onnxscript", "safetensors", "numpy")
    summary = "torch.nn.Module (built-in arch or model.entry) via torch.onnx"

    @classmethod
    def tools_for(cls, model: Mapping[str, Any]) -> tuple[str, ...]:
        """`tools`, and transformers for the architecture it builds (bert), and onnx, whose converter
        turns a `model.from` parent into the torch network."""
        from zoo_stages.lib.models import archs

        extra = ("transformers",) if archs.modality(model) == "text" else ()
        return (*cls.tools, *extra, *(("onnx",) if model.get("from") else ()))

    @classmethod
    def check_model(cls, model: Mapping[str, Any]) -> None:
        for field in ("estimator", "params"):
            if model.get(field) is not None:
                raise ModelFieldError((field,), f"model.{field} applies to estimator frameworks (sklearn, lightgbm, "
                                                "xgboost), not to torch models",
                                      hint="set `framework:` to the estimator's framework, or remove the field")
        refuse_transformers_fields(model, cls.name)

    def export(self, job: ExportJob) -> None:
        _export_torch(job.source, job.label, job.config, job.context, job.target, job.props)


@dataclass(frozen=True)
class _Port:
    """One input of the exported graph: name, what it holds (`archs.ModelInput.holds`), element type,
    its dimensions (batch first; ints fixed, names dynamic) and the sizes of the example input."""

    name: str
    holds: str
    dtype: str
    dims: tuple[int | str, ...]
    example: tuple[int, ...]

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {j: d for j, d in enumerate(self.dims) if isinstance(d, str)}


def _export_torch(weights: Path, label: str, config: ExportConfig, context: StageContext, target: Path,
                  props: Mapping[str, str]) -> None:
    import numpy as np
    import torch

    from zoo_stages.lib.models import archs, finetune
    from zoo_stages.lib.quality import tasks

    model_section = _with_weights_arch(dict(context.shared.get("model") or {}), config.weights if label == "weights"
                                       else None)
    if config.exporter is None:
        config = config.model_copy(update={"exporter": archs.default_exporter(model_section)})
    if config.opset is None:
        config = config.model_copy(update={"opset": DYNAMO_MIN_OPSET if config.exporter == "dynamo" else 17})
    ports = _ports(config, context, model_section)
    out_name = model_section.get("output_name") or "logits"
    data = context.shared.get("data") or {}
    sizes = archs.data_sizes(model_section, data, context.recipe.dir,
                             regression=tasks.kind_of(context.shared.get("task") or "") == "regression",
                             width=int(np.prod(ports[0].example[1:])))
    if archs.modality(model_section) == "image":  # the channels of the shape exported (input_shape may differ)
        sizes["in_channels"] = ports[0].example[-1 if sizes["layout"] == "NHWC" else 1]
    vocab = int(model_section.get("vocab_size") or sizes.get("vocab_size") or 2)
    with _torch_threads(context.threads):
        model = checkpoints.build_with_weights(model_section, context.recipe.dir, weights, label,
                                               parent=finetune.parent(context.references), **sizes)
        work = context.work_dir / "export"
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        dummy = tuple(torch.from_numpy(a) for a in _example_inputs(ports, None, vocab, seed=0).values())
        proto, blob = _run_exporter(model, dummy, work / "raw.onnx", ports, out_name, config)
        if blob is not None and not export_io.needs_normalising(proto):
            # the exporter's own bytes, with the provenance entries written after the graph:
            # 233 MB are not serialised again (the parsed proto is kept for the metrics)
            blob = export_io.stamp_bytes(blob, proto, props)
        else:
            proto = export_io.normalise(proto)
            export_io.stamp(proto, props)
            blob = onnx_io.serialise(proto)
        feeds = _example_inputs(ports, config.parity.samples, vocab, seed=config.parity.seed)
        torch_feeds = [torch.from_numpy(a) for a in feeds.values()]
        if blob is None:  # above 2 GB: one step after the other, from files
            export_io.save_large(proto, target)
            got = _run_onnxruntime(target, feeds, context.threads)
            with torch.no_grad():
                expected = _flatten_outputs(model(*torch_feeds))
        else:
            # The checker, the write, onnxruntime's parity run and torch's all release the GIL:
            # run them side by side (1.2 s instead of 2.6 s for AlexNet-224 on 2 cores). The
            # checker's verdict is read first, so a malformed model is reported as such.
            with ThreadPoolExecutor(max_workers=3, thread_name_prefix="export") as pool:
                checked = pool.submit(export_io.check, blob)
                saved = pool.submit(onnx_io.save, proto, target, blob)
                onnx_run = pool.submit(_run_onnxruntime, blob, feeds, context.threads)
                with torch.no_grad():
                    expected = _flatten_outputs(model(*torch_feeds))
                checked.result()
                saved.result()
                got = onnx_run.result()

    report = _parity(expected, got, config.parity)
    context.metrics.update(export_io.describe(proto, target))
    context.metrics.update({
        "source": label,
        "exporter": config.exporter,
        "opset": config.opset,
        "input_shapes": {p.name: [d if isinstance(d, str) else int(d) for d in p.dims] for p in ports},
        "dynamic_batch": config.dynamic_batch,
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "parity": {**report.to_json(), "seed": config.parity.seed},
        "max_abs": report.max_abs,
        "max_rel": report.max_rel,
    })
    if label == "weights":
        context.metrics["weights"] = {"source": config.weights.location, "sha256": export_io.source_digest(weights)}
        if config.weights.catalog:
            context.metrics["weights"].update(catalog=config.weights.catalog,
                                              preprocessing=config.weights.preprocessing)
    report.require(f"ONNX output differs from torch beyond atol={config.parity.atol} rtol={config.parity.rtol}",
                   hint="a custom op may export incorrectly; try another opset or `exporter: dynamo`, "
                        "or loosen parity.atol/rtol if the difference is expected")
    context.log.info("exported %s (%s, opset %d): parity max_abs %.3g max_rel %.3g", target.name,
                     config.exporter, config.opset, context.metrics["max_abs"], context.metrics["max_rel"])


def _with_weights_arch(model_section: dict, weights: WeightsRef | None) -> dict:
    """The model section to build for `weights` that name their architecture (a catalog entry):
    its arch (the recipe's must agree) and classifier width (the file decides it)."""
    if weights is None or not weights.arch:
        return model_section
    if model_section.get("arch") not in (None, weights.arch) or model_section.get("entry"):
        raise InvalidInput(f"the weights {weights.catalog or weights.location} fit arch {weights.arch}, but the recipe's "
                           f"model is {model_section.get('arch') or model_section.get('entry')}",
                           hint=f"set `model.arch: {weights.arch}` (or drop it: the weights decide)")
    return {**model_section, "arch": weights.arch,
            **({"num_classes": weights.num_classes} if weights.num_classes else {})}


def _ports(config: ExportConfig, context: StageContext, model_section: dict) -> list[_Port]:
    """The exported graph's inputs: the architecture's (`archs.model_inputs`), with dimensions from
    the recipe's ``model.inputs`` where declared (named dimensions are dynamic), else batch
    (dynamic unless ``dynamic_batch: false``) + the per-sample shape: ``input_shape``, else the
    data's (images: channels and size in its layout; tables: the feature width; text:
    ``[sequence]``, dynamic, ``model.max_length`` long in the example)."""
    from zoo_stages.lib.models import archs

    declared = model_section.get("inputs") or {}
    batch: int | str = "batch" if config.dynamic_batch else 1
    ports = []
    for inp in archs.model_inputs(model_section):
        per_sample = _per_sample_shape(inp, config, context, model_section)
        if inp.name in declared:
            dims = tuple(declared[inp.name]["shape"])
        elif inp.holds in ("token_ids", "mask"):
            dims = (batch, "sequence")
        else:
            dims = (batch, *per_sample())
        example = []
        for j, d in enumerate(dims):
            if isinstance(d, int):
                example.append(d)
            elif j == 0:
                example.append(2)  # batch 2 for a dynamic axis: the dynamo exporter specialises sizes 0 and 1
            else:
                known = per_sample()
                if len(known) != len(dims) - 1:
                    raise InvalidInput(f"model.inputs.{inp.name}.shape: export cannot tell a size for the example "
                                       f"input's dynamic dimension {d!r}",
                                       hint="give the dimension as a number, or set `input_shape:` in the export config")
                example.append(int(known[j - 1]))
        ports.append(_Port(inp.name, inp.holds, inp.dtype, dims, tuple(example)))
    return ports


def _per_sample_shape(inp, config: ExportConfig, context: StageContext, model_section: dict):
    """A function giving the per-sample shape that ``input_shape``, the declared ``model.inputs``
    or the data imply for input `inp`, computed on first use (a table's width reads the data)."""
    from zoo_stages.lib.models import archs

    data = context.shared.get("data") or {}

    def shape() -> list[int]:
        if config.input_shape:
            return list(config.input_shape)
        declared = (model_section.get("inputs") or {}).get(inp.name)
        if declared and all(isinstance(d, int) for d in declared["shape"][1:]):
            return list(declared["shape"][1:])
        if inp.holds in ("token_ids", "mask"):
            return [int(model_section["max_length"])]
        catalog_shape = ((config.weights.preprocessing or {}).get("input_shape") if config.weights else None)
        if not data and catalog_shape:
            return list(catalog_shape)  # the size the pretrained weights were trained at
        if not data:
            raise InvalidInput("export cannot tell the input shape: no `input_shape` and no recipe `data:` section",
                               hint="set `input_shape: [3, 224, 224]` in the export config")
        if inp.holds == "image":
            channels, (h, w), layout = archs.image_settings(data, context.recipe.dir)
            return [h, w, channels] if layout == "NHWC" else [channels, h, w]
        return list(_data_feature(inp.name, data, context).shape[1:])

    return shape


def _data_feature(name: str, data: Mapping[str, Any], context: StageContext):
    """The train split's feature that feeds input `name` (for its shape)."""
    from zoo_stages.lib.data import datasets
    from zoo_stages.lib.runtimes import onnx_run

    split = datasets.load_split(dict(data), context.recipe.dir, "train")
    return onnx_run.bind_names([name], split.features, where="the train split")[name]


def _example_inputs(ports: list[_Port], samples: int | None, vocab_size: int, seed: int) -> dict[str, Any]:
    """Seeded inputs for every port, in order: `samples` samples (None: the example batch) of the
    example shape. As `onnx_run.random_feeds`: floats uniform in [0, 1), masks all ones, booleans
    True, other integers 0 or 1, except token ids: uniform below the vocabulary size."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds = {}
    for port in ports:
        shape = (port.example[0] if samples is None else samples, *port.example[1:])
        dtype = np.dtype(port.dtype)
        if port.holds == "token_ids":
            value = rng.integers(0, vocab_size, shape)
        elif port.holds == "mask" or dtype == np.bool_:
            value = np.ones(shape)
        elif dtype.kind in "iu":
            value = rng.integers(0, 2, shape)
        else:
            value = rng.random(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
        feeds[port.name] = np.ascontiguousarray(value.astype(dtype, copy=False))
    return feeds


class _Capture:
    """A write-only file object that keeps the bytes written to it (the exporter writes the
    whole model in one call; keeping that bytes object avoids BytesIO's two 233 MB copies)."""

    def __init__(self):
        self.parts: list[bytes] = []

    def write(self, data) -> int:
        self.parts.append(data if isinstance(data, bytes) else bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def getvalue(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


def _root_cause(error: BaseException) -> str:
    """The innermost exception's first line: torch.onnx wraps torch.export's error in a generic
    "Failed to export the model with torch.export" whose own first line says nothing."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0][:300] if lines else ''}"


def _takes_varargs(model) -> bool:
    """Whether `model.forward` takes ``*inputs``: torch.export then reads dynamic shapes per
    argument, so the per-input specs go inside one tuple."""
    import inspect

    return any(p.kind is inspect.Parameter.VAR_POSITIONAL
               for p in inspect.signature(model.forward).parameters.values())


def _run_exporter(model, dummy: tuple, raw: Path, ports: list[_Port], out_name: str, config: ExportConfig):
    """(ModelProto, its serialised bytes or None) from the configured exporter (`_export_dynamo`
    or `_export_torchscript`). Weights near protobuf's 2 GB limit go through `raw` with external
    data (then the bytes are None)."""
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    large = weight_bytes >= onnx_io.PROTOBUF_LIMIT // 2
    with warnings.catch_warnings():
        # the TorchScript tracer warns about the static sizes the adaptive pool and transformers'
        # attention read (dynamic axes are declared), and that its exporter is deprecated
        import torch

        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        # transformers' position lookups: the indices are never negative
        warnings.filterwarnings("ignore", message="Exporting aten::index operator", category=UserWarning)
        if config.exporter == "dynamo":
            return _export_dynamo(model, dummy, raw, ports, out_name, config, large)
        return _export_torchscript(model, dummy, raw, ports, out_name, config, large)


def _export_dynamo(model, dummy: tuple, raw: Path, ports: list[_Port], out_name: str, config: ExportConfig,
                   large: bool):
    """torch.export + onnxscript (torch's default exporter since 2.9). Below the 2 GB limit the
    program's ModelProto is taken in memory (all weights inline, no file written); above it the
    program is saved to `raw` with its weights in `raw.onnx.data` and loaded back, which
    `export_io.save_large` then writes as model.onnx + model.onnx.data.

    The exporter implements opsets from 18 (the default): a lower `opset` (the recipes' 17) is
    built at 18 and converted down by `_convert_opset` (the parity gate checks the result); not
    above 2 GB, where the converter cannot serialise the model."""
    import torch

    try:
        import onnxscript  # noqa: F401
    except ImportError:
        raise InvalidInput("exporter: dynamo needs the onnxscript package, which is not installed",
                           hint="pip install onnxscript, or use `exporter: torchscript`") from None
    dims: dict[str, Any] = {}  # one Dim per name: inputs sharing a dimension name share its size
    dynamic = tuple({j: dims.setdefault(d, torch.export.Dim(d)) for j, d in p.dynamic_axes.items()} or None
                    for p in ports)
    if any(dynamic) and _takes_varargs(model):
        dynamic = (dynamic,)  # forward(*inputs) (a model converted back from ONNX): one tuple argument
    # inputs sharing a dimension name share one Dim: torch says the second name "will not be used"
    warnings.filterwarnings("ignore", message="# The axis name", category=UserWarning)
    built = max(config.opset, DYNAMO_MIN_OPSET)
    try:
        with _quiet_loggers("torch.onnx", "torch.export", "onnxscript"):
            program = torch.onnx.export(model, dummy, None, dynamo=True, input_names=[p.name for p in ports],
                                        output_names=[out_name], opset_version=built,
                                        dynamic_shapes=dynamic if any(dynamic) else None, optimize=True,
                                        verbose=False)
    except torch.onnx.errors.OnnxExporterError as e:
        raise InvalidInput(f"the dynamo exporter cannot export this model at opset {built}: {_root_cause(e)}",
                           hint="try `exporter: torchscript`, or another opset") from None
    if large:
        if built != config.opset:  # onnx's version converter serialises the model: not above 2 GB
            raise InvalidInput(f"a model above 2 GB exports with dynamo at opset {DYNAMO_MIN_OPSET} or above, "
                               f"not {config.opset}", hint=f"set `opset: {DYNAMO_MIN_OPSET}`")
        program.save(str(raw), external_data=True)
        return onnx_io.load_model(raw, cap_ir_version=False), None
    proto = program.model_proto
    if built != config.opset:
        proto = _convert_opset(proto, config.opset)
    return proto, None


def _convert_opset(proto, opset: int):
    """`proto` (the dynamo exporter's optimised graph, opset 18) converted down to `opset` by onnx's
    version converter. On the optimised graph, where ReduceMean's axes and the like are constants,
    not on the exporter's raw one (its own down-conversion fails there for ResNets)."""
    from onnx import version_converter

    hint = f"set `opset: {DYNAMO_MIN_OPSET}` (or higher), or use `exporter: torchscript`"
    try:
        converted = version_converter.convert_version(proto, opset)
    except Exception as e:  # the converter's C++ assertions arrive as RuntimeError or ValueError
        raise InvalidInput(f"the dynamo exporter builds opset {DYNAMO_MIN_OPSET} and onnx's version converter cannot "
                           f"take this model down to opset {opset}: {str(e).strip().splitlines()[-1][:200]}",
                           hint=hint) from None
    # onnx 1.23's adapter moves Reduce* axes back to an attribute but keeps opset 18's
    # noop_with_empty_axes, which older opsets lack; at its default (0) it means what they do
    for node in export_io.all_nodes(converted.graph):
        since = 13 if node.op_type == "ReduceSum" else 18  # the opset that added the attribute
        if node.op_type.startswith("Reduce") and opset < since:
            for attr in list(node.attribute):
                if attr.name == "noop_with_empty_axes":
                    if attr.i:
                        raise InvalidInput(f"{node.op_type} with noop_with_empty_axes=1 has no opset-{opset} form",
                                           hint=hint)
                    node.attribute.remove(attr)
    return converted


def _export_torchscript(model, dummy: tuple, raw: Path, ports: list[_Port], out_name: str, config: ExportConfig,
                        large: bool):
    """The TorchScript exporter (``exporter: torchscript``; deprecated by torch). It writes to
    memory (the bytes are kept: no second serialisation) unless the model is `large`, when it
    writes `raw`, which is loaded."""
    import onnx
    import torch

    batch_dim = ports[0].dims[0] if ports and ports[0].dims else 1
    dynamic_axes = {p.name: p.dynamic_axes for p in ports if p.dynamic_axes}
    if isinstance(batch_dim, str):
        dynamic_axes[out_name] = {0: batch_dim}
    buffer = _Capture()
    try:
        torch.onnx.export(model, dummy, str(raw) if large else buffer, dynamo=False,
                          input_names=[p.name for p in ports], output_names=[out_name], opset_version=config.opset,
                          dynamic_axes=dynamic_axes or None, do_constant_folding=True)
    except (torch.onnx.errors.UnsupportedOperatorError, torch.onnx.errors.SymbolicValueError) as e:
        raise InvalidInput(f"the TorchScript exporter cannot export this model at opset {config.opset}: {e}",
                           hint="raise `opset`, or try `exporter: dynamo`") from None
    if large:
        return onnx_io.load_model(raw, cap_ir_version=False), None
    blob = buffer.getvalue()
    return onnx.load_from_string(blob), blob


class _quiet_loggers:
    """Raise the named loggers to ERROR for the block: the dynamo exporter logs its opset
    conversion and the torchvision ops it skips as warnings on every export."""

    def __init__(self, *names: str):
        import logging

        self.loggers = [logging.getLogger(n) for n in names]

    def __enter__(self):
        import logging

        self.saved = [lg.level for lg in self.loggers]
        for lg in self.loggers:
            lg.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        for lg, level in zip(self.loggers, self.saved):
            lg.setLevel(level)
        return False


def _run_onnxruntime(model: Path | bytes, feeds: Mapping[str, Any], threads: int) -> dict:
    """{output name: array} of the model on `feeds` in onnxruntime (`model`: the serialised model or
    its path); a model with a fixed batch dimension is fed that many samples at a time."""
    from zoo_stages.lib.runtimes import onnx_run, ort_session

    session = ort_session.make_session(model, threads=threads, level="all")
    return onnx_run.run(session, feeds)


def _flatten_outputs(out) -> list:
    import torch

    if isinstance(out, torch.Tensor):
        return [out.numpy()]
    if isinstance(out, dict):
        out = list(out.values())
    flat = []
    for item in out:
        flat.extend(_flatten_outputs(item))
    return flat


def _parity(expected: list, got: Mapping[str, Any], cfg: ParityConfig):
    """The parity report of onnxruntime's outputs against torch's (matched by position: torch's
    outputs have no names)."""
    from zoo_stages.lib.quality import parity

    if len(expected) != len(got):
        raise GateFailed(f"torch gives {len(expected)} outputs but the ONNX model gives {len(got)}")
    return parity.compare(dict(zip(got, expected)), got, tolerance=parity.Tolerance(atol=cfg.atol, rtol=cfg.rtol),
                          samples=cfg.samples)


class _torch_threads:
    """Run torch on `threads` threads, restoring the previous setting afterwards."""

    def __init__(self, threads: int):
        self.threads = max(1, int(threads))

    def __enter__(self):
        import torch

        self._saved = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        return self

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self._saved)
        return False
