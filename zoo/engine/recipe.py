"""The recipe format: pydantic models, loading with positions, and errors that point at the YAML.

A recipe is validated in two steps, so errors can name the exact field:
1. the envelope (top level, recipe-wide sections, each stage's ``kind/needs/config/cache/matrix/resources``);
2. each stage's ``config`` against its kind's static config class (``extra="forbid"``).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zoo.engine import kind_loader
from zoo.errors import InvalidInput, RecipeError, UnknownKind
from zoo.engine.yamlpos import Located, dotted, load_with_positions

SCHEMA_VERSION = 1
# A matrix stage becomes one instance per combination of axis values; past a few hundred it is a
# typo or an attack (4 axes x 60 values is 13 million instances), not a build matrix.
MAX_MATRIX_INSTANCES = 256  # per stage: the product of its axis sizes
MAX_INSTANCES = 4096  # per recipe, all stages together
MAX_STAGE_ID = 100
NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
STAGE_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


IMAGE_SOURCES = ("digits", "folder", "npz")
TABLE_SOURCES = ("csv", "parquet", "jsonl")
# which sources each optional `data:` field applies to (giving it for another source is an error)
_DATA_FIELD_SOURCES: dict[str, tuple[str, ...]] = {
    "image": IMAGE_SOURCES, "image_size": IMAGE_SOURCES, "channels": IMAGE_SOURCES,
    "inputs": ("npz",) + TABLE_SOURCES, "input": TABLE_SOURCES, "columns": TABLE_SOURCES,
    "normalize": TABLE_SOURCES, "label": ("npz",) + TABLE_SOURCES,
    "text": TABLE_SOURCES, "tokenizer": TABLE_SOURCES, "max_length": TABLE_SOURCES,
    "token_type_ids": TABLE_SOURCES,
    "repo": ("dvc",), "rev": ("dvc",), "format": ("dvc",),
}
# data.source: dvc reads a file or folder in one of these formats, named by `format:` or by the path's suffix
DVC_FORMATS = ("folder", "npz", "csv", "parquet", "jsonl")
_DVC_SUFFIXES = {".npz": "npz", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl",
                 ".ndjson": "jsonl", "": "folder"}
_TEXT_ONLY = ("tokenizer", "max_length", "token_type_ids")  # need `text:`
_NUMERIC_ONLY = ("inputs", "input", "columns", "normalize")  # tables of numbers, not with `text:`
_DEFAULT_LABEL = {"npz": "y", "csv": "label", "parquet": "label", "jsonl": "label"}
DEFAULT_MAX_LENGTH = 128


def data_format(source: str | None, fmt: str | None, path: str | None) -> str | None:
    """The format a `data:` section reads: its source, or for ``dvc`` its `format:` or the path's suffix
    (a path without one is a folder); None when that cannot be told."""
    if source != "dvc":
        return source
    if fmt is not None:
        return fmt
    return _DVC_SUFFIXES.get(PurePosixPath(path).suffix.lower()) if path else None


class ImageSpec(_Strict):
    """How image samples become model inputs: resize, channels, scale, mean/std, layout (in that order)."""

    size: list[int] | None = Field(None, min_length=2, max_length=2,
                                   description="[height, width] to resize to (bilinear); default: the images' own "
                                               "size (images of different sizes then need it)")
    channels: int | None = Field(None, ge=1, le=4, description="1 (grey), 3 (RGB) or 4 (RGBA); grey is replicated, "
                                                               "colour becomes luma for 1; default: the images' own")
    scale: float | None = Field(None, gt=0, description="multiply pixel values by this; default by type: uint8 "
                                                        "1/255, uint16 1/65535, digits 1/16, float 1 (must then lie "
                                                        "in [0, 1])")
    mean: list[float] | None = Field(None, min_length=1, description="subtracted per channel after scaling "
                                                                     "(one value, or one per channel)")
    std: list[float] | None = Field(None, min_length=1, description="divided per channel after the mean "
                                                                    "(one value, or one per channel)")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="axis order of the `image` feature")

    @field_validator("size")
    @classmethod
    def _size(cls, v):
        if v is not None and any(d < 1 or d > 8192 for d in v):
            raise ValueError("size is [height, width], each 1..8192")
        return v

    @field_validator("std")
    @classmethod
    def _std(cls, v):
        if v is not None and any(s <= 0 for s in v):
            raise ValueError("std values must be positive")
        return v

    @model_validator(mode="after")
    def _per_channel(self):
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and self.channels is not None and len(values) not in (1, self.channels):
                raise ValueError(f"{name} has {len(values)} values; give 1 or one per channel ({self.channels})")
        return self


class TokenizerTrainSpec(_Strict):
    """A tokenizer trained deterministically on the train split's texts."""

    model: Literal["wordpiece"] = Field("wordpiece", description="wordpiece: BERT-style ([PAD] [UNK] [CLS] [SEP] [MASK])")
    vocab_size: int = Field(2000, ge=16, le=1_000_000)
    lowercase: bool = True
    min_frequency: int = Field(2, ge=1, description="rarer pieces are not learnt")


