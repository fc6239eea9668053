"""The `export` kind: a trained model to ONNX (``model.onnx``), checked and parity-gated.

The recipe's ``model.framework`` picks the exporter (`zoo_stages.exporters`, registered as
``zoo.exporters`` entry points; a plugin may add its own): ``torch`` (the default; everything
below), ``sklearn``, ``lightgbm`` and ``xgboost`` (the train stage's fitted estimator, converted
with skl2onnx or onnxmltools and gated against the source framework on the data's held-out rows:
`zoo_stages.exporters.base.EstimatorExporter`), ``transformers`` (a Hugging Face model with named
inputs and outputs, gated against transformers' forward on held-out texts; its weights may be a
pinned pretrained folder instead of a checkpoint: `zoo_stages.exporters.transformers`), ``keras``
and ``jax`` (models the recipe's
functions trained: Keras' ONNX export on the JAX backend, jax2onnx; gated the same way:
`zoo_stages.exporters.entry_models`). A framework whose extra is not installed fails
with `zoo.errors.MissingExtra`, naming the ``pip install 'zoo-onnx[EXTRA]'`` to run.

Weights come from exactly one of:
- the upstream ``checkpoint`` (a train stage; safetensors, or a .pt/.pth state dict);
- ``weights: {url|path, sha256}``: upstream pretrained torch weights (e.g. torchvision's
  ``alexnet-owt-7be5be79.pth``), fetched and verified through `zoo.sources`;
- ``onnx: {url|path, sha256}``: an existing ONNX model, checked and passed through unchanged
  (torch is not needed; the graph and weights are kept, only provenance metadata is added).

The model is built from the recipe's ``model:`` section (`zoo_stages.lib.archs`; the data
decides image channels, an mlp's width and, without ``model.vocab_size``, bert's vocabulary) and
exported with torch's dynamo exporter (torch.export + onnxscript, torch's default since 2.9; it
builds opset 18, its default, and converts down to a lower configured ``opset``) or, with
``exporter: torchscript``, the deprecated TorchScript tracer (constant folding; opset 17 by
default). Without ``exporter:`` the architecture decides (`archs.default_exporter`): dynamo, except TorchScript for bert, whose graph
is the one onnxruntime's transformer optimizer fuses into Attention nodes. Then: IR version capped
at 13 (what onnxruntime loads), doc strings and node metadata stripped (they may hold source
paths), ``onnx.checker.check_model(full_check=True)``, which includes strict type and shape
inference. The weights stay inside model.onnx below protobuf's 2 GB limit (the dynamo exporter's
program is taken in memory, no ``.onnx.data`` is written); above it both exporters write external
data, which export saves as ``model.onnx`` + ``model.onnx.data``.

Inputs: the architecture's, by name and in forward() order (`archs.model_inputs`: ``input`` for
images, ``features`` for mlp, ``input_ids`` and ``attention_mask`` for bert), with the names,
shapes and types of the recipe's ``model.inputs`` where it declares them (named dimensions
become dynamic axes). Otherwise the batch axis is dynamic (``batch``, unless ``dynamic_batch:
false``) and the rest comes from ``input_shape`` or the data: images [C, H, W] (or [H, W, C] for
an NHWC layout) from ``data.image`` or the older ``data.channels``/``data.image_size``, a table's
feature width, and for bert int64 [batch, sequence] with a dynamic ``sequence`` (the example
input is ``model.max_length`` long).

Parity gate: onnxruntime and torch run the same ``parity.samples`` seeded random inputs on every
input (floats uniform in [0, 1), token ids uniform below the vocabulary size, attention masks of
ones, other integers 0 or 1); any output element with ``|onnx - torch| > atol + rtol * |torch|``
fails the stage with a table of max-abs and max-rel errors per output (`zoo_stages.lib.parity`).
Exporting the same weights twice gives the same bytes.

Provenance: the model's ``metadata_props`` record zoo's version, the stage key, the digests of
the checkpoint or source file, the recipe's license and the source's attribution (see
`zoo_stages.lib.provenance`; ``weights: {license, attribution}`` override the defaults).
"""

