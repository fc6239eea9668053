"""The recipe's `model:` section: the architecture and I/O names train, export and verify share.

`ModelSpec` is the section's schema (a field only some architectures read is refused for the
others, at its YAML line); `ModelSection.check` asks the exporter `model.framework` names
(`zoo.engine.exporter_loader`) whether it accepts the section, e.g. an estimator train can fit;
`ModelSection.references` names the parent model of `model.from` (with its `model.build`), which the
engine resolves and pins for train and export (zoo/engine/parents.py, `context.references`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from zoo.section import RecipeSection, SectionError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
# a causal LM's tokenizer files, which its generative build ships (pinned like the weights when given)
PRETRAINED_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                              "chat_template.jinja")


class PretrainedSpec(_Strict):
    """A local Hugging Face model folder (``save_pretrained``'s config.json and model.safetensors),
    each file pinned by its sha256; weights are read from safetensors only, no code is run."""

    path: str = Field(description="the folder, relative to the recipe")
    sha256: dict[str, str] = Field(description="{config.json: HEX, model.safetensors: HEX}, each file's full sha256 "
                                               "(`sha256sum FILE`); a causal LM's tokenizer files (tokenizer.json, "
                                               "tokenizer_config.json, special_tokens_map.json, chat_template.jinja) "
                                               "may be pinned too: its generative build ships them")

    @field_validator("sha256")
    @classmethod
    def _pins(cls, v):
        if not set(PRETRAINED_FILES) <= set(v) or not set(v) <= {*PRETRAINED_FILES, *PRETRAINED_TOKENIZER_FILES}:
            raise ValueError(f"pin exactly {' and '.join(PRETRAINED_FILES)}, and optionally the tokenizer's "
                             f"{', '.join(PRETRAINED_TOKENIZER_FILES)} (got {', '.join(sorted(v)) or 'none'})")
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



class ModelSection(RecipeSection):
    """`model:`, absent unless the recipe gives it."""

    schema = ModelSpec

    @classmethod
    def check(cls, value: ModelSpec, recipe_dir: Path) -> None:
        """`model.framework` must name a registered exporter, and that exporter must accept the model
        section (its ``check_model``, e.g. an estimator name train can fit)."""
        from zoo.engine import exporter_loader
        from zoo.errors import InvalidInput

        name = value.framework or exporter_loader.DEFAULT_FRAMEWORK
        try:
            exporter = exporter_loader.get(name)
        except InvalidInput as e:
            raise SectionError(e.message, ("framework",) if value.framework else (), hint=e.hint) from None
        try:
            exporter.check_model(value.model_dump(mode="json"))
        except ValueError as e:  # zoo_stages.exporters.base.ModelFieldError: the field's path and a hint
            field = tuple(getattr(e, "field", ()) or ())
            raise SectionError(str(e), field if field and field[0] in value.model_fields_set else (),
                               hint=getattr(e, "hint", None)) from None

    @classmethod
    def references(cls, value: Mapping[str, Any]) -> dict[str, str]:
        """`from` names the parent model; `build` one of its builds (without it, the version's float32
        ONNX build): ``zoo:NAME@VERSION#BUILD``. Only where the kind declares the fields."""
        parent, build = value.get("from"), value.get("build")
        if not parent:
            return {}
        return {"from": f"{parent}#{build}" if build else str(parent)}
