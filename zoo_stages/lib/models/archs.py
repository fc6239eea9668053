"""Model architectures in plain torch.nn (and Hugging Face models), and the loader for user models.

The recipe's ``model:`` section names either a built-in ``arch`` or a user ``entry``:

- ``arch: alexnet``: exactly torchvision's AlexNet layout (``features`` / ``avgpool`` /
  ``classifier``, same layer indices), so torchvision state dicts (``features.0.weight``,
  ``classifier.1.weight``...) load directly. Inputs must be at least 63x63 (three stride-2
  max pools after a stride-4 convolution); 64x64 gives a 1x1 feature map that the adaptive
  pool spreads to 6x6, 224x224 gives 6x6 as in the paper.
- ``arch: lenet5``: LeNet-5 (conv 6@5x5, pool, conv 16@5x5, pool, 120, 84, classes) with
  "same" padding on both convolutions and an adaptive average pool to 5x5 before the
  classifier, so it accepts any input of at least 4x4, square or not (8x8 digits, 28x28
  MNIST, 8x6...).
- ``arch: mlp``: a multi-layer perceptron for tabular float features: ``hidden`` widths
  (default [64, 32]) with ReLU and ``dropout`` (default 0) between them; ``in_features`` is
  the data's feature width. Output: ``num_classes`` logits, or 1 value for a regression task.
- ``arch: bert``: Hugging Face ``transformers``' ``BertForSequenceClassification`` built from a
  ``BertConfig`` of the section's ``hidden_size, num_layers, num_heads, intermediate_size,
  max_length`` (position embeddings) and ``vocab_size`` (default: the data's tokenizer's);
  ``forward(input_ids, attention_mask)`` returns the logits tensor, and the state-dict keys are
  Hugging Face's own (``bert.embeddings...``, ``classifier.weight``), so fine-tuned Hugging Face
  checkpoints load key for key. Attention is transformers' ``eager`` implementation: its
  exported graph is one onnxruntime's transformer optimizer fuses into Attention nodes
  (the default ``sdpa`` one exports to a graph it does not). Needs the text extra.
- ``arch: resnet18``, ``resnet50``, ``mobilenet_v3_small``, ``efficientnet_b0``: torchvision's
  ImageNet classifiers in plain torch.nn (`zoo_stages.lib.models.vision_archs`), state-dict compatible
  with torchvision's, so its published weights load key for key (``weights: torchvision:resnet18``
  in the export config names them through `zoo/catalogs/torchvision.json`). ``dropout``
  sets the classifier's dropout of mobilenet_v3_small and efficientnet_b0 (default 0.2).
- ``framework: transformers`` with ``architecture`` (any ``*For*`` class of Hugging Face
  ``transformers``) and ``config``, or a pinned ``pretrained`` folder: `zoo_stages.lib.models.hf_models`
  (the bert arch's way, generalised: Hugging Face's state-dict keys, positional token inputs).
- ``entry: path/to/file.py:function``: the file (relative to the recipe) is imported and
  ``function(num_classes=<model.num_classes>, in_channels=<image channels>)`` is called; it
  must return a ``torch.nn.Module`` that maps float32 images in [0, 1] (NCHW, or NHWC when the
  data's layout says so) to logits of shape (N, num_classes). The file's content enters the
  cache key of every stage using it.
- ``from: zoo:NAME@VERSION`` (with ``build`` and ``head``): a model of the local zoo converted
  back to torch, its weights included, its last layer kept or replaced (`zoo_stages.lib.models.finetune`);
  it reads images like the built-in image architectures.

Each architecture declares its inputs (`model_inputs`): the names the exported graph takes
(``model.inputs`` in the recipe renames and retypes them, in order) and what they hold, so train
feeds the data's features by name and export invents example inputs of the right kind.

Fresh built-in models use He-normal initialisation (torchvision uses torch's defaults): the
layout and state-dict keys are unchanged, but training from scratch starts learning at once.

torch (and transformers) are imported only when a model is built: the classes are created on
first use, so importing this module (to list dependencies for a cache key) stays cheap.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Literal, Mapping

from zoo.errors import InvalidInput
from zoo_stages.lib.models.vision_archs import VISION_ARCHS

ARCHS = ("alexnet", "lenet5", "mlp", "bert", *VISION_ARCHS)
IMAGE_ARCHS = ("alexnet", "lenet5", *VISION_ARCHS)
MLP_HIDDEN = (64, 32)
TEXT_EXTRA = "pip install 'zoo-onnx[text]'"
# the model: fields that shape the network (train and export build the same one from them)
BUILD_FIELDS = ("from", "build", "head", "arch", "entry", "num_classes", "hidden", "dropout", "hidden_size", "num_layers", "num_heads",
                "intermediate_size", "max_length", "vocab_size", "architecture", "config", "pretrained")


@dataclass(frozen=True)
class ModelInput:
    """One input of an architecture: its name in the exported graph, what it holds, its type.

    `holds`: ``image`` (float images), ``table`` (float feature rows), ``token_ids`` (int64 ids
    below the vocabulary size), ``mask`` (int64 attention mask, 1 = attend), ``segments`` (int64
    token type ids, 0 for a single text), or ``any`` (an entry
    model's declared input: floats in [0, 1), integers 0 or 1, booleans True).
    """

    name: str
    holds: Literal["image", "table", "token_ids", "mask", "segments", "any"]
    dtype: str = "float32"


def modality(model_section: Mapping[str, Any]) -> Literal["image", "table", "text"]:
    """What the architecture reads: images (alexnet, lenet5, torchvision's, entry models), tables (mlp), text
    (bert, transformers models)."""
    arch = model_section.get("arch")
    if model_section.get("framework") == "transformers":
        return "text"
    return "text" if arch == "bert" else "table" if arch == "mlp" else "image"


def model_inputs(model_section: Mapping[str, Any], data: Mapping[str, Any] | None = None) -> list[ModelInput]:
    """The model's inputs in forward() order: the architecture's own, renamed and retyped in
    order by the recipe's ``model.inputs`` when it declares them (``model.input_name`` renames a
    single input). A transformers model takes those of input_ids, attention_mask and
    token_type_ids its class takes (token_type_ids only when the `data` makes them:
    `zoo_stages.lib.models.hf_models.model_inputs`)."""
    kind = modality(model_section)
    if model_section.get("framework") == "transformers":
        from zoo_stages.lib.models import hf_models

        own = [ModelInput(name, holds, "int64") for name, holds in hf_models.model_inputs(model_section, data)]
    elif kind == "text":
        own = [ModelInput("input_ids", "token_ids", "int64"), ModelInput("attention_mask", "mask", "int64")]
    else:
        default = "features" if kind == "table" else "input"
        own = [ModelInput(model_section.get("input_name") or default, kind)]
    declared = model_section.get("inputs") or {}
    if not declared:
        return own
    if len(declared) != len(own):
        if model_section.get("entry"):  # a user model may take anything: trust the declaration
            return [ModelInput(name, "any", spec.get("dtype") or "float32") for name, spec in declared.items()]
        raise InvalidInput(f"model.inputs declares {len(declared)} input(s) but arch {model_section.get('arch')} "
                           f"takes {len(own)} ({', '.join(i.name for i in own)})",
                           hint="declare one entry per model input, in forward() order")
    out = [ModelInput(name, mine.holds, spec.get("dtype") or mine.dtype)
           for (name, spec), mine in zip(declared.items(), own)]
    for inp in out:
        if inp.holds in ("token_ids", "mask", "segments") and not inp.dtype.startswith("int"):
            raise InvalidInput(f"model.inputs.{inp.name} is {inp.dtype}, but arch {model_section.get('arch')} takes "
                               "integer token ids and masks there", hint=f"set `model.inputs.{inp.name}.dtype: int64`")
    return out


def default_exporter(model_section: Mapping[str, Any]) -> Literal["dynamo", "torchscript"]:
    """The torch ONNX exporter export uses when its config names none: dynamo (torch's default),
    except TorchScript for bert. Why bert: onnxruntime's transformer optimizer (optimize's
    ``transformer:``) fuses the TorchScript graph's attention into Attention nodes, but not the
    dynamo graph's (transformers' mask arrives through GatherND/And/Max, which its fusion does not
    match: 0 of 2 layers fused with torch 2.13, transformers 5.23, onnxruntime 1.32)."""
    return "torchscript" if model_section.get("arch") == "bert" else "dynamo"


def image_settings(data: Mapping[str, Any] | None, recipe_dir: Path | None = None
                   ) -> tuple[int, tuple[int, int], Literal["NCHW", "NHWC"]]:
    """(channels, (height, width), layout) of the data's images: ``data.image: {size, channels,
    layout}`` where given, else the older ``data.channels`` and square ``data.image_size``.

    What the recipe leaves out (the data then keeps the images' own size and channels) is read
    from the data's image feature when `recipe_dir` is given, so the network is built for the
    arrays it will be fed; without it, 8x8 and 1 channel.
    """
    data = data or {}
    image = data.get("image") or {}
    layout = "NHWC" if str(image.get("layout") or "NCHW").upper() == "NHWC" else "NCHW"
    channels = image.get("channels") or data.get("channels")
    size = image.get("size") if image.get("size") is not None else data.get("image_size")
    if (channels is None or size is None) and data and recipe_dir is not None:
        from zoo_stages.lib.data import datasets

        specs = list(datasets.feature_specs(dict(data), Path(recipe_dir)).values())
        if len(specs) == 1 and len(specs[0]["shape"]) == 3:
            shape = specs[0]["shape"]
            c, h, w = (shape[2], shape[0], shape[1]) if layout == "NHWC" else shape
            channels = channels or c
            size = size if size is not None else [h, w]
    if size is None:
        size = 8
    h, w = (size, size) if isinstance(size, int) else (int(s) for s in size)
    return int(channels or 1), (int(h), int(w)), layout


def data_sizes(model_section: Mapping[str, Any], data: Mapping[str, Any] | None, recipe_dir: Path, *,
               regression: bool = False, width: int | None = None) -> dict[str, Any]:
    """The `build_model` keywords the data decides, so train and export build the same network:
    image channels and layout (`image_settings`), the table's `width` (read by the caller from
    the data or an input shape), the vocabulary size (``model.vocab_size``, else the data's
    tokenizer's), and 1 output for a regression task."""
    kind = modality(model_section)
    sizes: dict[str, Any] = {"outputs": 1 if regression else None}
    if kind == "image":
        channels, _, layout = image_settings(data, recipe_dir)
        sizes.update(in_channels=channels, layout=layout)
    elif kind == "table":
        sizes["in_features"] = width
    elif model_section.get("framework") == "transformers":
        from zoo_stages.lib.data import datasets

        if datasets.has_tokenizer(data):  # the model's config or pretrained folder may set its own
            sizes["vocab_size"] = int(datasets.vocab_size(dict(data), Path(recipe_dir)))
        if data and data.get("source") == "text":  # a language model stops at the corpus's end-of-text token
            from zoo_stages.lib.data import corpus

            _, eot = corpus.end_of_text(datasets.tokenizer_json(dict(data), Path(recipe_dir)))
            sizes["token_ids"] = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot}
    elif not model_section.get("vocab_size"):
        if not data:
            raise InvalidInput("arch: bert needs a vocabulary size and the recipe has no `data:` to take it from",
                               hint="set `model.vocab_size`")
        from zoo_stages.lib.data import datasets

        sizes["vocab_size"] = int(datasets.vocab_size(dict(data), Path(recipe_dir)))
    return sizes