from __future__ import annotations

import re
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field, StringConstraints, field_validator, model_validator

from zoo.errors import GateFailed, InvalidInput
from zoo.stage import Inputs, KeyContext, KindConfig, StageContext, StageKind
from zoo_stages.lib.equivalence import NumericOutputs
from zoo_stages.exporters.base import ExportJob
from zoo_stages.lib import checkpoints
from zoo_stages.lib.archs import BUILD_FIELDS
from zoo_stages.lib.entry_models import ENTRY_MODEL_TOOLS
from zoo_stages.lib.estimators import ESTIMATOR_TOOLS

MAX_IR_VERSION = 13  # onnxruntime 1.31 loads at most IR 13; onnx 1.23 stamps 14
PROTOBUF_LIMIT = 2 * 1024**3 - 1024 * 1024  # stay clear of protobuf's 2 GB message limit
DATA_LOCATION = "model.onnx.data"
DYNAMO_MIN_OPSET = 18  # the lowest opset torch's dynamo exporter implements; lower ones are converted down


class SourceRef(KindConfig):
    """A file to fetch: a URL (https://, http://, hf://) or a local path, pinned by sha256."""

    url: str | None = Field(None, description="https://..., http://... or hf://org/repo[@rev]/path")
    path: str | None = Field(None, description="local file, relative to the recipe")
    sha256: str | None = Field(None, description="the file's full sha256: 64 hex digits (`sha256sum FILE`)")
    license: str | None = Field(None, description="license of the file (e.g. BSD-3-Clause); stamped into every "
                                                  "derived build (known hosts such as download.pytorch.org "
                                                  "have a default)")
    attribution: str | None = Field(None, description="who to credit for the file; propagated like `license`")

    @field_validator("sha256")
    @classmethod
    def _full_digest(cls, value: str | None) -> str | None:
        """A recipe pins the whole digest: a prefix (torchvision's 8 digits) only guards against
        accidents, not against a different file that shares it."""
        if value is None:
            return None
        digest = value.strip().lower().removeprefix("sha256:")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError(f"sha256 must be the full 64 hex digits of the file (`sha256sum FILE`), got {value!r}")
        return digest

    @model_validator(mode="after")
    def _one_location(self):
        if bool(self.url) == bool(self.path):
            raise ValueError("give exactly one of `url` or `path`")
        if self.url and not self.sha256:
            # a download is only as trustworthy as its pin: never take whatever the URL serves today
            raise ValueError("a `url` must be pinned by its full `sha256` (64 hex digits; `sha256sum FILE` "
                             "on a copy you trust)")
        return self

    @property
    def location(self) -> str:
        return self.url or self.path or ""


class WeightsRef(SourceRef):
    """Pretrained torch weights: a SourceRef, or a catalog name (``torchvision:resnet18``) that
    `zoo.catalog` resolves, while the config is validated, to the pinned file and the
    architecture it fits (so the URL and digest, not the name, enter the cache key)."""

    catalog: str | None = Field(None, description="the catalog name these weights were resolved from")
    arch: str | None = Field(None, description="the architecture the weights fit (model.arch follows it)")
    num_classes: int | None = Field(None, ge=1, description="the classifier width of the weights")
    preprocessing: dict[str, Any] | None = Field(None, description="the input the weights expect (size, mean, std)")


CatalogName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]*:[A-Za-z0-9_.-]+$")]


class ParityConfig(KindConfig):
    samples: int = Field(8, ge=1, le=4096, description="random inputs compared between torch and onnxruntime")
    atol: float = Field(1e-4, ge=0)
    rtol: float = Field(1e-3, ge=0)
    seed: int = 0