class TokenizerSpec(_Strict):
    """Where the text tokenizer comes from: a Hugging Face tokenizer.json, or trained from the data."""

    path: str | None = Field(None, description="a Hugging Face `tokenizers` tokenizer.json, relative to the recipe")
    train: TokenizerTrainSpec | None = Field(None, description="train one on the train split's texts instead")

    @model_validator(mode="after")
    def _one(self):
        if (self.path is None) == (self.train is None):
            raise ValueError("give exactly one of tokenizer.path and tokenizer.train")
        return self


class DataSpec(_Strict):
    """The recipe's dataset, shared by train (fit), quantize (calibration) and verify (accuracy).

    One model for every source; a field given for a source it does not apply to is an error
    naming the sources it applies to (checked per field, so the error points at its line).
    """

    source: Literal["digits", "folder", "npz", "csv", "parquet", "jsonl", "dvc"] = Field(
        description="digits: scikit-learn's bundled 8x8 digits; folder: one subfolder per class; npz: named arrays "
                    "(x, y for images); csv / parquet / jsonl: a table of numbers, or of texts with `text:`; dvc: a "
                    "file or folder tracked in a DVC repo (`repo`, `rev`, `path`), in one of those formats")
    path: str | None = Field(None, description="folder or file, relative to the recipe (every source but digits, which "
                                                 "ignores it); dvc: the tracked file or folder, relative to the repo's root")
    repo: str | None = Field(None, description="dvc: the DVC repo, a folder relative to the recipe or a git URL")
    rev: str | None = Field(None, description="dvc: the full commit sha of the DVC repo to read (branches, tags and "
                                              "short shas are refused: they can move)")
    format: Literal["folder", "npz", "csv", "parquet", "jsonl"] | None = Field(
        None, description="dvc: how to read the tracked path (default: by its suffix, .csv .parquet .jsonl .npz; "
                          "a path without one is a folder)")
    text: str | None = Field(None, description="csv / parquet / jsonl: the column of texts to tokenize")
    tokenizer: TokenizerSpec | None = Field(None, description="text: {path: tokenizer.json} or {train: {model, "
                                                              "vocab_size, lowercase}}")
    max_length: int | None = Field(None, ge=2, le=65536, description=f"text: tokens per sample, padded and "
                                                                     f"truncated (default {DEFAULT_MAX_LENGTH})")
    token_type_ids: bool | None = Field(None, description="text: also give the `token_type_ids` feature (zeros)")
    image: ImageSpec | None = Field(None, description="image transforms: {size: [H, W], channels, scale, mean, std, "
                                                      "layout} (digits, folder, npz)")
    image_size: int | None = Field(None, ge=1, le=8192, description="old spelling of image.size: [N, N]")
    channels: int | None = Field(None, ge=1, le=4, description="old spelling of image.channels")
    inputs: dict[str, str | list[str]] | None = Field(
        None, description="npz: {model input: array name}; tables: {model input: [columns...]} (several float "
                          "features); default: npz arrays by their own names (x becomes `image`), tables one feature")
    input: str | None = Field(None, description="tables: name of the one float32 feature (default `features`)")
    columns: list[str] | None = Field(None, min_length=1, description="tables: the feature columns, in order "
                                                                      "(default: every column but the label)")
    label: str | None = Field(None, description="the label array (npz, default `y`) or column (tables, default "
                                                "`label`); null for data without labels. Integer or string labels "
                                                "are classes, float labels regression values")
    normalize: Literal["standard"] | None = Field(None, description="tables: standard = subtract the mean, divide "
                                                                    "by the std, both from the train split")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share, fixed by split_seed")
    split_seed: int = Field(0, description="seed of the train/held-out split (recorded)")
    limit: int | None = Field(None, ge=1, description="use at most this many samples (after shuffling)")

    @field_validator(*_DATA_FIELD_SOURCES)
    @classmethod
    def _applies(cls, v, info):
        source = info.data.get("source")
        allowed = _DATA_FIELD_SOURCES[info.field_name]
        if v is None or source is None or source in allowed:
            return v
        fmt = data_format(source, info.data.get("format"), info.data.get("path"))
        if source == "dvc" and fmt in allowed:
            return v
        reads = f"source {source}" + (f" (format {fmt})" if source == "dvc" and fmt else "")
        raise ValueError(f"`{info.field_name}` does not apply to {reads} (only to {', '.join(allowed)})")

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, v, info):
        source = data_format(info.data.get("source"), info.data.get("format"), info.data.get("path"))
        for name, value in (v or {}).items():
            if source == "npz" and not isinstance(value, str):
                raise ValueError(f"inputs.{name}: for npz, give the array's name (a string)")
            if source in TABLE_SOURCES and (not isinstance(value, list) or not value):
                raise ValueError(f"inputs.{name}: for tables, give a list of columns")
        return v

    @field_validator("image_size", "channels")
    @classmethod
    def _not_both(cls, v, info):
        if v is not None and info.data.get("image") is not None:
            raise ValueError(f"give data.image (size, channels, ...) or the old data.{info.field_name}, not both")
        return v

    @field_validator(*_TEXT_ONLY)
    @classmethod
    def _text_only(cls, v, info):
        if v is not None and "text" in info.data and info.data.get("text") is None:
            raise ValueError(f"data.{info.field_name} applies to text data only (give data.text: COLUMN)")
        return v

    @field_validator(*_NUMERIC_ONLY)
    @classmethod
    def _numeric_only(cls, v, info):
        if v is not None and info.data.get("text") is not None:
            raise ValueError(f"data.{info.field_name} is for tables of numbers; with data.text the features are "
                             "the token ids")
        if v is not None and info.field_name in ("input", "columns") and info.data.get("inputs") is not None:
            raise ValueError(f"give data.inputs (several features) or data.{info.field_name} (one), not both")
        return v

    @model_validator(mode="after")
    def _defaults(self):
        if self.text is not None:
            if self.tokenizer is None:
                raise ValueError("data.text needs data.tokenizer: {path: tokenizer.json} or {train: {vocab_size: ...}}")
            if self.max_length is None:
                self.max_length = DEFAULT_MAX_LENGTH
        if self.source == "dvc":
            fmt = data_format(self.source, self.format, self.path)
            if fmt is None and self.path:
                raise ValueError(f"data.format: cannot tell how to read {self.path!r} from its suffix; give "
                                 f"format: {' | '.join(DVC_FORMATS)}")
            self.format = fmt
        fmt = data_format(self.source, self.format, self.path)
        if "label" not in self.model_fields_set and fmt in _DEFAULT_LABEL:
            self.label = _DEFAULT_LABEL[fmt]
        return self