def build_model(model_section: dict, recipe_dir: Path, *, in_channels: int = 3, layout: str = "NCHW",
                in_features: int | None = None, vocab_size: int | None = None, outputs: int | None = None,
                pretrained_weights: bool = True, parent: Any = None, token_ids: Mapping[str, int] | None = None) -> Any:
    """The torch.nn.Module described by the recipe's ``model:`` section (random weights, except a
    transformers model's pretrained folder when `pretrained_weights`).

    What the data says goes in the keywords: `in_channels` and `layout` of images (the data's
    image settings, or the export's input shape), `in_features` for mlp (the table's width),
    `vocab_size` for bert (and a transformers config) when the section has none (the
    tokenizer's), `token_ids` a transformers language model's bos/eos/pad ids (the corpus's
    end-of-text token); `outputs` is the output width (default ``model.num_classes``; 1 for a regression task).
    `parent`: the zoo model ``model.from`` names, as the engine resolved it for the stage
    (`finetune.parent(context.references)`, a `zoo.stage.PinnedModel`).
    """
    if not isinstance(model_section, dict) or not model_section:
        raise InvalidInput("this stage needs the recipe's `model:` section",
                           hint="add e.g. `model: {arch: lenet5, num_classes: 10}` to the recipe")
    arch, entry = model_section.get("arch"), model_section.get("entry")
    width = int(outputs or model_section.get("num_classes") or 10)
    if model_section.get("framework") == "transformers":
        from zoo_stages.lib.models import hf_models

        return hf_models.build(model_section, Path(recipe_dir), num_labels=width, vocab_size=vocab_size,
                               pretrained_weights=pretrained_weights, token_ids=token_ids)
    channels_last = str(layout).upper() == "NHWC"
    if arch and entry:
        raise InvalidInput("model.arch and model.entry are both set", hint="keep only one of them")
    if model_section.get("from"):
        from zoo_stages.lib.models import finetune

        return finetune.build_model(model_section, parent, outputs=width)
    if entry:
        fn = load_function(entry, Path(recipe_dir), field="model.entry")
        model = fn(num_classes=width, in_channels=in_channels)
        import torch

        if not isinstance(model, torch.nn.Module):
            raise InvalidInput(f"model.entry {entry!r} returned {type(model).__name__}, not a torch.nn.Module",
                               hint="the function must return the model, e.g. `return MyNet(num_classes)`")
        return model
    if not arch:
        raise InvalidInput("the model: section has neither `arch` nor `entry` nor `from`",
                           hint=f"set `model.arch` to one of {', '.join(ARCHS)}, or `model.entry: file.py:function`, "
                                "or `model.from: zoo:NAME@VERSION`")
    dropout = model_section.get("dropout")
    if arch == "alexnet":
        return alexnet(num_classes=width, in_channels=in_channels, dropout=0.5 if dropout is None else dropout,
                       channels_last=channels_last)
    if arch == "lenet5":
        return lenet5(num_classes=width, in_channels=in_channels, channels_last=channels_last)
    if arch in VISION_ARCHS:
        from zoo_stages.lib.models import vision_archs

        return vision_archs.build(arch, num_classes=width, in_channels=in_channels, dropout=dropout,
                                  channels_last=channels_last)
    if arch == "mlp":
        if not in_features:
            raise InvalidInput("arch: mlp needs the width of the data's features",
                               hint="give the table in `data:`, or `input_shape: [WIDTH]` in the export config")
        return mlp(in_features, tuple(model_section.get("hidden") or MLP_HIDDEN), width, dropout or 0.0)
    if arch == "bert":
        vocab = model_section.get("vocab_size") or vocab_size
        if not vocab:
            raise InvalidInput("arch: bert needs a vocabulary size", hint="set `model.vocab_size`, or give text data "
                                                                          "with a tokenizer in `data:`")
        return bert(model_section, num_labels=width, vocab_size=int(vocab))
    close = difflib.get_close_matches(str(arch), ARCHS, n=1)
    raise InvalidInput(f"unknown model.arch {arch!r}" + (f" — did you mean {close[0]!r}?" if close else ""),
                       hint=f"built-in architectures: {', '.join(ARCHS)}; or use `model.entry: file.py:function`")