class ExportConfig(KindConfig):
    opset: int | None = Field(None, ge=7, le=30, description="ONNX opset of the exported model; default: the "
                                                            "exporter's own (18 for dynamo, 17 for torchscript)")
    exporter: Literal["torchscript", "dynamo"] | None = Field(
        None, description="dynamo: torch.export + onnxscript (torch's default); torchscript: the deprecated tracer; "
                          "default: dynamo, except torchscript for arch bert (its Attention fusion needs that graph)")
    dynamic_batch: bool = Field(True, description="make the batch axis symbolic ('batch')")
    input_shape: list[int] | None = Field(
        None, min_length=1, description="a single input's shape without the batch axis, e.g. [3, 224, 224] or, for "
                                        "mlp, [30]; default: the data's (image channels and size, the table's width)")
    parity: ParityConfig = ParityConfig()
    weights: WeightsRef | CatalogName | None = Field(None, description="pretrained torch weights instead of an upstream checkpoint: "
                                                        "{url|path, sha256}, or a catalog name such as "
                                                        "torchvision:resnet18 (zoo/catalogs/)")
    onnx: SourceRef | None = Field(None, description="an existing ONNX model to check and pass through")

    @field_validator("weights", mode="after")
    @classmethod
    def _catalog_name(cls, value):
        if isinstance(value, str):  # resolved now, so the pinned URL and digest enter the cache key
            from zoo import catalog

            try:
                return WeightsRef.model_validate(catalog.resolve(value))
            except InvalidInput as e:  # a ValueError: the recipe loader reports it at its YAML line
                raise ValueError(f"{e.message}; {e.hint}" if e.hint else e.message) from None
        return value

    @model_validator(mode="after")
    def _checks(self):
        if self.weights is not None and self.onnx is not None:
            raise ValueError("`weights` and `onnx` are alternatives: keep one")
        if self.input_shape is not None and any(d < 1 for d in self.input_shape):
            raise ValueError("input_shape dimensions must be positive")
        return self