class InputSpec(_Strict):
    """One model input as the recipe declares it: what export gives torch, and what overrides the
    model's own dynamic dimensions where a stage must invent inputs (no `data:`) or time them."""

    shape: list[int | str] = Field(
        min_length=0, description="dimensions with the batch first: numbers, or names for dynamic ones "
                                  "(e.g. [batch, 128] or [batch, sequence])")
    dtype: Literal["float32", "float16", "float64", "int64", "int32", "int8", "uint8", "bool"] = "float32"

    @field_validator("shape")
    @classmethod
    def _dims(cls, v):
        for d in v:
            if isinstance(d, int) and d < 1:
                raise ValueError(f"dimension {d} must be at least 1 (or a name for a dynamic dimension)")
            if isinstance(d, str) and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", d):
                raise ValueError(f"dimension name {d!r} must be an identifier, like batch or sequence")
        return v


# the fields only some built-in architectures read, and which: anything else is refused, so a
# misplaced field (`hidden` on a bert) is an error at its YAML line instead of silently ignored
ARCH_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden": ("mlp",),
    "dropout": ("mlp", "bert", "alexnet", "mobilenet_v3_small", "efficientnet_b0"),
    "hidden_size": ("bert",),
    "num_layers": ("bert",),
    "num_heads": ("bert",),
    "intermediate_size": ("bert",),
    "max_length": ("bert",),
    "vocab_size": ("bert",),
}
BERT_REQUIRED = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_length")


ZOO_MODEL_RE = r"^zoo:[a-z0-9][a-z0-9._-]*@\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$"
PRETRAINED_FILES = ("config.json", "model.safetensors")  # a transformers folder: config and safetensors weights


class PretrainedSpec(_Strict):
    """A local Hugging Face model folder (``save_pretrained``'s config.json and model.safetensors),
    each file pinned by its sha256; weights are read from safetensors only, no code is run."""

    path: str = Field(description="the folder, relative to the recipe")
    sha256: dict[str, str] = Field(description="{config.json: HEX, model.safetensors: HEX}, each file's full sha256 "
                                               "(`sha256sum FILE`)")

    @field_validator("sha256")
    @classmethod
    def _pins(cls, v):
        if sorted(v) != sorted(PRETRAINED_FILES):
            raise ValueError(f"pin exactly {' and '.join(PRETRAINED_FILES)} (got {', '.join(sorted(v)) or 'none'})")
        bad = [name for name, digest in v.items() if not re.fullmatch(r"[0-9a-f]{64}", str(digest))]
        if bad:
            raise ValueError(f"the sha256 of {', '.join(bad)} must be 64 lowercase hex digits (`sha256sum FILE`)")
        return v


