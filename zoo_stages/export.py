"""The `export` kind: a trained model to ONNX (`model.onnx`), checked and parity-gated.

Builds the `model:` architecture, loads weights and exports ONNX with torch's dynamo exporter
(torch.export + onnxscript; opset 18 by default, a lower `opset` such as the recipes' 17 is
converted down) or, with `exporter: torchscript`, the deprecated TorchScript tracer (opset 17 by
default). Without `exporter:`, dynamo, except TorchScript for `arch: bert`: onnxruntime's
transformer optimizer (optimize's `transformer:`) fuses the TorchScript graph's attention into
Attention nodes but not the dynamo graph's (`tests/test_export_dynamo.py` checks both, so the day
it does, the test says so). Weights come from exactly one of: the upstream
`checkpoint` (a train stage), `weights: {url|path, sha256}` (pretrained torch weights, e.g.
torchvision's `.pth`, loaded with `weights_only=True`), `weights: torchvision:NAME` (a name in
the weights catalog `zoo/catalogs/torchvision.json`: resnet18, resnet50,
mobilenet_v3_small, efficientnet_b0, alexnet; it resolves, when the recipe is validated, to the pinned
download.pytorch.org URL and full sha256, the BSD-3-Clause license, the arch and 1000 classes,
and the 3×224×224 input with ImageNet mean/std, which callers apply), or `onnx: {url|path, sha256}` (an existing
ONNX model, checked and passed through with its graph and weights unchanged). Remote sources must
be pinned: `sha256` is the file's full 64-hex digest (a prefix, or a digest prefix in the file
name such as torchvision's `alexnet-owt-7be5be79.pth`, is refused). Downloads resume after an
interruption and are verified while they stream (`zoo.download`); `ZOO_HTTP_TIMEOUT` (seconds,
default 10) bounds connecting and each read. Offline, pre-seed the source cache with
`python -m zoo.sources add FILE`.

After export: IR version capped at 13 (what onnxruntime 1.31 loads), doc strings and node
metadata stripped, `onnx.checker` (full check), strict shape inference (shapes kept in the
model), provenance `metadata_props` stamped. External data (`model.onnx.data`) only above
protobuf's 2 GB limit: below it the dynamo exporter's program is taken in memory, above it
either exporter writes external data (dynamo then only at opset 18 or above: onnx's version
converter cannot take such a model down).

**Inputs of the graph**: the arch's, by name and in order (`input` for images, `features` for
mlp, `input_ids` and `attention_mask` for bert), with the names, shapes and types of
`model.inputs` where declared (named dimensions become dynamic axes); otherwise a dynamic
`batch` axis (unless `dynamic_batch: false`) and the per-sample shape from `input_shape` or the
data: images `[C, H, W]` (`[H, W, C]` for an NHWC layout) from `data.image` or the older
`data.channels`/`data.image_size`, a table's width, and for bert a dynamic `sequence` axis
(the example input is `model.max_length` long).

**Parity gate**: torch and onnxruntime run `parity.samples` seeded random inputs on every input
(floats in [0, 1), token ids below the vocabulary size, attention masks of ones); any
float element with `|onnx − torch| > atol + rtol·|torch|`, or any integer element that differs,
fails the stage with a table (the one parity check of every kind, `zoo_stages/lib/quality/parity.py`).

**Provenance**: the model's `metadata_props` record the stage's record digest, the digests of the
checkpoint or source file, the recipe's license and the source's attribution
(`zoo_stages/lib/release/provenance.py`; `weights: {license, attribution}` override the defaults).

- **Inputs**: upstream `checkpoint` (optional); the recipe's `model:` and `task:` (one output for
  regression); `data:` for the input shape, a table's width and the tokenizer's vocabulary.
- **Outputs**: `model` (`model.onnx`); for a causal LM also `genai` (genai_config.json and the tokenizer files).
- **Metrics**: `opset`, `ir_version`, `inputs`, `outputs`, `nodes`, `op_types`, `size_bytes`,
  `num_parameters`, `input_shapes` (per input, dynamic dimensions by name), `parity` (per
  output), `max_abs`, `max_rel`, `source`.

**Exporters by framework**: the exporter follows `model.framework` (`zoo exporters` lists them): `torch` (the default, above),
`sklearn` (skl2onnx: estimators and pipelines), `lightgbm` and `xgboost` (onnxmltools; opset ≤ 15),
`transformers` (torch.onnx on the Hugging Face model: named inputs `input_ids`, `attention_mask`,
`token_type_ids` where taken, outputs named after transformers' own (`logits`, `last_hidden_state`),
dynamic `batch` and `sequence`; TorchScript with eager attention unless `exporter: dynamo` is set,
so onnxruntime's transformer optimizer fuses Attention; gated against transformers' forward on up to
256 held-out tokenized texts, or seeded token ids without text data; a `pretrained` folder exports
without a train stage, its digests stamped into `zoo.sources`. Optimum is not used: the release
that installs here would downgrade transformers 5; a causal LM: below);
`keras` (Keras' ONNX export on the JAX backend) and `jax` (jax2onnx; both opset ≤ 23, gated on the
held-out rows; see [Keras and JAX models](recipes.md#keras-and-jax-models)).
Estimator exports have zipmap off, so a classifier gives an int64 `label` and float `probabilities`
(a regressor one float `variable`), a `batch` axis on every port and IR ≤ 13; their parity gate
runs the source framework and onnxruntime on every held-out row: probabilities within
`atol`/`rtol`, labels exactly. LightGBM's float64 thresholds are rounded down to float32 before
conversion, which keeps every decision of the booster (rounding to nearest, as the converter
does, flips rows that lie between: 1.4e-3 off on breast-cancer). A third-party exporter subclasses
`zoo_stages.exporters.base.Exporter` and registers as
`[project.entry-points."zoo.exporters"] myfw = "mypkg.export:MyExporter"`; its `check_model`
checks the recipe's `model:` section when it loads. Quantization does not apply to tree ensembles
(onnxruntime's quantizer has no TreeEnsemble kernels): the shipped tree recipes deploy fp32, and a
quantize stage on such a model fails with "nothing to quantize" (exit 2) instead of publishing an
"int8" build that is the fp32 one.

**Generative builds (causal LMs)**: a `framework: transformers` model whose architecture is a
causal LM of the Llama, Qwen2, Qwen3 or Phi3 family (`LlamaForCausalLM`, `Qwen2ForCausalLM`,
`Qwen3ForCausalLM`, `Phi3ForCausalLM`; another `*ForCausalLM` is refused when the recipe loads)
is exported as a decoder with a KV cache in onnxruntime-genai's convention: inputs `input_ids`
[batch_size, sequence_length], `attention_mask` [batch_size, total_sequence_length],
`position_ids` (torch.onnx exports) and `past_key_values.N.key`/`.value` [batch_size,
num_kv_heads, past_sequence_length, head_size]; outputs `logits` and `present.N.key`/`.value`
[…, total_sequence_length, …], every batch and length dynamic. `exporter:` chooses how:
`dynamo` (the default) or `torchscript` (torch.onnx on transformers' own forward with its
`DynamicCache`; both handle the cache with torch 2.13 and transformers 5.23, dynamo is torch's
current exporter), or `genai`: onnxruntime-genai's model builder (fp32, CPU; its fused
GroupQueryAttention graph, which needs onnxruntime) run in a process of its own, offline, on a
local Hugging Face folder the stage assembles from the loaded weights and the tokenizer. The
builder's model is normalised like any export (IR ≤ 13, weights inline below 2 GB, its final RMS
norm written as standard ONNX operators so onnx's checker accepts it, `producer_version` without
the git commit the builder reads from wherever it is installed: two runs give the same bytes).
Every generative export also writes the `genai` output, a folder holding `genai_config.json`
(from the builder, with `config_only=true` for a torch.onnx export, its decoder's inputs and
outputs those of the ONNX file) and the tokenizer files: `tokenizer.json` (padding and truncation
off), `tokenizer_config.json` (special tokens, the `chat_template` where the model has one) and
`special_tokens_map.json` where the source has one. The tokenizer is the pretrained folder's
(pin its files in `model.pretrained.sha256`), else the data's tokenizer; deploy ships these files
beside every build of the model, quantized ones too, so `onnxruntime_genai` loads a pulled build
folder as it is. Parity gate (`generation:`): the held-out split's first `prompts` token blocks
(seeded random token ids without them), cut to `prompt_length`: their prefill logits in one
batch, then `new_tokens` steps of greedy decoding with the cache for each prompt against
transformers' `generate(do_sample=False)`: every token the same and every step's logits within
`parity.atol`/`parity.rtol`, else the stage fails naming the prompt and step where they part.
Metrics add `tokens_matched`, `tokens`, `parity.prefill`, `parity.decode`, `decoder`
(layers, kv_heads, head_size, vocab_size, genai_type), `decoder_exporter`, `genai_files`, and
`tools` (the onnxruntime-genai version, which enters the stage's key).

This docstring is the kind's description on the docs site (docs/kinds.md, written by
scripts/gen_kinds_doc.py): Markdown, for users.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field, StringConstraints, field_validator, model_serializer, model_validator

from zoo.errors import GateFailed, InvalidInput
from zoo.stage import Inputs, KeyContext, KindConfig, StageContext, StageKind
from zoo_stages.lib.quality.numeric_outputs import NumericOutputs
from zoo_stages.exporters.base import ExportJob
from zoo_stages.lib.onnx import export_io, onnx_io
from zoo_stages.lib.models.archs import BUILD_FIELDS
from zoo_stages.lib.models.entry_models import ENTRY_MODEL_TOOLS
from zoo_stages.lib.models.estimators import ESTIMATOR_TOOLS



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


class GenerationGate(KindConfig):
    """The parity gate of a causal LM's export: prompts, their length and the greedy steps compared."""

    prompts: int = Field(4, ge=1, le=64, description="prompts: the held-out split's first token blocks (seeded "
                                                     "random token ids without them)")
    prompt_length: int = Field(8, ge=1, le=4096, description="tokens of each prompt")
    new_tokens: int = Field(16, ge=1, le=1024, description="greedy steps with the KV cache compared with "
                                                           "transformers' generate(do_sample=False)")
    seed: int = 0