class Export(NumericOutputs, StageKind):
    name = "export"
    # 2: provenance metadata_props; 3: inferred value_info no longer stored; 4: one session builder (deterministic
    # compute) and parity module (per-output records, max_rel over ref != 0, integer outputs exact); 5: named
    # inputs (the arch's, or model.inputs; mlp and bert), data.image settings, regression outputs; 6: exporters by
    # model.framework (zoo_stages.exporters: torch, sklearn, lightgbm, xgboost); 7: the dynamo exporter by
    # default (torchscript for bert), external data above 2 GB from either exporter; the parent of model.from
    # in the key; 8: transformers (named inputs, parity on held-out text, a pinned pretrained folder as the
    # weights); 9: keras and jax exporters; 10: equivalence across platform classes by model outputs and quality (zoo_stages.lib.equivalence)
    version = "10"
    Config = ExportConfig
    tools = ("torch", "onnx", "onnxruntime", "transformers", *ESTIMATOR_TOOLS, "skl2onnx", "onnxmltools",
             "onnxconverter-common", *ENTRY_MODEL_TOOLS)
    # the network (as train builds it: the data decides image channels, a table's width, a vocabulary),
    # the task (1 output for regression) and the I/O names and shapes; not model.task (card metadata)
    shared = ("data", "task", *(f"model.{f}" for f in BUILD_FIELDS), "model.input_name", "model.output_name",
              "model.inputs", "model.framework")
    outputs = ("model",)
    recipe_fields = ("license",)  # stamped into the model (zoo.license)
    summary = "export to ONNX (checked, shape-inferred, parity-gated against the source framework)"

    def tools_used(self, config: ExportConfig, ctx: KeyContext) -> tuple[str, ...]:
        """onnx and onnxruntime (checks, parity), and the tools of the exporter of ``model.framework``
        only: another version of a framework this model does not use changes neither key nor lock."""
        base = ("onnx", "onnxruntime", "numpy")
        if config.onnx is not None:
            return base
        from zoo.engine import exporter_loader
        from zoo_stages import exporters

        model = ctx.shared.get("model") or {}
        framework = model.get("framework") or exporter_loader.DEFAULT_FRAMEWORK
        exporter = exporters.BUILTIN.get(framework) or exporter_loader.get(framework)
        return (*base, *exporter.tools_for(model))

    def dependencies(self, config: ExportConfig, ctx: KeyContext) -> list[Path]:
        from zoo_stages.lib import archs

        deps: list[Path] = []
        model = ctx.shared.get("model") or {}
        if model.get("entry") and config.onnx is None:
            deps.append(archs.entry_file(model["entry"], ctx.recipe.dir, "model.entry"))
        if config.onnx is None:
            from zoo.engine import exporter_loader
            from zoo_stages import exporters
            from zoo_stages.lib import finetune

            deps.extend(finetune.dependencies(ctx.references))  # the parent zoo model (model.from)
            framework = model.get("framework") or exporter_loader.DEFAULT_FRAMEWORK
            # files the model section names (a transformers pretrained folder)
            deps.extend((exporters.BUILTIN.get(framework) or exporter_loader.get(framework)).dependencies(
                model, ctx.recipe.dir))
        if config.onnx is None and ctx.shared.get("data") and _reads_data_files(model, config):
            from zoo_stages.lib import datasets

            deps.extend(datasets.data_dependencies(dict(ctx.shared["data"]), ctx.recipe.dir))
        for field, ref in (("weights", config.weights), ("onnx", config.onnx)):
            if ref is not None and ref.path:
                p = ctx.resolve(ref.path)
                if not p.is_file():
                    raise InvalidInput(f"config.{field}.path {ref.path!r} does not exist ({p})",
                                       hint="paths are relative to the recipe's folder")
                deps.append(p)
        return deps

    def run(self, inputs: Inputs, config: ExportConfig, context: StageContext) -> Mapping[str, Path]:
        checkpoint = inputs.maybe("checkpoint")
        given = [name for name, v in (("an upstream checkpoint", checkpoint), ("config.weights", config.weights),
                                      ("config.onnx", config.onnx)) if v is not None]
        if len(given) > 1:
            raise InvalidInput(f"export got weights from {' and '.join(given)}; it needs exactly one",
                               hint="drop `weights:`/`onnx:` or remove the train stage from `needs:`")
        exporter = _exporter(context) if config.onnx is None else None
        # weights the model section pins itself (a transformers pretrained folder), when nothing else gives any
        pretrained = exporter.pretrained_source(context) if exporter is not None and not given else None
        if not given and pretrained is None:
            raise InvalidInput("export has no weights: no upstream checkpoint, no `weights:` and no `onnx:`",
                               hint="add a train stage to `needs:`, or set `weights: {url: ..., sha256: ...}`")
        target = context.output_path("model.onnx")
        if exporter is None:
            _passthrough(config, context, target, inputs)
        else:
            if checkpoint is not None:
                source, label = Path(checkpoint), "checkpoint"
            elif pretrained is not None:
                source, label = pretrained, "pretrained"
            else:
                source, label = _fetch(config.weights, context), "weights"
            props = _provenance(inputs, context, config.weights if label == "weights" else None, "weights", source)
            exporter.export(ExportJob(source, label, config, context, target, props))
        return {"model": target}


def _exporter(context: StageContext):
    """The exporter of the recipe's ``model.framework`` (default torch), its extra checked: the
    built-in ones from `zoo_stages.exporters.BUILTIN` (zoo's own entry points; importing it puts
    their code in this kind's key), others through their ``zoo.exporters`` entry point."""
    from zoo.engine import exporter_loader
    from zoo_stages import exporters

    name = (context.shared.get("model") or {}).get("framework") or exporter_loader.DEFAULT_FRAMEWORK
    cls = exporters.BUILTIN.get(name) or exporter_loader.get(name)
    cls.require()
    return cls()


def _reads_data_files(model: Mapping[str, Any], config: ExportConfig) -> bool:
    """Whether exporting reads the data's files: an estimator's parity gate (the held-out rows), an
    mlp's width (without an input shape) or a bert's vocabulary (without model.vocab_size);
    images need only the settings."""
    from zoo_stages.lib import archs

    if model.get("framework") not in (None, "torch"):  # an estimator's parity gate runs the held-out rows
        return True
    kind = archs.modality(model)
    if kind == "table":
        return not config.input_shape and not model.get("inputs")
    return kind == "text" and not model.get("vocab_size")