class ModelSpec(_Strict):
    """The model's architecture and I/O names, shared by train, export and verify."""

    # `from` is a Python keyword: the field is `from_`, read and written as `from`
    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)

    from_: str | None = Field(
        None, alias="from",
        description="start from a model in the local zoo, 'zoo:NAME@VERSION' (a pinned version): its ONNX build "
                    "converted back to torch, weights included (fine-tuning, transfer learning); the version's "
                    "lineage then names it")
    build: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9._-]*$",
                              description="with `from`: which build to start from (default: its float32 ONNX build)")
    head: Literal["keep", "new"] | None = Field(
        None, description="with `from`: keep the parent's last layer (default; num_classes must match it), or "
                          "`new`: replace it by a fresh Linear with num_classes outputs (transfer learning)")
    arch: str | None = Field(None, description="built-in architecture: alexnet, lenet5, resnet18, resnet50, "
                                               "mobilenet_v3_small, efficientnet_b0 (images), mlp (tables), "
                                               "bert (token ids)")
    entry: str | None = Field(None, description="custom model: 'path/to/file.py:function' returning a torch.nn.Module; "
                                                "framework jax: the forward function apply(params, *inputs)")
    num_classes: int = Field(10, ge=1, description="output width of a classifier (regression tasks give 1 value)")
    input_name: str | None = Field(None, description="the input's name in a single-input export (default: the arch's: "
                                                     "input for images, features for mlp)")
    output_name: str = "logits"
    task: str | None = Field(None, description="the task the manifest and card name, when it should differ from "
                                               "the recipe's `task:` (default: the recipe's; metrics always follow "
                                               "the recipe's)")
    inputs: dict[str, InputSpec] | None = Field(
        None, description="the model's inputs by name, in order: {name: {shape, dtype}}; overrides the shapes and "
                          "types the model declares (default: what the model or the data says)")
    hidden: list[int] | None = Field(None, min_length=1, description="mlp: hidden layer widths (default [64, 32])")
    dropout: float | None = Field(None, ge=0, lt=1, description="mlp, bert, alexnet: dropout probability while "
                                                                "training (default 0, 0.1, 0.5)")
    hidden_size: int | None = Field(None, ge=1, le=65536, description="bert: width of the encoder")
    num_layers: int | None = Field(None, ge=1, le=128, description="bert: encoder layers")
    num_heads: int | None = Field(None, ge=1, le=1024, description="bert: attention heads (divide hidden_size)")
    intermediate_size: int | None = Field(None, ge=1, le=262144, description="bert: feed-forward width")
    max_length: int | None = Field(None, ge=1, le=65536, description="bert: longest sequence (position embeddings)")
    vocab_size: int | None = Field(None, ge=2, description="bert: token vocabulary (default: the data's tokenizer's)")
    framework: str | None = Field(None, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$",
                                  description="the framework that trains and exports the model, an exporter's name "
                                              "(`zoo exporters`): torch (the default: `arch` or `entry`), sklearn, "
                                              "lightgbm, xgboost, transformers, keras, jax (trained by the train stage's "
                                              "`config.entry`), or a plugin's")
    estimator: str | None = Field(None, description="sklearn/lightgbm/xgboost: the estimator train fits, e.g. "
                                                    "GradientBoostingClassifier, LGBMClassifier, XGBClassifier")
    params: dict[str, Any] | None = Field(None, description="sklearn/lightgbm/xgboost: the estimator's parameters "
                                                            "(random_state defaults to the train stage's seed)")
    architecture: str | None = Field(None, pattern=r"^[A-Za-z][A-Za-z0-9_]*$",
                                     description="transformers: the model class, e.g. "
                                                 "DistilBertForSequenceClassification (default: the pretrained "
                                                 "folder's)")
    config: dict[str, Any] | None = Field(None, description="transformers: the architecture's config settings "
                                                            "(e.g. {dim: 64, n_layers: 2}); over the pretrained "
                                                            "folder's config.json")
    pretrained: PretrainedSpec | None = Field(None, description="transformers: a local save_pretrained folder "
                                                                "(config.json + model.safetensors) pinned by sha256")

    @field_validator("from_")
    @classmethod
    def _zoo_model(cls, v):
        if v is not None and not re.fullmatch(ZOO_MODEL_RE, v):
            raise ValueError(f"{v!r} is not 'zoo:NAME@VERSION' with a pinned version (e.g. zoo:lenet-digits@1.0.0)")
        return v

    @field_validator("hidden")
    @classmethod
    def _widths(cls, v):
        if v is not None and any(w < 1 for w in v):
            raise ValueError("hidden layer widths must be at least 1")
        return v

    @model_validator(mode="after")
    def _fields_fit_the_arch(self):
        if self.from_ is not None and (self.arch or self.entry):
            raise ValueError(f"`from` and `{'arch' if self.arch else 'entry'}` are alternatives: the network comes "
                             "from the zoo model")
        for name in ("build", "head"):
            if getattr(self, name) is not None and self.from_ is None:
                raise ValueError(f"`{name}` applies to a model `from: zoo:NAME@VERSION` only")
        for name, archs in ARCH_FIELDS.items():
            if getattr(self, name) is not None and self.arch not in archs:
                what = f"arch: {self.arch}" if self.arch else "a model without `arch`"
                raise ValueError(f"`{name}` applies to arch {' or '.join(archs)} only, not to {what}")
        if self.arch == "bert":
            missing = [f for f in BERT_REQUIRED if getattr(self, f) is None]
            if missing:
                raise ValueError(f"arch: bert needs {', '.join(missing)} (e.g. hidden_size: 128, num_layers: 2, "
                                 "num_heads: 2, intermediate_size: 512, max_length: 128)")
            if self.hidden_size % self.num_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        return self