class ExportConfig(KindConfig):
    opset: int | None = Field(None, ge=7, le=30, description="ONNX opset of the exported model; default: the "
                                                            "exporter's own (18 for dynamo, 17 for torchscript)")
    exporter: Literal["torchscript", "dynamo", "genai"] | None = Field(
        None, description="dynamo: torch.export + onnxscript (torch's default); torchscript: the deprecated tracer; "
                          "genai: onnxruntime-genai's model builder (causal LMs of framework transformers only); "
                          "default: dynamo, except torchscript for arch bert (its Attention fusion needs that graph) "
                          "and for transformers models other than causal LMs")
    dynamic_batch: bool = Field(True, description="make the batch axis symbolic ('batch')")
    input_shape: list[int] | None = Field(
        None, min_length=1, description="a single input's shape without the batch axis, e.g. [3, 224, 224] or, for "
                                        "mlp, [30]; default: the data's (image channels and size, the table's width)")
    parity: ParityConfig = ParityConfig()
    weights: WeightsRef | CatalogName | None = Field(None, description="pretrained torch weights instead of an upstream checkpoint: "
                                                        "{url|path, sha256}, or a catalog name such as "
                                                        "torchvision:resnet18 (zoo/catalogs/)")
    onnx: SourceRef | None = Field(None, description="an existing ONNX model to check and pass through")
    generation: GenerationGate = Field(GenerationGate(), description="a causal LM's parity gate on generation "
                                                                     "(prefill logits and greedy decoding with the "
                                                                     "cache against transformers)")

    @model_serializer(mode="wrap")
    def _record(self, handler):
        """`generation` enters the stage's record only where it applies and is set: the records (and
        lockfiles) of every other export stay those of the config without it."""
        data = handler(self)
        if "generation" not in self.model_fields_set:
            data.pop("generation", None)
        return data

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
    # weights); 9: keras and jax exporters; 10: equivalence across platform classes by model outputs and quality (zoo_stages.lib.quality.equivalence). Causal LMs with a KV cache (zoo_stages.exporters.decoder)
    # are new configurations: every existing export writes the bytes it wrote, so no version bump
    version = "10"
    Config = ExportConfig
    tools = ("torch", "onnx", "onnxruntime", "transformers", "onnxruntime-genai", *ESTIMATOR_TOOLS, "skl2onnx", "onnxmltools",
             "onnxconverter-common", *ENTRY_MODEL_TOOLS)
    # the network (as train builds it: the data decides image channels, a table's width, a vocabulary),
    # the task (1 output for regression) and the I/O names and shapes; not model.task (card metadata)
    shared = ("data", "task", *(f"model.{f}" for f in BUILD_FIELDS), "model.input_name", "model.output_name",
              "model.inputs", "model.framework")
    outputs = ("model", "genai")  # genai: a causal LM's genai_config.json and tokenizer files
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
        return (*base, *exporter.tools_in(model, ctx.recipe.dir))

    def preflight(self, config: ExportConfig, ctx: KeyContext) -> None:
        """An imported ONNX file beside the recipe (`onnx: {path}`) must take the inputs `model.inputs`
        declares, with as many dimensions, and the data must give each of its inputs a feature: its
        ports are read at the wire level (`lib.onnx.ports`), never its weights. A URL, a missing or unreadable file: nothing said (the stage fetches and
        checks it)."""
        import difflib

        from zoo.errors import FieldError
        from zoo_stages.lib.onnx.ports import read_ports

        if config.onnx is None or not config.onnx.path:
            return
        path = ctx.resolve(config.onnx.path)
        try:
            ports = {p.name: p for p in read_ports(path).inputs}
        except (OSError, ValueError):
            return
        declared = (ctx.shared.get("model") or {}).get("inputs") or {}
        for name, entry in declared.items():
            if name not in ports:
                close = difflib.get_close_matches(name, list(ports), n=1)
                raise FieldError(f"model.inputs names {name!r}, which {config.onnx.path} does not take"
                                 + (f" (did you mean {close[0]!r}?)" if close else ""), field=("model", "inputs", name),
                                 hint=f"the model's inputs are {', '.join(ports) or 'none'}")
            rank, dims = ports[name].rank, list(entry.get("shape") or [])
            if rank is not None and rank != len(dims):
                raise FieldError(f"model.inputs.{name}.shape has {len(dims)} dimensions; input {name!r} of "
                                 f"{config.onnx.path} has {rank}", field=("model", "inputs", name, "shape"),
                                 hint="declare one dimension per model dimension, the batch first")
        data = ctx.shared.get("data")
        if data and ports:
            from zoo import decoder_io

            # a decoder takes token ids from the data; its mask, positions and cache are made per step
            names = [decoder_io.INPUT_IDS] if decoder_io.is_decoder(ports) else list(ports)
            _preflight_features(data, ctx, names, config.onnx.path)

    def dependencies(self, config: ExportConfig, ctx: KeyContext) -> list[Path]:
        from zoo_stages.lib.models import archs

        deps: list[Path] = []
        model = ctx.shared.get("model") or {}
        if model.get("entry") and config.onnx is None:
            deps.append(archs.entry_file(model["entry"], ctx.recipe.dir, "model.entry"))
        if config.onnx is None:
            from zoo.engine import exporter_loader
            from zoo_stages import exporters
            from zoo_stages.lib.models import finetune

            deps.extend(finetune.dependencies(ctx.references))  # the parent zoo model (model.from)
            framework = model.get("framework") or exporter_loader.DEFAULT_FRAMEWORK
            # files the model section names (a transformers pretrained folder)
            deps.extend((exporters.BUILTIN.get(framework) or exporter_loader.get(framework)).dependencies(
                model, ctx.recipe.dir))
        if config.onnx is None and ctx.shared.get("data") and _reads_data_files(model, config):
            from zoo_stages.lib.data import datasets

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
        genai = target.parent / "genai"  # a generative build's runtime files (zoo_stages.exporters.decoder)
        if genai.is_dir():
            return {"model": target, "genai": genai}
        return {"model": target}