def _provenance(inputs: Inputs, context: StageContext, ref: SourceRef | None, field: str,
                source: Path | None) -> dict[str, str]:
    """The metadata_props of the exported model: key, input digests, license and attribution."""
    from zoo_stages.lib import provenance

    from zoo_stages.lib import finetune

    sources = provenance.input_digests(inputs)
    attribution = provenance.upstream_attribution(inputs)
    if field == "weights":  # a network from the zoo (model.from) credits its parent, which the lineage then names
        attribution = provenance.merge_attribution(
            attribution, finetune.attribution(context.references))
    if ref is not None and source is not None:
        digest = _sha256(source)
        sources[field] = f"sha256:{digest}"
        own = provenance.source_attribution(field, url=ref.url, path=ref.path, sha256=digest,
                                            license=ref.license, attribution=ref.attribution)
        # a zoo-built ONNX source carries its own sources' attribution: keep passing it on
        inherited = provenance.model_attribution(source) if field == "onnx" else []
        attribution = provenance.merge_attribution(attribution, inherited, [own])
    return provenance.artifact_props("export", context.record, context.recipe.license, dict(sorted(sources.items())),
                                     attribution)


# ---------------------------------------------------------------------------------------------
# torch -> ONNX


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

    from zoo_stages.lib import archs, finetune, tasks

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
        if blob is not None and not _needs_normalising(proto):
            # the exporter's own bytes, with the provenance entries written after the graph:
            # 233 MB are not serialised again (the parsed proto is kept for the metrics)
            blob = _stamp_bytes(blob, proto, props)
        else:
            proto = _normalise(proto)
            _stamp(proto, props)
            blob = _serialise(proto)
        feeds = _example_inputs(ports, config.parity.samples, vocab, seed=config.parity.seed)
        torch_feeds = [torch.from_numpy(a) for a in feeds.values()]
        if blob is None:  # above 2 GB: one step after the other, from files
            _save_large(proto, target)
            got = _run_onnxruntime(target, feeds, context.threads)
            with torch.no_grad():
                expected = _flatten_outputs(model(*torch_feeds))
        else:
            # The checker, the write, onnxruntime's parity run and torch's all release the GIL:
            # run them side by side (1.2 s instead of 2.6 s for AlexNet-224 on 2 cores). The
            # checker's verdict is read first, so a malformed model is reported as such.
            with ThreadPoolExecutor(max_workers=3, thread_name_prefix="export") as pool:
                checked = pool.submit(_check, blob)
                saved = pool.submit(_save, proto, target, blob)
                onnx_run = pool.submit(_run_onnxruntime, blob, feeds, context.threads)
                with torch.no_grad():
                    expected = _flatten_outputs(model(*torch_feeds))
                checked.result()
                saved.result()
                got = onnx_run.result()

    report = _parity(expected, got, config.parity)
    context.metrics.update(_describe(proto, target))
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
        context.metrics["weights"] = {"source": config.weights.location, "sha256": _sha256(weights)}
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
    from zoo_stages.lib import archs

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
    from zoo_stages.lib import archs

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
    from zoo_stages.lib import datasets, onnx_run

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
    large = weight_bytes >= PROTOBUF_LIMIT // 2
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
    `_save_large` then writes as model.onnx + model.onnx.data.

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
        return _load_onnx(raw), None
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
    for node in _all_nodes(converted.graph):
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
        return _load_onnx(raw), None
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


def _needs_normalising(proto) -> bool:
    """Whether `_normalise` would change anything (the TorchScript exporter, not verbose,
    writes no doc strings or node metadata)."""
    return (proto.ir_version > MAX_IR_VERSION or bool(proto.doc_string) or bool(proto.graph.doc_string)
            or any(node.doc_string or len(node.metadata_props) for node in _all_nodes(proto.graph)))