TASK_RE = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
TASK_KINDS = ("classification", "regression", "generic")
TASK_DESCRIPTION = (
    "what the model does; it chooses verify's metrics. `classification` and any `*-classification` "
    "(image-, text-, tabular-classification, ...): accuracy, top5_accuracy, macro_f1; `regression` and any "
    "`*-regression` (tabular-regression, ...): mae, rmse, r2; `generic` and every other name "
    "(object-detection, feature-extraction, embedding, ...): no task metrics, parity per output only. "
    "Lowercase words joined by '-'")


def task_kind(task: str) -> str:
    """The metric family of a recipe's `task:`: "classification", "regression" or "generic".

    ``classification``/``regression`` and every ``*-classification``/``*-regression`` name map to
    those; any other well-formed name (``object-detection``, ``feature-extraction``) is generic.
    ValueError for a malformed name or one that looks like a misspelt classification/regression
    (``image-clasification``, ``tabular-regressor``), which would otherwise lose its metrics silently.
    """
    if not isinstance(task, str) or not re.fullmatch(TASK_RE, task):
        raise ValueError(f"task {task!r} must be lowercase words joined by '-', e.g. image-classification")
    words = task.split("-")
    for word in words:
        if word in ("classification", "regression"):
            continue
        close = difflib.get_close_matches(word, ["classification", "regression"], n=1, cutoff=0.8)
        if close or word.startswith(("classif", "regress")):
            meant = close[0] if close else ("classification" if word.startswith("classif") else "regression")
            fixed = "-".join(meant if w == word else w for w in words)
            raise ValueError(f"task {task!r}: did you mean {fixed!r}? (tasks ending in -classification or "
                             "-regression get that task's metrics; any other name is generic)")
    if words[-1] in TASK_KINDS[:2]:
        return words[-1]
    return "generic"


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
RESOURCE_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_.-]*$"


def resource_amount(name: str, amount: Any) -> float:
    """A stage's need of one Dask worker resource as a number: ``1``, ``0.5``, ``"8GB"`` (bytes)."""
    if not re.fullmatch(RESOURCE_NAME_RE, str(name)):
        raise ValueError(f"resource name {_short(repr(name))} must be a word (letters, digits, _ . -)")
    if isinstance(amount, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", amount)
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"resource {name}: {_short(repr(amount))} is not a number or a size "
                             "(units: KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
        amount = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"resource {name}: the amount must be a positive number, not {amount}")
    return int(amount) if float(amount).is_integer() else float(amount)


class StageSpec(_Strict):
    """One entry of `stages:`; `config` is validated later against the kind's config class."""

    kind: str | None = Field(None, description="stage kind; defaults to the stage id when the id names a kind")
    needs: list[str] | None = Field(None, description="stage ids this stage depends on; default: the stage before it")
    config: dict[str, Any] = Field(default_factory=dict)
    cache: Literal["default", "recompute", "disable"] = "default"
    matrix: dict[str, list[str | int | float | bool]] | None = Field(
        None, description="expand into one stage per value, e.g. {build: [cpu-fp32, cpu-int8]}")
    description: str = ""
    resources: dict[str, float | int | str] = Field(
        default_factory=dict,
        description="what a worker must offer to run this stage on a Dask cluster, e.g. {GPU: 1, memory: 8GB} "
                    "(numbers; sizes with KB/MB/GB/TB or KiB/MiB/GiB/TiB become bytes); ignored by local runs, "
                    "not part of the cache key")

    @field_validator("resources", mode="before")
    @classmethod
    def _no_flags(cls, v):
        for name, amount in (v.items() if isinstance(v, dict) else ()):
            if isinstance(amount, bool):  # pydantic would take `true` for 1
                raise ValueError(f"resource {name}: a number or a size such as 8GB, not {str(amount).lower()}")
        return v

    @field_validator("resources")
    @classmethod
    def _resources(cls, v):
        return {str(name): resource_amount(name, amount) for name, amount in v.items()}

    @field_validator("matrix")
    @classmethod
    def _matrix_not_empty(cls, v):
        if v is not None:
            if not v:
                raise ValueError("matrix must have at least one axis")
            for axis, values in v.items():
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", axis):
                    raise ValueError(f"matrix axis {axis!r} must be an identifier")
                if not values:
                    raise ValueError(f"matrix axis {axis!r} has no values")
                if len(set(map(str, values))) != len(values):
                    raise ValueError(f"matrix axis {axis!r} has duplicate values")
        return v