def alexnet(num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5, channels_last: bool = False) -> Any:
    """AlexNet with torchvision's exact module layout and state-dict keys (NHWC input when `channels_last`)."""
    return _classes().AlexNet(num_classes=num_classes, in_channels=in_channels, dropout=dropout,
                              channels_last=channels_last)


def lenet5(num_classes: int = 10, in_channels: int = 1, channels_last: bool = False) -> Any:
    """LeNet-5 with same-padded convolutions and an adaptive 5x5 pool (any input >= 4x4, square or not)."""
    return _classes().LeNet5(num_classes=num_classes, in_channels=in_channels, channels_last=channels_last)


def mlp(in_features: int, hidden: tuple[int, ...] = MLP_HIDDEN, outputs: int = 2, dropout: float = 0.0) -> Any:
    """Linear layers of widths `hidden` with ReLU (and dropout) between them, then `outputs` values."""
    return _classes().MLP(in_features=in_features, hidden=tuple(hidden), outputs=outputs, dropout=dropout)


def bert(model_section: Mapping[str, Any], num_labels: int, vocab_size: int) -> Any:
    """BertForSequenceClassification from the section's sizes, called as model(input_ids, attention_mask) -> logits."""
    transformers = _transformers()
    dropout = model_section.get("dropout")
    dropout = 0.1 if dropout is None else float(dropout)  # BertConfig's own default
    config = transformers.BertConfig(
        vocab_size=int(vocab_size), hidden_size=int(model_section["hidden_size"]),
        num_hidden_layers=int(model_section["num_layers"]), num_attention_heads=int(model_section["num_heads"]),
        intermediate_size=int(model_section["intermediate_size"]),
        max_position_embeddings=int(model_section["max_length"]), num_labels=int(num_labels),
        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
        # eager attention exports to MatMul/Softmax chains onnxruntime fuses into Attention; sdpa does not
        attn_implementation="eager")
    return _bert_class()(config)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise InvalidInput("arch: bert needs the transformers package, which is not installed",
                           hint=TEXT_EXTRA) from None
    return transformers