def _stamp_bytes(blob: bytes, proto, props: Mapping[str, str]) -> bytes:
    """`blob` with its metadata_props replaced as `_stamp` would (also applied to `proto`)."""
    from zoo_stages.lib import onnx_fields
    from zoo_stages.lib.provenance import stamped_entries

    entries = stamped_entries([(p.key, p.value) for p in proto.metadata_props], props)
    _stamp(proto, props)
    return onnx_fields.rewrite_bytes(blob, metadata=entries)


def _serialise(proto) -> bytes | None:
    """The deterministic serialisation of `proto`, or None above protobuf's 2 GB limit."""
    try:
        blob = proto.SerializeToString(deterministic=True)
    except Exception:  # protobuf refuses messages above 2 GB (ValueError or EncodeError)
        return None
    return blob if len(blob) <= PROTOBUF_LIMIT else None


def _normalise(proto):
    """Cap the IR version and drop text that may vary between runs or machines."""
    proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
    proto.doc_string = ""
    proto.graph.doc_string = ""
    for node in _all_nodes(proto.graph):
        node.doc_string = ""
        del node.metadata_props[:]
    return proto


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g.node:
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


def _check(model: "bytes | Path") -> None:
    """``onnx.checker`` full check (checker, then strict type and shape inference) of the model's
    serialisation, or of its file when it lies above protobuf's 2 GB limit (external data)."""
    import onnx

    try:
        onnx.checker.check_model(model if isinstance(model, bytes) else str(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        raise InvalidInput(f"the ONNX model fails onnx's checker: {str(e).splitlines()[0]}",
                           hint="try another opset") from None


def _save_large(proto, target: Path) -> None:
    """Above 2 GB: write `proto` with its weights in model.onnx.data beside `target`, then check
    the file. (Saving with external data moves the weights out of `proto`'s tensors and points
    them at the file written, so the model is saved once, under its final name, and checked
    there: a check under another name first would leave the tensors pointing at that name.)"""
    _save(proto, target)
    _check(target)


def _save(proto, target: Path, blob: bytes | None = None) -> None:
    """Write the model atomically: `blob` (its serialisation) when given, else external data
    (model.onnx.data) for a model above 2 GB."""
    import onnx

    from zoo.files import atomic_output, atomic_write

    if blob is not None:
        atomic_write(target, blob, fsync=False)
        return
    with atomic_output(target, fsync=False) as tmp:  # the data file is written beside it, under its own name
        onnx.save_model(proto, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=DATA_LOCATION, size_threshold=1024)


def _run_onnxruntime(model: Path | bytes, feeds: Mapping[str, Any], threads: int) -> dict:
    """{output name: array} of the model on `feeds` in onnxruntime (`model`: the serialised model or
    its path); a model with a fixed batch dimension is fed that many samples at a time."""
    from zoo_stages.lib import onnx_run, ort_session

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


def _output_names(proto) -> list[str]:
    return [o.name for o in proto.graph.output]


def _parity(expected: list, got: Mapping[str, Any], cfg: ParityConfig):
    """The parity report of onnxruntime's outputs against torch's (matched by position: torch's
    outputs have no names)."""
    from zoo_stages.lib import parity

    if len(expected) != len(got):
        raise GateFailed(f"torch gives {len(expected)} outputs but the ONNX model gives {len(got)}")
    return parity.compare(dict(zip(got, expected)), got, tolerance=parity.Tolerance(atol=cfg.atol, rtol=cfg.rtol),
                          samples=cfg.samples)


# ---------------------------------------------------------------------------------------------
# ONNX pass-through


def _passthrough(config: ExportConfig, context: StageContext, target: Path, inputs: Inputs) -> None:
    """Check an existing ONNX model and write it to `target`, graph and weights unchanged.

    Only the provenance metadata_props are added (the source's sha256 is in ``zoo.sources``);
    a model above onnxruntime's IR version or with external data is also re-serialised with the
    IR capped and the external data inlined below 2 GB.
    """
    from zoo.pathsafety import external_data_files

    source = _fetch(config.onnx, context)
    props = _provenance(inputs, context, config.onnx, "onnx", source)
    proto = _load_onnx(source)
    external = bool(external_data_files(source))
    if proto.ir_version > MAX_IR_VERSION or external:
        _normalise(proto)
    _stamp(proto, props)
    blob = _serialise(proto)
    if blob is None:
        _save_large(proto, target)
    else:
        _check(blob)
        _save(proto, target, blob)
    smoke = _smoke_run(target, config, context.threads, (context.shared.get("model") or {}).get("inputs"))
    context.metrics.update(_describe(proto, target))
    context.metrics.update({
        "source": "onnx",
        "exporter": None,
        "onnx": {"source": config.onnx.location, "sha256": _sha256(source)},
        "parity": {"passed": None, "reason": "no torch model to compare with (onnx pass-through)", **smoke},
    })


def _smoke_run(path: Path, config: ExportConfig, threads: int, declared: Mapping[str, Any] | None) -> dict[str, Any]:
    """Load the model in onnxruntime and run one seeded input on every input where the shapes are
    known (the model's fixed dimensions; ``input_shape`` gives the per-sample shape of inputs of
    that rank, the recipe's ``model.inputs`` those it declares; `onnx_run.random_feeds` values)."""
    import numpy as np

    from zoo_stages.lib import onnx_run, ort_session

    session = ort_session.make_session(path, threads=threads, level="all")
    shapes = {}
    if config.input_shape:
        shapes = {s.name: config.input_shape for s in onnx_run.input_specs(session)
                  if s.shape and len(s.shape) == len(config.input_shape) + 1}
    shapes.update(onnx_run.declared_shapes(session, declared))
    try:
        feeds = onnx_run.random_feeds(session, onnx_run.fixed_batch(session) or 1, config.parity.seed, shapes)
    except InvalidInput:  # a dynamic dimension or an element type no input can be invented for
        return {"ran": False}
    outs = onnx_run.run(session, feeds)
    if not all(np.isfinite(o.astype(np.float64)).all() for o in outs.values() if o.dtype.kind == "f"):
        raise GateFailed("the ONNX model gives non-finite outputs on a random input in [0, 1)")
    return {"ran": True}


# ---------------------------------------------------------------------------------------------
# shared helpers


def _stamp(proto, props: Mapping[str, str]) -> None:
    from zoo_stages.lib.provenance import stamp

    stamp(proto, props)


def _fetch(ref: SourceRef, context: StageContext) -> Path:
    from zoo import sources

    return sources.fetch(ref.url or ref.path, sha256=ref.sha256, base_dir=context.recipe.dir)


def _load_onnx(path: Path):
    """Load an ONNX model with its external data, which must be files in the model's folder
    (`zoo.pathsafety.external_data_files`: UnsafePath for a location that escapes it)."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    from zoo.pathsafety import external_data_files

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise InvalidInput(f"{path} is not a readable ONNX model: {str(e).splitlines()[0]}") from None
    if external_data_files(path):
        load_external_data_for_model(proto, str(path.parent))
    return proto


def _describe(proto, target: Path) -> dict[str, Any]:
    ops: dict[str, int] = {}
    for node in _all_nodes(proto.graph):
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    size = target.stat().st_size
    data = target.with_name(DATA_LOCATION)
    if data.exists():
        size += data.stat().st_size
    return {
        "ir_version": int(proto.ir_version),
        "opset_imports": {(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import},
        "inputs": [i.name for i in proto.graph.input if i.name not in {t.name for t in proto.graph.initializer}],
        "outputs": _output_names(proto),
        "nodes": sum(ops.values()),
        "op_types": dict(sorted(ops.items())),
        "size_bytes": int(size),
    }


def _sha256(path: Path) -> str:
    from zoo.sources import source_sha256

    # files from the source cache are named by their (verified) sha256: no need to re-read them
    if path.parent.name == "sha256" and re.fullmatch(r"[0-9a-f]{64}", path.name):
        return path.name
    return source_sha256(path)


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