class RecipeSpec(_Strict):
    """The whole recipe file (envelope)."""

    schema_version: Literal[1] = Field(description="recipe format version; this zoo reads 1")
    name: str = Field(pattern=NAME_RE, description="model name in the zoo (lowercase, digits, . _ -)")
    version: str = Field(pattern=r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$", description="semantic version X.Y.Z")
    description: str = ""
    license: str = "unspecified"
    task: str = Field("image-classification", pattern=TASK_RE, description=TASK_DESCRIPTION)
    model: ModelSpec | None = None
    data: DataSpec | None = None
    stages: dict[str, StageSpec] = Field(min_length=1)

    @field_validator("task")
    @classmethod
    def _task(cls, v):
        task_kind(v)  # refuses misspelt classification/regression names
        return v

    @field_validator("stages")
    @classmethod
    def _ids(cls, v):
        for sid in v:
            if not re.fullmatch(STAGE_ID_RE, str(sid)):
                raise ValueError(f"stage id {_short(repr(sid))} may use letters, digits, '-' and '_' only")
            if len(sid) > MAX_STAGE_ID:  # it names folders and log files
                raise ValueError(f"stage id {_short(repr(sid))} is longer than {MAX_STAGE_ID} characters")
        return v


@dataclass
class Recipe:
    """A validated recipe: the envelope, each stage's validated config, and where it came from."""

    spec: RecipeSpec
    path: Path
    digest: str
    instances: dict[str, list["Instance"]]  # stage id -> its instances (one unless it has a matrix)
    kinds: dict[str, str]  # stage id -> kind name
    located: Located

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version

    def shared(self) -> dict[str, Any]:
        """The recipe-wide sections as plain data, for kinds that declare them."""
        return {
            "model": self.spec.model.model_dump(mode="json") if self.spec.model else None,
            "data": self.spec.data.model_dump(mode="json") if self.spec.data else None,
            "task": self.spec.task,
        }


def load(path: str | Path) -> Recipe:
    """Parse and fully validate a recipe, raising RecipeError/UnknownKind that point at the YAML."""
    from zoo.engine.hashing import digest_bytes

    file = Path(path)
    located = load_with_positions(file)
    if not isinstance(located.data, dict):
        raise located.error((), "a recipe must be a YAML mapping with `schema_version`, `name`, `version` and `stages`",
                            hint="see recipes/lenet-digits.yaml for a complete example")
    try:
        spec = RecipeSpec.model_validate(located.data)
    except ValidationError as e:
        raise _pydantic_error(e, located, (), RecipeSpec) from None
    _refuse_non_finite(spec.model_dump(by_alias=True, exclude={"stages"}, exclude_unset=True), located, ())
    _check_data(spec.data, file, located)
    _check_framework(spec.model, located)
    _check_matrix_sizes(spec, located)

    instances: dict[str, list[Instance]] = {}
    kind_names: dict[str, str] = {}
    for sid, stage in spec.stages.items():
        kind_name = stage.kind or sid
        if stage.kind is None and not kind_loader.is_kind(sid):
            close = difflib.get_close_matches(sid, list(kind_loader.available()), n=1)
            hint = (f"add `kind: {close[0]}`" if close else "add `kind: KIND` to the stage") + \
                f" (known kinds: {', '.join(sorted(kind_loader.available()))})"
            raise located.error(("stages", sid), f"stage {sid!r} has no `kind` and its id is not a kind name",
                                key=True, hint=hint)
        try:
            kind = kind_loader.get(kind_name)
        except UnknownKind as e:
            raise located.error(("stages", sid, "kind") if stage.kind else ("stages", sid), e.message,
                                hint=e.hint, key=stage.kind is None) from None
        kind_names[sid] = kind_name
        instances[sid] = []
        for matrix in _expand_matrix(stage.matrix):
            raw = _interpolate(stage.config, matrix, located, ("stages", sid, "config"))
            try:
                config = kind.Config.model_validate(raw)
            except ValidationError as e:
                raise _pydantic_error(e, located, ("stages", sid, "config"), kind.Config) from None
            # strings such as "1e999" or "inf" pass a float field as infinity; a kind's own defaults are not checked
            given = config.model_dump(by_alias=True, exclude_unset=True) if isinstance(config, BaseModel) else config
            _refuse_non_finite(given, located, ("stages", sid, "config"))
            iid = sid if not matrix else f"{sid}[{','.join(str(v) for v in matrix.values())}]"
            instances[sid].append(Instance(id=iid, base_id=sid, kind=kind_name, matrix=matrix, config=config))
    return Recipe(spec=spec, path=file.resolve(), digest=digest_bytes(located.text.encode()),
                  instances=instances, kinds=kind_names, located=located)


@dataclass(frozen=True)
class Instance:
    """One concrete stage after matrix expansion (``quantize[cpu-int8]``), with its validated config."""

    id: str
    base_id: str
    kind: str
    matrix: dict[str, str]
    config: Any


def _check_matrix_sizes(spec: RecipeSpec, located: Located) -> None:
    """Refuse a matrix (or a recipe) with more instances than the limits, before expanding anything."""
    total = 0
    for sid, stage in spec.stages.items():
        sizes = [len(values) for values in (stage.matrix or {}).values()]
        count = math.prod(sizes)
        if count > MAX_MATRIX_INSTANCES:
            raise located.error(("stages", sid, "matrix"),
                                f"the matrix of stage {sid!r} expands to {count:,} instances "
                                f"({' x '.join(map(str, sizes))}); at most {MAX_MATRIX_INSTANCES} are allowed",
                                hint="split the stage into several, or drop axis values", key=True)
        total += count
        if total > MAX_INSTANCES:
            raise located.error(("stages", sid), f"the recipe expands to more than {MAX_INSTANCES:,} stage instances",
                                hint="split the recipe, or use smaller matrices", key=True)


def _check_framework(model: ModelSpec | None, located: Located) -> None:
    """`model.framework` must name a registered exporter, and that exporter must accept the model
    section (its ``check_model``, e.g. an estimator name train can fit)."""
    from zoo.engine import exporter_loader

    if model is None:
        return
    name = model.framework or exporter_loader.DEFAULT_FRAMEWORK
    try:
        exporter = exporter_loader.get(name)
    except InvalidInput as e:
        raise located.error(("model", "framework") if model.framework else ("model",), e.message, hint=e.hint) from None
    try:
        exporter.check_model(model.model_dump(mode="json"))
    except ValueError as e:  # zoo_stages.exporters.base.ModelFieldError: the field's path and a hint
        field = tuple(getattr(e, "field", ()) or ())
        where = ("model", *field) if field and field[0] in model.model_fields_set else ("model",)
        raise located.error(where, str(e), hint=getattr(e, "hint", None)) from None


def _check_data(data: DataSpec | None, file: Path, located: Located) -> None:
    """`data.path` must name an existing file or folder (folder), `data.tokenizer.path` a file, relative
    to the recipe."""
    if data is None:
        return
    if data.source != "digits" and not data.path:
        raise located.error(("data",), f"data.path is required when data.source is {data.source!r}",
                            hint="set `data.path:` to the folder or file, relative to the recipe")
    if data.source == "dvc":
        _check_dvc_data(data, file, located)
    want_dir = data.source == "folder"
    if data.source not in ("digits", "dvc"):  # digits ignores data.path; dvc's is inside the DVC repo
        _check_data_file(data.path, want_dir, ("data", "path"), file, located,
                         f"data.source: {data.source} needs a {'folder' if want_dir else 'file'} at this path, "
                         "relative to the recipe (" + _SOURCE_FILES[data.source] + ")")
    if data.tokenizer is not None and data.tokenizer.path:
        _check_data_file(data.tokenizer.path, False, ("data", "tokenizer", "path"), file, located,
                         "a Hugging Face tokenizer.json, relative to the recipe")


def _check_dvc_data(data: DataSpec, file: Path, located: Located) -> None:
    """`data.repo` must be a git+DVC repo holding the full commit `data.rev`, at which DVC tracks
    `data.path` (a folder for format: folder, a file otherwise). Read with git alone (`zoo.dvcrepo`)."""
    from zoo import dvcrepo
    from zoo.paths import cache_dir

    for name in ("repo", "rev"):
        if not getattr(data, name):
            raise located.error(("data",), f"data.{name} is required when data.source is 'dvc'",
                                hint="data: {source: dvc, repo: FOLDER-OR-GIT-URL, rev: FULL-COMMIT-SHA, path: IN/REPO}")
    try:
        repo = dvcrepo.repo_location(data.repo, file.resolve().parent)
    except RuntimeError:  # "~someone" with no such user
        raise located.error(("data", "repo"), f"data.repo {data.repo!r} is not a folder") from None
    try:
        out = dvcrepo.out_at(repo, data.rev, data.path, cache_dir())
    except InvalidInput as e:  # its message starts with the field it is about
        field = e.message.split(" ", 1)[0].rstrip(":").split(".")
        raise located.error(tuple(field) if field[0] == "data" else ("data",), e.message, hint=e.hint) from None
    if out.is_dir != (data.format == "folder"):
        what = "a folder" if out.is_dir else "a file"
        raise located.error(("data", "path"),
                            f"data.path {data.path!r} is {what} in the DVC repo, but data.format is {data.format}",
                            hint="format: folder reads a folder (one subfolder per class); the others a file")


_SOURCE_FILES = {"folder": "one subfolder per class", "npz": "a .npz file with one array per input and the labels",
                 "csv": "a CSV file with a header row", "parquet": "a Parquet file",
                 "jsonl": "a file of JSON objects, one per line"}


def _check_data_file(given: str, want_dir: bool, where: tuple, file: Path, located: Located, hint: str) -> None:
    p = Path(given)
    try:
        p = p.expanduser()
    except RuntimeError:  # "~someone" with no such user: checked as written, so it is reported missing
        pass
    if not p.is_absolute():
        p = file.resolve().parent / p
    if want_dir and p.is_dir() or not want_dir and p.is_file():
        return
    what = "folder" if want_dir else "file"
    state = f"is not a {what}" if p.exists() else "does not exist"
    raise located.error(where, f"{dotted(where)} {given!r} {state} ({p})", hint=hint)


def _refuse_non_finite(value: Any, located: Located, path: tuple) -> None:
    """A RecipeError at the first infinite or NaN float in `value` (validated data, walked iteratively)."""
    todo = [(value, path)]
    while todo:
        current, where = todo.pop()
        if isinstance(current, float) and not math.isfinite(current):
            raise located.error(where, f"{dotted(where)}: the value reads as {current}, not a finite number",
                                hint="numbers must be finite (\"1e999\" and \"inf\" read as infinity)")
        if isinstance(current, dict):
            todo.extend((v, where + (k,)) for k, v in current.items())
        elif isinstance(current, (list, tuple)):
            todo.extend((v, where + (i,)) for i, v in enumerate(current))


def _expand_matrix(matrix: dict[str, list] | None) -> list[dict[str, str]]:
    """The cartesian product of the matrix axes, in declaration order ([{}] without a matrix)."""
    combos: list[dict[str, str]] = [{}]
    for axis, values in (matrix or {}).items():
        combos = [{**c, axis: str(v)} for c in combos for v in values]
    return combos


_VAR = re.compile(r"\$\{matrix\.([A-Za-z_][A-Za-z0-9_]*)\}")


def _interpolate(value: Any, matrix: dict[str, str], located: Located, path: tuple) -> Any:
    """Replace ``${matrix.AXIS}`` in config strings with this instance's value."""
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(1) not in matrix:
                raise located.error(path, f"{m.group(0)} names no matrix axis of this stage",
                                    hint=f"axes: {', '.join(matrix) or 'none (add `matrix:`)'}")
            return matrix[m.group(1)]
        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, matrix, located, path + (k,)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, matrix, located, path + (i,)) for i, v in enumerate(value)]
    return value