@lru_cache(maxsize=1)
def _bert_class() -> type:
    """BertForSequenceClassification whose forward takes (input_ids, attention_mask) and returns
    the logits tensor: what train calls and export traces (the subclass keeps Hugging Face's
    state-dict keys)."""
    transformers = _transformers()

    class BertClassifier(transformers.BertForSequenceClassification):
        def forward(self, input_ids, attention_mask):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).logits

    BertClassifier.__module__ = __name__
    return BertClassifier


def parse_entry(entry: str, field: str) -> tuple[str, str]:
    """Split ``path/to/file.py:function`` into its file and function name."""
    file, sep, func = str(entry).rpartition(":")
    if not sep or not file or not func.isidentifier() or not file.endswith(".py"):
        raise InvalidInput(f"{field} {entry!r} must look like 'path/to/file.py:function'",
                           hint="name a Python file (relative to the recipe) and a function in it")
    return file, func


def entry_file(entry: str, recipe_dir: Path, field: str) -> Path:
    """The Python file an entry names, resolved against the recipe folder; it must exist."""
    file, _ = parse_entry(entry, field)
    p = Path(file).expanduser()
    p = (p if p.is_absolute() else Path(recipe_dir) / p).resolve()
    if not p.is_file():
        raise InvalidInput(f"{field} {entry!r}: file {p} does not exist",
                           hint="paths are relative to the recipe's folder")
    return p


