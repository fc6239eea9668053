"""Model architectures in plain torch.nn, and the loader for user-defined models.

The recipe's ``model:`` section names either a built-in ``arch`` or a user ``entry``:

- ``arch: alexnet``: exactly torchvision's AlexNet layout (``features`` / ``avgpool`` /
  ``classifier``, same layer indices), so torchvision state dicts (``features.0.weight``,
  ``classifier.1.weight``...) load directly. Inputs must be at least 63x63 (three stride-2
  max pools after a stride-4 convolution); 64x64 gives a 1x1 feature map that the adaptive
  pool spreads to 6x6, 224x224 gives 6x6 as in the paper.
- ``arch: lenet5``: LeNet-5 (conv 6@5x5, pool, conv 16@5x5, pool, 120, 84, classes) with
  "same" padding on both convolutions and an adaptive average pool to 5x5 before the
  classifier, so it accepts any input of at least 4x4 (8x8 digits, 28x28 MNIST, 32x32...).
- ``entry: path/to/file.py:function``: the file (relative to the recipe) is imported and
  ``function(num_classes=<model.num_classes>, in_channels=<data.channels>)`` is called; it
  must return a ``torch.nn.Module`` that maps float32 NCHW images in [0, 1] to logits of
  shape (N, num_classes). The file's content enters the cache key of every stage using it.

Fresh built-in models use He-normal initialisation (torchvision uses torch's defaults): the
layout and state-dict keys are unchanged, but training from scratch starts learning at once.

torch is imported only when a model is built: the classes are created on first use, so
importing this module (to list dependencies for a cache key) stays cheap.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from zoo.errors import InvalidInput

ARCHS = ("alexnet", "lenet5")


def build_model(model_section: dict, recipe_dir: Path, *, in_channels: int = 3) -> Any:
    """The torch.nn.Module described by the recipe's ``model:`` section (random weights).

    `in_channels` is the number of image channels (the recipe's ``data.channels``, or the
    export's input shape); `num_classes` comes from the section itself.
    """
    if not isinstance(model_section, dict) or not model_section:
        raise InvalidInput("this stage needs the recipe's `model:` section",
                           hint="add e.g. `model: {arch: lenet5, num_classes: 10}` to the recipe")
    arch, entry = model_section.get("arch"), model_section.get("entry")
    num_classes = int(model_section.get("num_classes", 10))
    if arch and entry:
        raise InvalidInput("model.arch and model.entry are both set", hint="keep only one of them")
    if entry:
        fn = load_function(entry, Path(recipe_dir), field="model.entry")
        model = fn(num_classes=num_classes, in_channels=in_channels)
        import torch

        if not isinstance(model, torch.nn.Module):
            raise InvalidInput(f"model.entry {entry!r} returned {type(model).__name__}, not a torch.nn.Module",
                               hint="the function must return the model, e.g. `return MyNet(num_classes)`")
        return model
    if not arch:
        raise InvalidInput("the model: section has neither `arch` nor `entry`",
                           hint=f"set `model.arch` to one of {', '.join(ARCHS)}, or `model.entry: file.py:function`")
    if arch == "alexnet":
        return alexnet(num_classes=num_classes, in_channels=in_channels)
    if arch == "lenet5":
        return lenet5(num_classes=num_classes, in_channels=in_channels)
    close = difflib.get_close_matches(str(arch), ARCHS, n=1)
    raise InvalidInput(f"unknown model.arch {arch!r}" + (f" — did you mean {close[0]!r}?" if close else ""),
                       hint=f"built-in architectures: {', '.join(ARCHS)}; or use `model.entry: file.py:function`")


def alexnet(num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5) -> Any:
    """AlexNet with torchvision's exact module layout and state-dict keys."""
    return _classes().AlexNet(num_classes=num_classes, in_channels=in_channels, dropout=dropout)


def lenet5(num_classes: int = 10, in_channels: int = 1) -> Any:
    """LeNet-5 with same-padded convolutions and an adaptive 5x5 pool (any input >= 4x4)."""
    return _classes().LeNet5(num_classes=num_classes, in_channels=in_channels)


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
    if name in ("AlexNet", "LeNet5", "AdaptiveAvgPool2d"):
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

        def __init__(self, num_classes: int = 1000, in_channels: int = 3, dropout: float = 0.5):
            super().__init__()
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
            x = self.features(x)
            x = self.avgpool(x)
            x = torch.flatten(x, 1)
            return self.classifier(x)

    class LeNet5(nn.Module):
        """LeNet-5 (LeCun et al., 1998) with ReLU, max pooling and same-padded convolutions."""

        def __init__(self, num_classes: int = 10, in_channels: int = 1):
            super().__init__()
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
            x = self.features(x)
            x = self.avgpool(x)
            x = torch.flatten(x, 1)
            return self.classifier(x)

    for cls in (AdaptiveAvgPool2d, AlexNet, LeNet5):
        # resolvable as zoo_stages.lib.archs.<Name> (module __getattr__), e.g. for pickling
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
    return SimpleNamespace(AdaptiveAvgPool2d=AdaptiveAvgPool2d, AlexNet=AlexNet, LeNet5=LeNet5)