def _pydantic_error(err: ValidationError, located: Located, prefix: tuple, model: type[BaseModel]) -> RecipeError:
    """The first validation error, placed at its YAML position, with a suggestion."""
    # a misspelt key also makes a required one "missing": report the misspelling, it is the cause
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    path = prefix + loc
    where = dotted(path)
    kind = first["type"]
    if kind == "extra_forbidden":
        field_name = _short(str(loc[-1]))
        allowed = _allowed_fields(model, loc[:-1])
        close = difflib.get_close_matches(field_name, allowed, n=1)
        parent = dotted(path[:-1]) if path[:-1] else "the top level"
        msg = f"unknown key {field_name!r} in {parent}"
        if close:
            msg += f" — did you mean {close[0]!r}?"
        hint = f"allowed keys: {', '.join(allowed)}" if allowed else None
        return located.error(path, msg, key=True, hint=hint)
    if kind == "missing":
        return located.error(path[:-1], f"missing required key {loc[-1]!r} in {dotted(path[:-1]) if path[:-1] else 'the top level'}",
                             hint=f"add `{loc[-1]}:`")
    value = first.get("input")
    shown = f" (got {_short(repr(value))})" if not isinstance(value, (dict, list)) else ""
    return located.error(path, f"{where}: {first['msg']}{shown}", hint=_type_hint(first))


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _type_hint(error: dict) -> str | None:
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        return f"expected {ctx['expected']}"
    if "pattern" in ctx:
        return f"the value must match {ctx['pattern']}"
    return None


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model at `loc`, for 'did you mean' suggestions."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = {f.alias or n: f for n, f in getattr(current, "model_fields", {}).items()}
        field = fields.get(part)
        if field is None:
            # inside a dict[str, Model]: the key is a stage id, the model is the value type
            current = _model_in(current) if not hasattr(current, "model_fields") else None
            if current is None:
                return []
            continue
        current = _model_in(field.annotation)
    if current is not None and hasattr(current, "model_fields"):
        return [f.alias or n for n, f in current.model_fields.items()]
    return []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as `dict[str, StageSpec]` or `X | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def json_schema() -> dict[str, Any]:
    """JSON Schema for recipes (for yaml-language-server), with each kind's config schema."""
    schema = RecipeSpec.model_json_schema()
    defs = schema.setdefault("$defs", {})
    alternatives = []
    for name in sorted(kind_loader.available()):
        try:
            cls = kind_loader.get(name)
        except UnknownKind:
            continue
        sub = cls.Config.model_json_schema(ref_template="#/$defs/{model}")
        for k, v in sub.pop("$defs", {}).items():
            defs[k] = v
        title = f"{name}Config"
        defs[title] = sub
        alternatives.append({
            "if": {"anyOf": [{"properties": {"kind": {"const": name}}, "required": ["kind"]}]},
            "then": {"properties": {"config": {"$ref": f"#/$defs/{title}"}}},
        })
    stage = defs["StageSpec"]
    stage["allOf"] = alternatives
    schema["$id"] = "https://zoo.dev/schema/recipe-v1.json"
    schema["title"] = "zoo recipe"
    return schema