def load_function(entry: str, recipe_dir: Path, field: str) -> Callable[..., Any]:
    """Import the file an entry names (fresh each call) and return the named function."""
    path = entry_file(entry, recipe_dir, field)
    _, func = parse_entry(entry, field)
    # a name unique per file, so two recipes' `model.py` never collide in sys.modules
    name = "zoo_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InvalidInput(f"{field} {entry!r}: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise InvalidInput(f"{field} {entry!r}: importing {path.name} failed: {type(e).__name__}: {e}",
                           hint="fix the error in that file") from e
    fn = getattr(module, func, None)
    if not callable(fn):
        raise InvalidInput(f"{field} {entry!r}: {path.name} has no function {func!r}",
                           hint=f"functions in it: {', '.join(n for n, v in vars(module).items() if callable(v) and not n.startswith('_')) or 'none'}")
    return fn


def __getattr__(name: str) -> Any:
    # `archs.AlexNet` etc. work like ordinary module attributes, created on first access
    if name in ("AlexNet", "LeNet5", "MLP", "AdaptiveAvgPool2d"):
        return getattr(_classes(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@lru_cache(maxsize=1)
def _classes() -> SimpleNamespace:
    """Define the torch classes (once), importing torch only now."""
    import torch
    from torch import nn

    class AdaptiveAvgPool2d(nn.AdaptiveAvgPool2d):
        """nn.AdaptiveAvgPool2d that every ONNX exporter accepts, for any input size.

        The TorchScript exporter only handles output sizes that divide the input size, but
        AlexNet at 64x64 pools 1x1 to 6x6. So, from the static spatial sizes: average pooling
        when the output divides the input, otherwise two products with constant
        bin-averaging matrices, which is the definition of adaptive average pooling (and
        exact when it merely repeats values, e.g. 1x1 -> 6x6: every weight is 1.0).
        """

        def forward(self, x):
            out_h, out_w = _pair(self.output_size, x.shape[-2:])
            # spatial sizes are static in every export (only the batch axis is dynamic)
            h, w = int(x.shape[-2]), int(x.shape[-1])
            if h % out_h == 0 and w % out_w == 0:
                return nn.functional.adaptive_avg_pool2d(x, (out_h, out_w))
            rows = torch.tensor(_bins(h, out_h), dtype=x.dtype, device=x.device)
            cols = torch.tensor(_bins(w, out_w), dtype=x.dtype, device=x.device).t()
            return torch.matmul(torch.matmul(rows, x), cols)

    def _pair(size, actual):
        if isinstance(size, int):
            return size, size
        return tuple(int(a) if s is None else int(s) for s, a in zip(size, actual))

    def _bins(n_in: int, n_out: int) -> list[list[float]]:
        """(n_out, n_in) matrix averaging input bin [floor(i*n_in/n_out), ceil((i+1)*n_in/n_out))."""
        m = []
        for i in range(n_out):
            start, end = (i * n_in) // n_out, -((-(i + 1) * n_in) // n_out)
            m.append([1.0 / (end - start) if start <= j < end else 0.0 for j in range(n_in)])
        return m

    def he_init(model: nn.Module, last: nn.Linear) -> None:
        """He-normal weights (fan_in, ReLU), zero biases, N(0, 0.01) for the last layer.

        torchvision keeps torch's default init, under which AlexNet on small inputs sits at
        chance level for about an epoch; He init keeps activations at scale through the
        layers, so training starts at once (digits at 64x64: 71% held-out after one epoch
        instead of 21-46%). Only fresh models are affected: loaded weights replace these.
        """
        if last.weight.is_meta:
            # built on the meta device for loaded weights (export): nothing to initialise, and
            # normal_ on meta tensors would import torch._dynamo (1.3 s)
            return
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(m.bias)
        nn.init.normal_(last.weight, 0.0, 0.01)

    class AlexNet(nn.Module):
        """torchvision.models.AlexNet, layer for layer (state dicts are interchangeable); He init."""

        def __init__(self, num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5,
                     channels_last: bool = False):
            super().__init__()
            self.channels_last = channels_last  # NHWC input: permuted to NCHW first (not in the state dict)
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, 64, kernel_size=11, stride=4, padding=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2),
                nn.Conv2d(64, 192, kernel_size=5, padding=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2),
                nn.Conv2d(192, 384, kernel_size=3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(384, 256, kernel_size=3, padding=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(256, 256, kernel_size=3, padding=1),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2),
            )
            self.avgpool = AdaptiveAvgPool2d((6, 6))
            self.classifier = nn.Sequential(
                nn.Dropout(p=dropout),
                nn.Linear(256 * 6 * 6, 4096),
                nn.ReLU(inplace=True),
                nn.Dropout(p=dropout),
                nn.Linear(4096, 4096),
                nn.ReLU(inplace=True),
                nn.Linear(4096, num_classes),
            )
            he_init(self, self.classifier[6])

        def forward(self, x):
            if self.channels_last:
                x = x.permute(0, 3, 1, 2)
            x = self.features(x)
            x = self.avgpool(x)
            x = torch.flatten(x, 1)
            return self.classifier(x)

    class LeNet5(nn.Module):
        """LeNet-5 (LeCun et al., 1998) with ReLU, max pooling and same-padded convolutions."""

        def __init__(self, num_classes: int = 10, in_channels: int = 1, channels_last: bool = False):
            super().__init__()
            self.channels_last = channels_last  # NHWC input: permuted to NCHW first (not in the state dict)
            self.features = nn.Sequential(
                nn.Conv2d(in_channels, 6, kernel_size=5, padding=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=2, stride=2),
                nn.Conv2d(6, 16, kernel_size=5, padding=2),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=2, stride=2),
            )
            self.avgpool = AdaptiveAvgPool2d((5, 5))
            self.classifier = nn.Sequential(
                nn.Linear(16 * 5 * 5, 120),
                nn.ReLU(inplace=True),
                nn.Linear(120, 84),
                nn.ReLU(inplace=True),
                nn.Linear(84, num_classes),
            )
            he_init(self, self.classifier[4])

        def forward(self, x):
            if self.channels_last:
                x = x.permute(0, 3, 1, 2)
            x = self.features(x)
            x = self.avgpool(x)
            x = torch.flatten(x, 1)
            return self.classifier(x)

    class MLP(nn.Module):
        """Linear -> ReLU (-> Dropout) per hidden width, then a Linear to the outputs; He init."""

        def __init__(self, in_features: int, hidden: tuple[int, ...], outputs: int, dropout: float = 0.0):
            super().__init__()
            layers: list[nn.Module] = []
            width = in_features
            for h in hidden:
                layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
                if dropout:
                    layers.append(nn.Dropout(p=dropout))
                width = h
            layers.append(nn.Linear(width, outputs))
            self.layers = nn.Sequential(*layers)
            he_init(self, layers[-1])

        def forward(self, x):
            return self.layers(torch.flatten(x, 1))

    for cls in (AdaptiveAvgPool2d, AlexNet, LeNet5, MLP):
        # resolvable as zoo_stages.lib.models.archs.<Name> (module __getattr__), e.g. for pickling
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return SimpleNamespace(AdaptiveAvgPool2d=AdaptiveAvgPool2d, AlexNet=AlexNet, LeNet5=LeNet5, MLP=MLP)
