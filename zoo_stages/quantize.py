"""The `quantize` kind: int8 post-training quantization and weight-only int4/int8 with onnxruntime.quantization.

int8 post-training quantization with `onnxruntime.quantization`, for any number of named inputs
(bound to the data's features by name). Static quantization needs standard ONNX ops (a model
with `com.microsoft` fused ops is refused with a hint, and auto skips its static candidates);
dynamic quantization takes them, including optimize's fused transformer graphs. A model with
external data (dynamo exports, above 2 GB) is quantized with `use_external_data_format`; the
output is one self-contained file.

- `mode: dynamic`: weights to int8 offline, activations quantized at run time
  (DynamicQuantizeLinear + ConvInteger/MatMulInteger; QAttention for fused attention). Needs no
  data; the transformer choice. On CNNs it is often slower than fp32 on x86 (AlexNet-224 here:
  about 45 ms against 23 ms fp32), which the metrics flag.
- `mode: static` (default): activation ranges calibrated on `calibration.samples` samples of the
  train split (a seeded sample, so the bytes are reproducible), `format: qdq` (default) or
  `qoperator`, optionally `per_channel`, `reduce_range`. `preprocess` (default on for static)
  runs onnxruntime's `quant_pre_process` first. Needs the recipe's `data:`.
- `mode: auto`: builds each of `candidates` (default all, below), measures each (batch-1 p50 on
  `latency.threads` threads, held-out quality against the fp32 input) and keeps the fastest that
  meets `accept` (`max_accuracy_drop`, or `min_cosine` where accuracy does not apply;
  `min_speedup`; a candidate slower than fp32 is never kept;
  candidates within `tie_tolerance` of the fastest tie and the earlier one wins). The table goes
  to `candidates.json` and the metrics; none passing fails the stage with the table. Needs `data:`.
  The weight-only candidates `weight-only-int4` and `weight-only-int8` (below, with `weight_only:`'s
  settings but for `bits`) join the search only when `candidates:` names them, after the int8 ones.

- `mode: weight_only`: the weights of the fully connected layers (MatMul; Gemm is rewritten as
  MatMul + Add) become blocks of 4 or 8 bits with one scale each (onnxruntime's
  `MatMulNBitsQuantizer`, com.microsoft `MatMulNBits`); activations stay float. The settings
  live under `weight_only:` (table below): `algorithm` `rtn` (round-to-nearest per block, data-free:
  onnxruntime's `DefaultWeightOnlyQuantConfig`, the default), `hqq` (half-quadratic, data-free,
  needs torch, 4 bits), `gptq` (error-corrected on `calibration.samples` seeded samples of the
  train split, like static's calibration; needs `data:`, 4 bits) or `k_quant` (llama.cpp's
  k-quants, data-free); `bits` 4 or 8; `block_size` (a power of two, default 32); `symmetric`
  (no zero points; rtn and gptq); `accuracy_level`: what the kernel computes in, `int8`
  (activations quantized per block at run time: the fast one on CPUs, the default) or `float32`
  (onnxruntime's levels 4 and 1). Layers are kept in float by `exclude` or at 8 bits by `keep_8bit`
  (node names or shell patterns, e.g. `*lm_head*` for a language model's head: k_quant sets their
  bits itself, the other algorithms quantize them in a second 8-bit rtn pass); `op_types:
  [MatMul, Gather]` also quantizes embedding tables as `GatherBlockQuantized` (rtn, 4 bits). A
  pattern that matches no layer is an error. The output is an `int4` build (`int8` at 8 bits)
  that needs onnxruntime; its model carries the settings (metadata `zoo.quantization`), which
  deploy records in the manifest, the card and the catalog. The int8 modes' fields (`format`,
  `per_channel`, `preset`, `linear`…) are refused in this mode, and `weight_only:` outside it.
  A decoder in zoo's convention (`zoo/decoder_io.py`: `input_ids` and `past_key_values.N.*`) is
  judged by the logits of one prefill over the held-out `input_ids` rows (without data: 8 seeded
  rows of 32 random token ids), against the fp32 parent's position by position (`parity`: cosine,
  next-token top-1 agreement; `accept.min_cosine`), and timed as a generation at batch 1 (a
  prefill of up to 32 tokens, then 16 greedy decode steps through the KV cache: `latency_measures`
  says so); the cache's head size comes from the upstream's `genai_config.json` (beside its model or
  in a causal LM export's `genai` output) where it ships one.

Quality follows the recipe's `task:`: accuracy of the first (samples, classes) float output for
classification with labelled data, and for every task the parity of the int8 outputs against the
fp32 ones on the same inputs (`parity`: max-abs, lowest mean cosine, top-1 agreement). Without
`data:` both models run on seeded random feeds (dynamic dims at `latency.dynamic_size`).

In `static`/`dynamic`/`weight_only` mode the fp32 input and the quantized model are measured the same way, and
an accuracy drop beyond `accept.max_accuracy_drop` or a speedup below 1 is recorded in
`flags` (a warning, not a failure; gate on it in verify).

**Presets** (onnxruntime's data type guidance): S8S8 in QDQ format is the default; S8S8 in
QOperator format is slow on x86-64, so QOperator defaults to uint8 activations; x86 with AVX2 but
no VNNI can saturate in U8S8 (VPMADDUBSW), which `reduce_range` (7-bit weights) avoids. Explicit
`activation_type`/`weight_type`/`reduce_range` override a preset. Type names accept aliases
(`int8`, `s8`, `uint8`, `u8`…). The presets are in the table below.

A model the quantizer leaves entirely in float (a tree ensemble, or `op_types` it lacks) fails the
stage ("nothing to quantize") rather than become an "int8" build; `preset: tensorrt` makes the
symmetric int8 with float biases that TensorRT's explicit quantization runs (deploy's
`convert: tensorrt`). External data is tested end to end on a 2.4 GB fp32 model: imported,
quantized to a 0.6 GB int8 file, verified, published and pulled with its `model.onnx.data`.

`linear: blockwise` (static) quantizes the fully connected layers as onnxruntime's 8-bit
`MatMulNBits` (one scale per `linear_block_size` inputs, int8 dot products) instead of QGemm: on
x86 with VNNI it streams AlexNet's classifier faster at batch 1 (the int8 build then needs
onnxruntime, which holds for every build zoo makes). On x86 *without* VNNI (e.g. AMD Zen 3,
Intel before Ice Lake) onnxruntime's int8 kernels can saturate full-range int8 weights; when the
measured accuracy drop is too large there, the stage says so and suggests `preset: x86-avx2`;
`auto` also tries that variant (`static-qdq-x86-avx2`) and keeps it when it is the fastest passing one.

`mode: auto` tries the candidates of the table below, in that order of preference (earlier wins ties).

- **Inputs**: one upstream `model` (or `model_from`); the recipe's `data:` for static/auto and
  weight_only's gptq (optional for the other modes: the held-out split judges quality).
- **Outputs**: `model` (`model.onnx`; in auto mode also `candidates.json`).
- **Metrics**: `mode`, `settings` (the resolved settings), `calibration`, `task`, `accuracy`,
  `fp32_accuracy`, `accuracy_drop`, `parity`, `latency_p50_ms`, `fp32_latency_p50_ms`, `speedup`,
  `size_bytes`, `fp32_size_bytes`, `slower_than_fp32`, `flags`; auto adds `candidates`,
  `candidates_table`, `chosen`; weight_only's `settings` hold `algorithm`, `bits`, `block_size`,
  `symmetric`, `accuracy_level` (and its onnxruntime value), `op_types`, `exclude`, `keep_8bit`, and
  `weight_only` counts what the graph holds (`layers` by bits, `gathers`, `kept_float`, block sizes,
  accuracy levels); a decoder adds `latency_measures`. Latencies vary run to run; the model bytes do not (in auto mode
  the winner is chosen by measured latency, made stable by `tie_tolerance`).

This docstring is the kind's description on the docs site (docs/kinds.md, written by
scripts/gen_kinds_doc.py): Markdown, for users.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, field_validator, model_serializer, model_validator

from zoo.errors import GateFailed, InvalidInput, StageFailed
from zoo.stage import Inputs, KeyContext, KindConfig, StageContext, StageKind
from zoo_stages.lib.quality.numeric_outputs import NumericOutputs
from zoo_stages.lib.quality import tasks
from zoo_stages.lib.quantization import quant_ops
from zoo_stages.lib.quantization.quant_select import candidates_table, select_candidate
from zoo_stages.lib.quantization.quant_settings import (CANDIDATES, WEIGHT_ONLY_CANDIDATES, Settings, resolve,
                                                        saturation_hint)
from zoo_stages.lib.quantization.weight_only import WeightOnlyConfig, check_op_types
from zoo_stages.lib.runtimes.step_log import StepLog

QuantTypeName = Literal["QInt8", "QUInt8"]

_TYPE_ALIASES = {"qint8": "QInt8", "int8": "QInt8", "s8": "QInt8", "quint8": "QUInt8", "uint8": "QUInt8", "u8": "QUInt8"}


class CalibrationConfig(KindConfig):
    """Which training samples calibrate the activation ranges, and how."""

    samples: int = Field(64, ge=1, le=100_000, description="number of train-split samples (fixed seeded sample)")
    method: Literal["minmax", "entropy", "percentile"] = "minmax"
    seed: int = Field(0, description="seed of the calibration sample")
    batch_size: int = Field(8, ge=1, le=1024, description="samples per calibration batch (models with a dynamic batch)")
    percentile: float = Field(99.999, gt=0, le=100, description="kept percentile for method: percentile")


class AcceptConfig(KindConfig):
    """What a candidate must achieve to be picked in auto mode (also flagged in other modes)."""

    max_accuracy_drop: float = Field(0.01, ge=0, le=1, description="fp32 accuracy minus quantized accuracy")
    min_cosine: float = Field(0.99, ge=-1, le=1, description="where accuracy does not apply (regression, generic, "
                                                             "no labels): lowest mean cosine of the outputs to fp32's")
    min_speedup: float = Field(1.0, ge=0, description="fp32 p50 / quantized p50; below 1.0 means slower than fp32")
    tie_tolerance: float = Field(0.05, ge=0, le=1, description="p50 within this share of the fastest counts as a tie")


class LatencyConfig(KindConfig):
    """How latency is measured (batch 1)."""

    warmup: int = Field(5, ge=0, le=10_000)
    runs: int = Field(30, ge=1, le=100_000, description="timed runs per model (at most, see min_runs)")
    min_runs: int | None = Field(
        5, ge=1, le=100_000, description="static/dynamic modes: stop after this many interleaved runs once the "
                                         "quantized and fp32 models are clearly apart (null: always `runs`); "
                                         "auto mode always times `runs`")
    threads: int = Field(1, ge=1, le=1024)
    dynamic_size: int = Field(1, ge=1, le=100_000, description="without data: size of dynamic dimensions other "
                                                               "than the batch (e.g. the sequence) in the timed inputs")


# the fields of the int8 modes, which mode: weight_only does not take
_INT8_FIELDS = ("format", "per_channel", "reduce_range", "activation_type", "weight_type", "preset", "preprocess",
                "linear", "linear_block_size")


class QuantizeConfig(KindConfig):
    mode: Literal["dynamic", "static", "auto", "weight_only"] = "static"
    format: Literal["qdq", "qoperator"] | None = Field(None, description="static only; default qdq")
    per_channel: bool | None = Field(None, description="per-channel weight scales (static/dynamic); default false")
    reduce_range: bool | None = Field(None, description="7-bit weights, for x86 without VNNI; default from preset or false")
    activation_type: QuantTypeName | None = Field(None, description="static only: QInt8 or QUInt8")
    weight_type: QuantTypeName | None = Field(None, description="QInt8 or QUInt8")
    preset: Literal["x86-vnni", "x86-avx2", "arm64", "tensorrt"] | None = Field(
        None, description="target device defaults (tensorrt: symmetric int8, per-channel, float biases: what "
                          "TensorRT's explicit quantization runs)")
    preprocess: bool | None = Field(None, description="run quant_pre_process first; default true for static")
    linear: Literal["qdq", "blockwise"] | None = Field(
        None, description="static only: how fully connected layers (Gemm, MatMul with a constant weight) are "
                          "quantized. qdq (default): like the rest of the model (QGemm). blockwise: onnxruntime's "
                          "MatMulNBits, 8-bit weights with one scale per `linear_block_size` inputs, computed in "
                          "int8 (accuracy_level 4); faster at batch 1 on x86 with VNNI, onnxruntime-only")
    linear_block_size: int = Field(256, ge=16, le=4096, description="blockwise: weights per scale (a power of two)")
    calibration: CalibrationConfig = Field(default_factory=CalibrationConfig)
    accept: AcceptConfig = Field(default_factory=AcceptConfig)
    latency: LatencyConfig = Field(default_factory=LatencyConfig)
    candidates: list[str] | None = Field(None, description=f"auto only: subset of {', '.join(CANDIDATES)} (default: "
                                                           f"all of them), and of {', '.join(WEIGHT_ONLY_CANDIDATES)} "
                                                           "(tried only when named, with `weight_only:`'s settings)")
    eval_samples: int | None = Field(None, ge=1, description="use at most this many held-out samples for accuracy "
                                                              "and parity")
    op_types: list[str] | None = Field(None, description="only quantize these op types (default: all supported; "
                                                         "weight_only: MatMul, and Gather for embeddings)")
    weight_only: WeightOnlyConfig | None = Field(
        None, description="mode: weight_only only: algorithm, bits, block size, symmetric, accuracy level, "
                          "layers excluded or kept at 8 bits (defaults: rtn, 4 bits, blocks of 32, int8 compute)")
    model_from: str | None = Field(None, description="upstream stage id whose `model` to quantize (default: the only one)")

    @model_serializer(mode="wrap")
    def _record(self, handler):
        """`weight_only` enters the stage's record only where it is set: the records (and lockfiles)
        of the int8 modes stay those of the config without it."""
        data = handler(self)
        if "weight_only" not in self.model_fields_set:
            data.pop("weight_only", None)
        return data

    @field_validator("activation_type", "weight_type", mode="before")
    @classmethod
    def _type_alias(cls, v):
        if isinstance(v, str):
            return _TYPE_ALIASES.get(v.lower(), v)
        return v

    @field_validator("candidates")
    @classmethod
    def _known_candidates(cls, v):
        if v is not None:
            if not v:
                raise ValueError("candidates must name at least one candidate")
            unknown = [c for c in v if c not in CANDIDATES + WEIGHT_ONLY_CANDIDATES]
            if unknown:
                raise ValueError(f"unknown candidate {unknown[0]!r}; valid candidates: "
                                 f"{', '.join(CANDIDATES + WEIGHT_ONLY_CANDIDATES)}")
            if len(set(v)) != len(v):
                raise ValueError("candidates lists a candidate twice")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        given = self.model_fields_set
        if self.mode == "weight_only":
            return self._weight_only_consistent(given)
        if "weight_only" in given and self.weight_only is not None:
            named = [c for c in self.candidates or () if c in WEIGHT_ONLY_CANDIDATES]
            if self.mode != "auto" or not named:
                raise ValueError("weight_only applies to mode: weight_only, and to mode: auto's weight-only "
                                 f"candidates ({', '.join(WEIGHT_ONLY_CANDIDATES)}); set `mode: weight_only` or "
                                 "remove it")
            if "bits" in self.weight_only.model_fields_set:
                raise ValueError("weight_only.bits is chosen by mode: auto's candidate names (weight-only-int4, "
                                 "weight-only-int8); remove it")
        if self.mode == "dynamic":
            if "activation_type" in given and self.activation_type is not None:
                raise ValueError("activation_type does not apply to mode: dynamic (activations are quantized to "
                                 "uint8 at run time); remove it or use mode: static")
            if "format" in given and self.format is not None:
                raise ValueError("format does not apply to mode: dynamic (it always writes integer operators); "
                                 "remove it or use mode: static")
            if "calibration" in given:
                raise ValueError("calibration does not apply to mode: dynamic; remove it or use mode: static")
            if "linear" in given and self.linear is not None:
                raise ValueError("linear does not apply to mode: dynamic (it quantizes every layer the same way); "
                                 "remove it or use mode: static")
        if self.preset == "tensorrt" and (self.mode != "static" or self.format == "qoperator"
                                          or self.linear == "blockwise"):
            raise ValueError("preset: tensorrt makes a static QDQ model (TensorRT's explicit quantization); use "
                             "mode: static with format: qdq and linear: qdq, or another preset")
        if self.linear_block_size & (self.linear_block_size - 1):
            raise ValueError(f"linear_block_size must be a power of two (got {self.linear_block_size})")
        if self.mode == "auto":
            for key in ("format", "per_channel", "linear"):
                if key in given and getattr(self, key) is not None:
                    raise ValueError(f"{key} is chosen by mode: auto; restrict the search with `candidates:` instead")
        elif "candidates" in given and self.candidates is not None:
            raise ValueError("candidates applies to mode: auto only")
        return self

    def _weight_only_consistent(self, given):
        for key in _INT8_FIELDS:
            if key in given and getattr(self, key) is not None:
                raise ValueError(f"{key} does not apply to mode: weight_only (it quantizes weights only, to "
                                 "MatMulNBits blocks); remove it, or set bits/block_size/symmetric under "
                                 "`weight_only:`")
        if "candidates" in given and self.candidates is not None:
            raise ValueError("candidates applies to mode: auto only")
        wo = self.weight_only_settings()
        if "calibration" in given and wo.algorithm != "gptq":
            raise ValueError(f"calibration does not apply to weight_only algorithm {wo.algorithm} "
                             "(data-free); remove it, or use algorithm: gptq")
        cal = self.calibration
        if "calibration" in given and ({"method", "percentile"} & cal.model_fields_set):
            raise ValueError("calibration.method and calibration.percentile do not apply to gptq (it reads layer "
                             "inputs, not activation ranges); keep samples, seed and batch_size")
        check_op_types(wo, self.op_types)
        return self

    def weight_only_settings(self) -> WeightOnlyConfig:
        """`weight_only:` as given, or its defaults."""
        return self.weight_only or WeightOnlyConfig()


class Quantize(NumericOutputs, StageKind):
    name = "quantize"
    # 2: provenance metadata_props; 3: every named input fed, task-aware quality, transformer and external-data models
    # 4: equivalence across platform classes by model outputs and quality (zoo_stages.lib.quality.equivalence)
    version = "4"
    Config = QuantizeConfig
    tools = ("onnx", "onnxruntime", "numpy")
    shared = ("data", "task", "model.inputs")
    outputs = ("model",)
    recipe_fields = ("license",)  # stamped into the model (zoo.license)
    summary = "int8 post-training quantization (dynamic, static QDQ/QOperator, or auto-selected); weight-only int4/int8"

    def dependencies(self, config: QuantizeConfig, ctx: KeyContext) -> list[Path]:
        data = ctx.shared.get("data")
        if not data:
            return []
        from zoo_stages.lib.data.datasets import data_dependencies

        return data_dependencies(data, ctx.recipe.dir)

    def tools_used(self, config: QuantizeConfig, ctx: KeyContext) -> tuple[str, ...]:
        """`tools`, and torch for weight_only's hqq (onnxruntime's HQQ quantizer computes with it)."""
        if config.mode == "weight_only" and config.weight_only_settings().algorithm == "hqq":
            return (*self.tools, "torch")
        return self.tools

    def stage_references(self, config: QuantizeConfig) -> dict[tuple[str | int, ...], str]:
        """`model_from` names the stage whose model this one reads."""
        return {("model_from",): config.model_from} if config.model_from else {}

    def run(self, inputs: Inputs, config: QuantizeConfig, context: StageContext) -> Mapping[str, Path]:
        return _Run(inputs, config, context).go()


class _Run:
    """One execution of the quantize stage (keeps the shared state of its steps together)."""

    def __init__(self, inputs: Inputs, config: QuantizeConfig, context: StageContext):
        self.config, self.context = config, context
        self.work = Path(context.work_dir) / "quantize"
        self.work.mkdir(parents=True, exist_ok=True)
        self.data = context.shared.get("data")
        self.task = tasks.kind_of(context.shared.get("task") or "image-classification")  # the recipe's default
        self.declared = (context.shared.get("model") or {}).get("inputs")
        self.src = inputs.stage(config.model_from).outputs["model"] if config.model_from else inputs.one("model")
        # a causal LM export's `genai` output (genai_config.json: the head size its cache inputs leave symbolic)
        self.genai = [Path(path) for _, path in sorted(inputs.all("genai").items())]
        from zoo_stages.lib.release import provenance

        # every model this run writes (the output, auto's candidates) carries the same stamp
        self.props = provenance.artifact_props(Quantize.name, context.record, context.recipe.license,
                                               provenance.input_digests(inputs), provenance.upstream_attribution(inputs))
        self.flags: list[str] = []
        self._preprocessed: Path | None = None
        self._val: tuple | None = None
        self._calib: tuple | None = None
        self._fp32_outputs: dict | None = None
        self.custom_ops: list[str] = []
        self.external = False
        self._decoder: bool | None = None

    # -- inputs --------------------------------------------------------------------------------

    def go(self) -> Mapping[str, Path]:
        import onnx

        from zoo.files import hardlink_or_copy
        from zoo.pathsafety import external_data_files
        from zoo_stages.lib.onnx import onnx_fields, onnx_io

        src = Path(self.src)
        loadable = onnx_io.loadable_as_is(src)  # also checks that external data stays beside the model
        data_files = external_data_files(src)
        # graph only: the weights are never parsed here
        model = onnx.load(str(src), load_external_data=False)
        # onnxruntime's own fused/layout ops (optimize's transformer fusions, level extended/all)
        self.custom_ops = sorted(k for k in onnx_io.op_counts(model) if k.startswith("com.microsoft"))
        if self.custom_ops and self.config.mode == "static":
            raise InvalidInput(f"static quantization cannot handle onnxruntime-specific operators "
                               f"({', '.join(self.custom_ops)})",
                               hint="use `mode: dynamic` (it quantizes fused transformer graphs), or feed quantize "
                                    "a model optimized without `transformer:` at `level: basic`")
        # The quantizer reads the upstream file through a hard link in the work folder (it writes
        # temp files next to its input: never into the cache); external data files are copied
        # beside it under their own names (onnx refuses hard-linked external data). A model whose
        # IR version needs fixing is copied and its header rewritten (no weight is re-serialised).
        self.fp32_path = self.work / "fp32.onnx"
        self.fp32_path.unlink(missing_ok=True)
        if loadable:
            hardlink_or_copy(src, self.fp32_path)
        else:
            shutil.copyfile(src, self.fp32_path)
            onnx_fields.rewrite(self.fp32_path, ir_version=onnx_io.MAX_IR_VERSION)
        for rel in data_files:
            target = self.work / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            shutil.copyfile(src.parent / rel, target)
        self.external = bool(data_files)
        needs_data = self.config.mode in ("static", "auto")
        if needs_data and not self.data:
            raise InvalidInput(f"quantize mode {self.config.mode!r} needs the recipe's `data:` section "
                               "(calibration samples and a held-out split)",
                               hint="add a `data:` section, or use `mode: dynamic`")
        if self.config.mode == "weight_only":
            if self.config.weight_only_settings().algorithm == "gptq" and not self.data:
                raise InvalidInput("weight_only algorithm gptq needs the recipe's `data:` section (its calibration "
                                   "samples)", hint="add a `data:` section, or use a data-free algorithm (rtn, hqq, "
                                                    "k_quant)")
            return self._weight_only()
        if self.config.mode == "auto":
            return self._auto()
        return self._single()

    def _val_split(self):
        """The held-out split (at most eval_samples), loaded once; InvalidInput when empty."""
        if self._val is None:
            from zoo_stages.lib.data.datasets import load_split

            split = load_split(self.data, self.context.recipe.dir, "val").head(self.config.eval_samples)
            if len(split) == 0:
                raise InvalidInput("the held-out split is empty", hint="raise data.val_fraction or add data")
            self._val = split
        return self._val

    def _calibration(self) -> tuple[dict[str, Any], int, bool]:
        """(feeds of every input, batch size, fixed batch?) for calibration, computed once per run.

        The samples are a seeded sample of the train split, sorted by index, so the same recipe
        always calibrates on the same samples in the same order.
        """
        if self._calib is None:
            from zoo_stages.lib.runtimes import onnx_run, ort_session

            session = ort_session.make_session(self.fp32_path, threads=1, level="disable")
            fixed = onnx_run.fixed_batch(session)
            feeds = onnx_run.bind(session, self._calibration_split().features, where="the training split")
            feeds = onnx_run.prepare(session, feeds, where="the training split")  # checked and cast once
            self._calib = (feeds, fixed or self.config.calibration.batch_size, fixed is not None)
        return self._calib

    def _calibration_split(self):
        """A seeded sample of the train split (calibration.samples), sorted by index."""
        import numpy as np

        from zoo_stages.lib.data.datasets import load_split

        split = load_split(self.data, self.context.recipe.dir, "train")
        wanted = self.config.calibration.samples
        n = min(wanted, len(split))
        if n < wanted:
            self.flags.append(f"calibration uses all {n} training samples (fewer than calibration.samples={wanted})")
        idx = np.sort(np.random.default_rng(self.config.calibration.seed).choice(len(split), size=n, replace=False))
        return split.take(idx)

    # -- quantization --------------------------------------------------------------------------

    def _source_for(self, settings: Settings) -> Path:
        """The model onnxruntime quantizes: preprocessed (once) when the settings ask for it."""
        if not settings.preprocess:
            return self.fp32_path
        if self._preprocessed is None:
            from onnxruntime.quantization.shape_inference import quant_pre_process

            target = self.work / "preprocessed.onnx"
            try:
                quant_pre_process(str(self.fp32_path), str(target), save_as_external_data=self.external)
                self._preprocessed = target
            except Exception as e:  # symbolic shape inference raises bare Exception/TypeError on odd graphs
                if settings.preprocess_explicit:
                    raise StageFailed(f"quant_pre_process failed on the model: {e}",
                                      hint="set `preprocess: false` to quantize without it") from None
                self.flags.append(f"quant_pre_process failed ({e}); quantized without it")
                self._preprocessed = self.fp32_path
        return self._preprocessed

    def quantize(self, settings: Settings, target: Path) -> Path:
        """Quantize the fp32 input with `settings` into `target` (a deterministic, self-contained file)."""
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_dynamic, quantize_static


        if settings.mode == "static" and self.custom_ops:  # auto's static candidates (static mode is refused earlier)
            raise ValueError(f"static quantization cannot handle onnxruntime-specific operators "
                             f"({', '.join(self.custom_ops)})")
        src = self._source_for(settings)
        raw = self.work / f"{settings.name}.raw.onnx"
        common = dict(per_channel=settings.per_channel, reduce_range=settings.reduce_range,
                      weight_type=getattr(QuantType, settings.weight_type),
                      op_types_to_quantize=list(self.config.op_types) if self.config.op_types else None,
                      use_external_data_format=self.external)
        if settings.mode == "dynamic":
            import onnx

            # shape inference cannot type the outputs of com.microsoft fused ops: they are float
            quantize_dynamic(str(src), str(raw), extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT}, **common)
        else:
            feeds, batch_size, fixed = self._calibration()
            method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                      "percentile": CalibrationMethod.Percentile}[settings.calibration]
            extra = {"CalibPercentile": self.config.calibration.percentile} if settings.calibration == "percentile" else {}
            extra.update(settings.extra_options())
            reader = quant_ops.calibration_reader(feeds, batch_size, fixed=fixed, log=self.context.log)
            linear = []
            if settings.linear == "blockwise":
                src, linear = quant_ops.linear_nodes(src, self.work / "named.onnx")
            quantize_static(str(src), str(raw), reader,
                            quant_format=QuantFormat.QDQ if settings.format == "qdq" else QuantFormat.QOperator,
                            activation_type=getattr(QuantType, settings.activation_type),
                            calibrate_method=method, extra_options=extra, nodes_to_exclude=linear or None,
                            **common)
            if linear:
                quant_ops.blockwise_linear(raw, settings.linear_block_size)
        self._require_quantized(raw)
        return self._finish(raw, target)

    def _require_quantized(self, raw: Path) -> None:
        """InvalidInput when the quantizer changed nothing (a tree ensemble, or `op_types` the model
        lacks): a build called int8 must hold quantized operators."""
        import onnx

        from zoo_stages.lib.onnx import onnx_io

        ops = onnx_io.op_counts(onnx.load(str(raw), load_external_data=False))
        if any(_is_quantized_op(op) for op in ops):
            return
        source = onnx_io.op_counts(onnx.load(str(self.fp32_path), load_external_data=False))
        shown = ", ".join(f"{op} x{n}" for op, n in sorted(source.items(), key=lambda kv: -kv[1])[:6])
        asked = f" of op_types {', '.join(self.config.op_types)}" if self.config.op_types else ""
        raise InvalidInput(f"nothing to quantize: onnxruntime's quantizer left every operator{asked} of this model "
                           f"in float ({shown}); it quantizes Conv, MatMul, Gemm, Attention, LSTM and embedding "
                           "Gathers, not tree ensembles or other ai.onnx.ml operators",
                           hint="drop the quantize stage and deploy the fp32 build" +
                                (", or widen `op_types`" if self.config.op_types else ""))

    def _finish(self, raw: Path, target: Path, props: Mapping[str, str] | None = None) -> Path:
        """Stamp the quantizer's output with provenance (`props`, default the run's) and its pruned
        opset imports (written in place after the graph) and move it to `target`."""
        import onnx

        from zoo.pathsafety import external_data_files
        from zoo_stages.lib.onnx import onnx_fields, onnx_io
        from zoo_stages.lib.release import provenance

        if external_data_files(raw):  # only above 2 GB: make one self-contained file
            onnx_io.save_model(onnx_io.load_model(raw), raw)
        model = onnx_io.prune_opset_imports(onnx.load(str(raw), load_external_data=False))
        if model.ir_version > onnx_io.MAX_IR_VERSION:
            onnx_fields.rewrite(raw, ir_version=onnx_io.MAX_IR_VERSION)
        provenance.stamp_file(raw, self.props if props is None else props,
                              opset_import=[(o.domain, o.version) for o in model.opset_import])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(raw), str(target))
        return target

    # -- measurement ---------------------------------------------------------------------------

    def measure(self, path: Path) -> dict[str, Any]:
        """p50/p90 latency at batch 1, and the quality (task-aware, see the module docstring) of one model."""
        from zoo_stages.lib.runtimes import timing as timinglib

        lat_cfg = self.config.latency
        row, timing, sample = self._prepare(path)
        stats = timinglib.measure_latency(timing, sample, warmup=lat_cfg.warmup, runs=lat_cfg.runs,
                                          progress=StepLog(self.context.log, f"latency {path.stem}", lat_cfg.runs))
        row["latency_p50_ms"], row["latency_p90_ms"] = stats["p50_ms"], stats["p90_ms"]
        row["latency_runs"] = stats["runs"]
        return row

    def measure_pair(self, fp32_prepared: tuple, path: Path, precision: str = "int8") -> tuple[dict[str, Any], dict[str, Any]]:
        """`measure` of the fp32 parent (`_prepare`d) and the quantized model (`precision`, as the
        progress lines name it), timed in interleaved rounds that stop early (latency.min_runs) once
        one is clearly faster."""
        from zoo_stages.lib.runtimes import timing as timinglib

        lat_cfg = self.config.latency
        fp32, fp32_timing, sample = fp32_prepared
        row, timing, _ = self._prepare(path)
        stats = timinglib.compare_latency({"fp32": fp32_timing, precision: timing}, sample, warmup=lat_cfg.warmup,
                                         runs=lat_cfg.runs, min_runs=lat_cfg.min_runs,
                                         progress=StepLog(self.context.log, f"latency fp32 and {precision}",
                                                          lat_cfg.runs))
        for target, key in ((fp32, "fp32"), (row, precision)):
            target["latency_p50_ms"], target["latency_p90_ms"] = stats[key]["p50_ms"], stats[key]["p90_ms"]
            target["latency_runs"] = stats[key]["runs"]
        return fp32, row

    def _eval_feeds(self, session) -> tuple[dict[str, Any], Any]:
        """(feeds of every input, labels or None) the models are evaluated on: the held-out split
        bound to the model's inputs, or without data seeded random feeds."""
        from zoo_stages.lib.runtimes import onnx_run

        if self.data:
            split = self._val_split()
            feeds = onnx_run.bind(session, split.features, where="the held-out split")
            return onnx_run.prepare(session, feeds, where="the held-out split"), split.labels
        size = self.config.latency.dynamic_size
        shapes = onnx_run.declared_shapes(session, self.declared, sequence=size)
        for spec in onnx_run.input_specs(session):  # undeclared dynamic dims other than the batch
            if spec.name not in shapes and spec.shape:
                shapes[spec.name] = [d if isinstance(d, int) and d > 0 else size for d in spec.shape[1:]]
        samples = onnx_run.fixed_batch(session) or _RANDOM_SAMPLES
        return onnx_run.random_feeds(session, samples, seed=0, shapes=shapes), None

    def _prepare(self, path: Path):
        """(row with size and quality, a timing session, the batch-1 feeds to time) for one model.

        The first model prepared is the fp32 parent: its outputs are kept, and every later
        model's outputs are compared with them (`zoo_stages.lib.quality.parity`).
        """
        from zoo_stages.lib.runtimes import onnx_run, ort_session
        from zoo_stages.lib.quality import parity as paritylib
        from zoo_stages.lib.runtimes import timing as timinglib

        timing = ort_session.make_session(path, threads=self.config.latency.threads, level="all")
        row: dict[str, Any] = {"size_bytes": Path(path).stat().st_size + _external_bytes(Path(path))}
        feeds, labels = self._eval_feeds(timing)
        sample = timinglib.batch_of(feeds, onnx_run.fixed_batch(timing) or 1)
        evaluator = ort_session.make_session(path, threads=1, level="all")
        outputs = onnx_run.run(evaluator, feeds, batch_size=32, where="the held-out split" if self.data else "the inputs")
        row["accuracy"] = None
        if self.task == "classification" and labels is not None:
            row["accuracy"] = _accuracy(onnx_run.output_specs(evaluator), outputs, labels)
        if self._fp32_outputs is None:
            self._fp32_outputs = outputs
        else:
            report = paritylib.compare(self._fp32_outputs, outputs)
            row["parity"] = {"max_abs": _finite(report.max_abs), "cosine": _finite(report.cosine),
                             "cosine_min": _finite(report.cosine_min), "top1_agreement": report.top1_agreement,
                             "samples": report.samples}
            row["cosine"] = row["parity"]["cosine"]
        return row, timing, sample

    def _compare(self, row: dict[str, Any], fp32: dict[str, Any]) -> dict[str, Any]:
        row["speedup"] = fp32["latency_p50_ms"] / row["latency_p50_ms"] if row.get("latency_p50_ms") else None
        row["accuracy_drop"] = (fp32["accuracy"] - row["accuracy"]
                                if row.get("accuracy") is not None and fp32.get("accuracy") is not None else None)
        return row

    # -- modes ---------------------------------------------------------------------------------

    def _single(self) -> Mapping[str, Path]:
        settings = resolve(self.config)
        if settings.mode == "static" and settings.format == "qoperator" and settings.activation_type == "QInt8":
            self.flags.append("S8S8 in QOperator format is slow on x86-64 (onnxruntime docs); prefer qdq or uint8 activations")
        out = self.quantize(settings, self.context.output_path("model.onnx"))
        fp32, row = self.measure_pair(self._prepare(self.fp32_path), out)
        row = self._compare(row, fp32)
        self._flag(row, fp32, saturation_hint(settings))
        self._record(settings, row, fp32)
        for flag in self.flags:
            self.context.log.warning("quantize: %s", flag)
        return {"model": out}

    def _flag(self, row: dict[str, Any], fp32: dict[str, Any], hint: str) -> None:
        """Flags for a build slower than fp32 or beyond `accept` (warnings: verify gates on them)."""
        accept = self.config.accept
        if row["speedup"] is not None and row["speedup"] < 1.0:
            self.flags.append(f"the quantized model is slower than its fp32 parent on this host "
                              f"({row['latency_p50_ms']:.3f} ms vs {fp32['latency_p50_ms']:.3f} ms, "
                              f"speedup {row['speedup']:.2f}x)")
        if row["accuracy_drop"] is not None and row["accuracy_drop"] > accept.max_accuracy_drop:
            self.flags.append(f"accuracy drop {row['accuracy_drop']:.4f} exceeds accept.max_accuracy_drop "
                              f"{accept.max_accuracy_drop:g}" + hint)
        elif row["accuracy_drop"] is None and row.get("cosine") is not None and row["cosine"] < accept.min_cosine:
            self.flags.append(f"the outputs' cosine to fp32's is {row['cosine']:.4f}, below accept.min_cosine "
                              f"{accept.min_cosine:g}" + hint)

    def _weight_only(self) -> Mapping[str, Path]:
        """mode: weight_only (`zoo_stages.lib.quantization.weight_only`), measured like static/dynamic."""
        settings = self._weight_only_settings()
        out, summary = self._build_weight_only(settings, self.context.output_path("model.onnx"))
        if self._is_decoder():
            fp32, row = self._decoder_pair(out)
        else:
            fp32, row = self.measure_pair(self._prepare(self.fp32_path), out, f"int{settings.bits}")
        row = self._compare(row, fp32)
        self._flag(row, fp32, "")
        self._record(settings, row, fp32)
        self.context.metrics["weight_only"] = summary
        for flag in self.flags:
            self.context.log.warning("quantize: %s", flag)
        return {"model": out}

    def _weight_only_settings(self, candidate: str | None = None):
        """The resolved weight-only settings: of `weight_only:`, or of an auto candidate (its bits)."""
        from zoo_stages.lib.quantization import weight_only

        config = self.config.weight_only_settings()
        if candidate is not None:
            config = config.model_copy(update={"bits": 8 if candidate == "weight-only-int8" else 4})
            config = weight_only.WeightOnlyConfig.model_validate(config.model_dump())  # its checks at these bits
        return weight_only.resolve(config, self.config.op_types)

    def _build_weight_only(self, settings, target: Path) -> tuple[Path, dict[str, Any]]:
        """(the weight-only model at `target`, stamped with what it is, what its graph holds)."""
        from zoo_stages.lib.quantization import weight_only
        from zoo_stages.lib.release.provenance import canonical

        raw = self.work / f"{settings.name}.raw.onnx"
        summary = weight_only.quantize(self.fp32_path, raw, settings,
                                       calibration=self._gptq_reader if settings.algorithm == "gptq" else None)
        # what the build is (algorithm, bits, block size, accuracy level), for deploy's manifest entry
        props = {**self.props, "zoo.quantization": canonical(settings.stamp())}
        return self._finish(raw, target, props), summary

    def _gptq_reader(self):
        """GPTQ's calibration reader: the calibration sample's feeds (a decoder's: prefills of its token rows)."""
        if self._is_decoder():
            from zoo_stages.lib.quantization import decoder_eval
            from zoo_stages.lib.runtimes import ort_session

            session = ort_session.make_session(self.fp32_path, threads=1, level="disable")
            rows = decoder_eval.token_rows(self._calibration_split(), vocab=0, limit=None)
            return decoder_eval.calibration_reader(rows, session, self._head_size(),
                                                   self.config.calibration.batch_size)
        feeds, batch_size, fixed = self._calibration()
        return quant_ops.calibration_reader(feeds, batch_size, fixed=fixed, log=self.context.log)

    # -- decoders (zoo.decoder_io's convention) ----------------------------------------------------

    def _is_decoder(self) -> bool:
        if self._decoder is None:  # from the graph's inputs: no session, no weights loaded
            import onnx

            from zoo import decoder_io

            graph = onnx.load(str(self.fp32_path), load_external_data=False).graph
            self._decoder = decoder_io.is_decoder(i.name for i in graph.input)
        return self._decoder

    def _head_size(self) -> int | None:
        from zoo_stages.lib.quantization import decoder_eval

        return decoder_eval.head_size(self.fp32_path, Path(self.src), *self.genai)

    def _decoder_pair(self, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """(fp32 row, quantized row) of a decoder: prefill logits compared, a generation timed
        (`zoo_stages.lib.quantization.decoder_eval`)."""
        from zoo_stages.lib.quality import parity as paritylib
        from zoo_stages.lib.quantization import decoder_eval
        from zoo_stages.lib.runtimes import ort_session

        lat = self.config.latency
        head = self._head_size()
        evaluators = {k: ort_session.make_session(p, threads=1, level="all")
                      for k, p in (("fp32", self.fp32_path), ("quantized", path))}
        rows = decoder_eval.token_rows(self._val_split() if self.data else None,
                                       vocab=decoder_eval.vocab_size(evaluators["fp32"]), limit=self.config.eval_samples)
        ref = decoder_eval.prefill_logits(evaluators["fp32"], rows, head)
        got = decoder_eval.prefill_logits(evaluators["quantized"], rows, head)
        report = paritylib.compare(ref, got)
        prompt = rows[:1, :decoder_eval.PROMPT_TOKENS]
        timers = {k: ort_session.make_session(p, threads=lat.threads, level="all")
                  for k, p in (("fp32", self.fp32_path), ("quantized", path))}
        stats = decoder_eval.time_generation(timers, prompt, head, warmup=lat.warmup, runs=lat.runs,
                                             progress=StepLog(self.context.log, "latency fp32 and quantized "
                                                                                "(generation)", lat.runs))
        fp32 = {"size_bytes": self.fp32_path.stat().st_size + _external_bytes(self.fp32_path), "accuracy": None}
        row: dict[str, Any] = {"size_bytes": Path(path).stat().st_size, "accuracy": None}
        row["parity"] = {"max_abs": _finite(report.max_abs), "cosine": _finite(report.cosine),
                         "cosine_min": _finite(report.cosine_min), "top1_agreement": report.top1_agreement,
                         "samples": report.samples}
        row["cosine"] = row["parity"]["cosine"]
        for target, key in ((fp32, "fp32"), (row, "quantized")):
            target["latency_p50_ms"], target["latency_p90_ms"] = stats[key]["p50_ms"], stats[key]["p90_ms"]
            target["latency_runs"] = stats[key]["runs"]
        self.context.metrics["latency_measures"] = decoder_eval.measured(int(prompt.shape[1]))
        return fp32, row

    def _auto(self) -> Mapping[str, Path]:
        from zoo.files import atomic_write_json

        names = list(self.config.candidates or CANDIDATES)
        fp32 = self.measure(self.fp32_path)
        rows, built = [], {}
        summaries: dict[str, Any] = {}
        for name in names:
            weight_only = name in WEIGHT_ONLY_CANDIDATES
            settings = self._weight_only_settings(name) if weight_only else resolve(self.config, name)
            row: dict[str, Any] = {"name": name, "settings": settings.record() if weight_only else asdict(settings)}
            try:
                target = self.work / "candidates" / f"{name}.onnx"
                if weight_only:
                    path, summaries[name] = self._build_weight_only(settings, target)
                else:
                    path = self.quantize(settings, target)
                built[name] = path
                row.update(self.measure(path))
                self._compare(row, fp32)
            except (InvalidInput, StageFailed):
                raise
            except Exception as e:  # one candidate the quantizer cannot build must not stop the search
                row["error"] = f"{type(e).__name__}: {e}"
                self.context.log.warning("quantize: candidate %s failed: %s", name, row["error"])
            rows.append(row)
        accept = self.config.accept
        chosen = select_candidate(rows, max_accuracy_drop=accept.max_accuracy_drop, min_speedup=accept.min_speedup,
                                  tie_tolerance=accept.tie_tolerance, min_cosine=accept.min_cosine)
        table = candidates_table(rows, chosen)
        record = {"fp32": fp32, "candidates": rows, "chosen": chosen,
                  "accept": self.config.accept.model_dump(), "latency": self.config.latency.model_dump()}
        atomic_write_json(self.context.output_path("candidates.json"), record, fsync=False)
        self.context.metrics["candidates"] = rows
        self.context.metrics["candidates_table"] = table
        self.context.log.info("quantize auto candidates:\n%s", table)
        for row in rows:
            if row.get("slower_than_fp32"):
                self.flags.append(f"candidate {row['name']} is slower than the fp32 parent "
                                  f"(speedup {row['speedup']:.2f}x)")
        if chosen is None:
            self.context.metrics["flags"] = self.flags
            raise GateFailed("no quantization candidate met accept: "
                             f"max_accuracy_drop {accept.max_accuracy_drop:g} (or min_cosine {accept.min_cosine:g} "
                             f"where accuracy does not apply), min_speedup {accept.min_speedup:g}",
                             table=table,
                             hint="relax `accept:`, calibrate on more samples, or keep the fp32 model"
                                  # the hint suggests the x86-avx2 types: pointless when auto tried them
                                  + ("" if "static-qdq-x86-avx2" in names
                                     else _first_int8_hint(self.config, names)))
        out = self.context.output_path("model.onnx")
        shutil.copyfile(built[chosen], out)  # already stamped and self-contained
        winner = next(r for r in rows if r["name"] == chosen)
        if chosen in WEIGHT_ONLY_CANDIDATES:
            self._record(self._weight_only_settings(chosen), winner, fp32)
            self.context.metrics["weight_only"] = summaries[chosen]
        else:
            self._record(resolve(self.config, chosen), winner, fp32)
        self.context.metrics["chosen"] = chosen
        return {"model": out}

    def _record(self, settings: Any, row: dict[str, Any], fp32: dict[str, Any]) -> None:
        weight_only = settings.mode == "weight_only"
        calibrated = settings.mode == "static" or (weight_only and settings.algorithm == "gptq")
        self.context.metrics.update({
            "mode": self.config.mode,
            "preset": self.config.preset,
            "settings": settings.record() if weight_only else asdict(settings),
            "calibration": ({"samples": self.config.calibration.samples,
                             "method": "gptq" if weight_only else settings.calibration,
                             "seed": self.config.calibration.seed} if calibrated else None),
            "size_bytes": row.get("size_bytes"),
            "fp32_size_bytes": fp32.get("size_bytes"),
            "accuracy": row.get("accuracy"),
            "fp32_accuracy": fp32.get("accuracy"),
            "accuracy_drop": row.get("accuracy_drop"),
            "task": self.task,
            "parity": row.get("parity"),
            "latency_p50_ms": row.get("latency_p50_ms"),
            "fp32_latency_p50_ms": fp32.get("latency_p50_ms"),
            "speedup": row.get("speedup"),
            "latency_threads": self.config.latency.threads,
            "latency_runs": row.get("latency_runs"),
            "slower_than_fp32": bool(row.get("speedup") is not None and row["speedup"] < 1.0),
            "flags": list(self.flags),
        })



_RANDOM_SAMPLES = 8  # random inputs the models are compared on when there is no data


def _is_quantized_op(op: str) -> bool:
    """Whether an operator (`onnx_io.op_counts`' name) is one the quantizer emits: QuantizeLinear /
    DequantizeLinear, QLinear*, *Integer, DynamicQuantize*, com.microsoft's Q* (QAttention, QGemm)."""
    name = op.rsplit(".", 1)[-1]
    return (name.startswith(("Quantize", "Dequantize", "DynamicQuantize", "QLinear")) or name.endswith("Integer")
            or (op.startswith("com.microsoft.") and name.startswith("Q")))


def _accuracy(specs, outputs: Mapping[str, Any], labels) -> float | None:
    """Accuracy of a classifier's outputs (`zoo_stages.lib.quality.tasks`: its label output exactly, else
    the argmax of its scores output); None when no output can be read as a classifier's."""
    metrics = tasks.evaluate("classification", outputs, labels, tasks.scores_output(specs),
                             label_output=tasks.label_output(specs))
    return metrics.get("accuracy")


def _first_int8_hint(config: QuantizeConfig, names: list[str]) -> str:
    """`saturation_hint` of auto's first int8 candidate ('' when it tried weight-only ones only)."""
    first = next((n for n in names if n not in WEIGHT_ONLY_CANDIDATES), None)
    return saturation_hint(resolve(config, first)) if first else ""


def _external_bytes(path: Path) -> int:
    """Bytes of a model's external data files (beside it)."""
    from zoo.pathsafety import external_data_files

    return sum((path.parent / rel).stat().st_size for rel in external_data_files(path))


def _finite(x: float) -> float | None:
    import math

    return float(x) if math.isfinite(x) else None