def _preflight_features(data: Mapping[str, Any], ctx: KeyContext, inputs: list[str], given: str) -> None:
    """The data must give a feature for each input of the imported model (`onnx_run.bind_names`'s
    rule: one input takes the one feature whatever its name, several each by name)."""
    from zoo.errors import FieldError
    from zoo_stages.sections.data_probe import feature_names

    features = feature_names(dict(data), ctx.recipe.dir)
    if features is None or len(inputs) == 1 and len(features) == 1:
        return
    missing = [name for name in inputs if name not in features]
    if missing:
        raise FieldError(f"the data has no values for input(s) {', '.join(missing)} of {given} "
                         f"(it has: {', '.join(features) or 'nothing'})",
                         field=("data", "inputs") if data.get("inputs") else ("data",),
                         hint=f"name the data's arrays or columns after the model's inputs ({', '.join(inputs)}), "
                              "e.g. with `data.inputs: {INPUT: ...}`")


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
    from zoo_stages.lib.models import archs

    if model.get("framework") not in (None, "torch"):  # an estimator's parity gate runs the held-out rows
        return True
    kind = archs.modality(model)
    if kind == "table":
        return not config.input_shape and not model.get("inputs")
    return kind == "text" and not model.get("vocab_size")


def _provenance(inputs: Inputs, context: StageContext, ref: SourceRef | None, field: str,
                source: Path | None) -> dict[str, str]:
    """The metadata_props of the exported model: key, input digests, license and attribution."""
    from zoo_stages.lib.release import provenance

    from zoo_stages.lib.models import finetune

    sources = provenance.input_digests(inputs)
    attribution = provenance.upstream_attribution(inputs)
    if field == "weights":  # a network from the zoo (model.from) credits its parent, which the lineage then names
        attribution = provenance.merge_attribution(
            attribution, finetune.attribution(context.references))
    if ref is not None and source is not None:
        digest = export_io.source_digest(source)
        sources[field] = f"sha256:{digest}"
        own = provenance.source_attribution(field, url=ref.url, path=ref.path, sha256=digest,
                                            license=ref.license, attribution=ref.attribution)
        # a zoo-built ONNX source carries its own sources' attribution: keep passing it on
        inherited = provenance.model_attribution(source) if field == "onnx" else []
        attribution = provenance.merge_attribution(attribution, inherited, [own])
    return provenance.artifact_props("export", context.record, context.recipe.license, dict(sorted(sources.items())),
                                     attribution)


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
    proto = onnx_io.load_model(source, cap_ir_version=False)  # normalised below when above the cap
    external = bool(external_data_files(source))
    if proto.ir_version > onnx_io.MAX_IR_VERSION or external:
        export_io.normalise(proto)
    export_io.stamp(proto, props)
    blob = onnx_io.serialise(proto)
    if blob is None:
        export_io.save_large(proto, target)
    else:
        export_io.check(blob)
        onnx_io.save(proto, target, blob)
    smoke = _smoke_run(target, config, context.threads, (context.shared.get("model") or {}).get("inputs"))
    context.metrics.update(export_io.describe(proto, target))
    context.metrics.update({
        "source": "onnx",
        "exporter": None,
        "onnx": {"source": config.onnx.location, "sha256": export_io.source_digest(source)},
        "parity": {"passed": None, "reason": "no torch model to compare with (onnx pass-through)", **smoke},
    })


def _smoke_run(path: Path, config: ExportConfig, threads: int, declared: Mapping[str, Any] | None) -> dict[str, Any]:
    """Load the model in onnxruntime and run one seeded input on every input where the shapes are
    known (the model's fixed dimensions; ``input_shape`` gives the per-sample shape of inputs of
    that rank, the recipe's ``model.inputs`` those it declares; `onnx_run.random_feeds` values)."""
    import numpy as np

    from zoo_stages.lib.runtimes import onnx_run, ort_session

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


def _fetch(ref: SourceRef, context: StageContext) -> Path:
    from zoo import sources

    return sources.fetch(ref.url or ref.path, sha256=ref.sha256, base_dir=context.recipe.dir)


