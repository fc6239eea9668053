"""The `train` kind: fit the recipe's model on the recipe's dataset, deterministically.

Output ``checkpoint``: ``model.safetensors`` (the model's state dict, float32). The same
recipe, data, tool versions and thread count give the same checkpoint bytes: seeds are fixed,
torch runs with deterministic algorithms on ``config.threads`` (default: ``context.threads``)
threads, and batches come from a seeded permutation (no DataLoader workers). Float sums are
split differently on different thread counts, so pin ``threads`` for bit-identical rebuilds.

Metrics: ``train_loss`` / ``train_accuracy`` (averaged over the last epoch's batches, in
training mode), ``val_loss`` / ``val_accuracy`` (held-out split, evaluation mode), ``epochs``,
``samples``, ``seconds``, ``history`` (one entry per epoch) and ``split`` (`split_info`).

Custom training: ``config.entry: path/to/file.py:function`` replaces the built-in loop. The
function is called as ``function(model, (x_train, y_train), (x_val, y_val), config, context)``
where the arrays are read-only numpy arrays (x float32 NCHW in [0, 1], y int64), ``config`` is
this stage's config as a plain dict and ``context`` the `StageContext` (``context.threads``,
``context.work_dir``, ``context.metrics`` for extra metrics, ``context.log``). Seeds are set
before the call. It returns the trained ``torch.nn.Module`` (or None when it trained `model`
in place); zoo then evaluates it and writes the checkpoint as usual.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal, Mapping

from pydantic import Field, model_validator

from zoo.errors import InvalidInput
from zoo.stage import Inputs, KeyContext, KindConfig, StageContext, StageKind
from zoo_stages.lib import checkpoints


class OptimizerConfig(KindConfig):
    """The optimizer; `momentum` is used by sgd only."""

    name: Literal["sgd", "adam", "adamw"] = "adam"
    lr: float = Field(1e-3, gt=0, description="learning rate")
    momentum: float = Field(0.9, ge=0, lt=1, description="sgd momentum")
    weight_decay: float = Field(0.0, ge=0)


class TrainConfig(KindConfig):
    epochs: int = Field(5, ge=1, le=100000)
    batch_size: int = Field(64, ge=1)
    optimizer: OptimizerConfig = OptimizerConfig()
    schedule: Literal["constant", "cosine"] = Field(
        "constant", description="learning-rate schedule over all steps (cosine decays to 0)")
    seed: int = Field(0, description="seed of weight init, batch order and dropout")
    threads: int | None = Field(
        None, ge=1, le=256, description="torch threads; the checkpoint bytes depend on it (GEMM splits), "
                                        "so pin it for bit-identical rebuilds; default: the runner's thread count")
    entry: str | None = Field(None, description="custom training function 'path/to/file.py:function'")

    @model_validator(mode="after")
    def _entry_format(self):
        if self.entry is not None:
            from zoo_stages.lib.archs import parse_entry

            try:
                parse_entry(self.entry, "config.entry")
            except InvalidInput as e:  # pydantic reports ValueErrors at the field's position
                raise ValueError(e.message) from None
        return self


class Train(StageKind):
    name = "train"
    version = "1"
    Config = TrainConfig
    tools = ("torch", "numpy", "scikit-learn", "safetensors")
    # the dataset (every field: the loader reads them all) and what builds the network; not
    # model.task or the I/O names (metadata for export and deploy), so editing those does not retrain
    shared = ("data", "model.arch", "model.entry", "model.num_classes")
    outputs = ("checkpoint",)
    summary = "train the model on the recipe's dataset (deterministic; safetensors checkpoint)"

    def dependencies(self, config: TrainConfig, ctx: KeyContext) -> list[Path]:
        from zoo_stages.lib import archs, datasets

        deps: list[Path] = []
        if config.entry:
            deps.append(archs.entry_file(config.entry, ctx.recipe.dir, "config.entry"))
        model = ctx.shared.get("model") or {}
        if model.get("entry"):
            deps.append(archs.entry_file(model["entry"], ctx.recipe.dir, "model.entry"))
        if ctx.shared.get("data"):
            deps.extend(datasets.data_dependencies(dict(ctx.shared["data"]), ctx.recipe.dir))
        return deps

    def run(self, inputs: Inputs, config: TrainConfig, context: StageContext) -> Mapping[str, Path]:
        import torch

        from zoo_stages.lib import archs, datasets

        data = dict(context.shared.get("data") or {})
        model_section = context.shared.get("model") or {}
        if not data:
            raise InvalidInput("the train stage needs the recipe's `data:` section",
                               hint="add e.g. `data: {source: digits, image_size: 8}`")
        train_split = datasets.load_split(data, context.recipe.dir, "train")
        val_split = datasets.load_split(data, context.recipe.dir, "val")
        x_train, y_train = train_split.single("train"), train_split.labels
        x_val, y_val = val_split.single("train"), val_split.labels
        info = datasets.split_info(data, context.recipe.dir)
        num_classes = int(model_section.get("num_classes", 10))
        if info["num_classes"] > num_classes:
            raise InvalidInput(f"the dataset has {info['num_classes']} classes but model.num_classes is {num_classes}",
                               hint=f"set `model.num_classes: {info['num_classes']}`")

        threads = config.threads or context.threads
        with _deterministic(config.seed, threads):
            model = archs.build_model(model_section, context.recipe.dir, in_channels=int(data.get("channels", 1)))
            started = time.perf_counter()
            if config.entry:
                fn = archs.load_function(config.entry, context.recipe.dir, "config.entry")
                returned = fn(model, (x_train, y_train), (x_val, y_val), config.model_dump(mode="json"), context)
                if returned is not None:
                    if not isinstance(returned, torch.nn.Module):
                        raise InvalidInput(f"config.entry {config.entry!r} returned {type(returned).__name__}",
                                           hint="return the trained torch.nn.Module, or None after training `model` in place")
                    model = returned
                history: list[dict[str, Any]] = []
                train_loss, train_acc = _evaluate(model, x_train, y_train, config.batch_size)
            else:
                history = _fit(model, x_train, y_train, config, context)
                train_loss, train_acc = history[-1]["train_loss"], history[-1]["train_accuracy"]
            val_loss, val_acc = _evaluate(model, x_val, y_val, max(config.batch_size, 256))
            seconds = time.perf_counter() - started

        path = checkpoints.save_checkpoint(model, context.output_path("model.safetensors"))
        context.metrics.update({
            "train_loss": round(train_loss, 6),
            "train_accuracy": round(train_acc, 6),
            "val_loss": round(val_loss, 6),
            "val_accuracy": round(val_acc, 6),
            "epochs": config.epochs,
            "samples": int(len(y_train)),
            "num_parameters": int(sum(p.numel() for p in model.parameters())),
            "seconds": round(seconds, 3),
            "threads": int(threads),
            "history": history,
            "split": info,
        })
        context.log.info("trained: val_accuracy %.4f val_loss %.4f in %.1fs", val_acc, val_loss, seconds)
        return {"checkpoint": path}


class _deterministic:
    """Seeds, deterministic kernels and a fixed thread count; restores the global settings."""

    def __init__(self, seed: int, threads: int):
        self.seed, self.threads = seed, max(1, int(threads))

    def __enter__(self):
        import numpy as np
        import torch

        self._saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                       torch.random.get_rng_state(), np.random.get_state())
        torch.set_num_threads(self.threads)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(self.seed)
        np.random.seed(self.seed % 2**32)
        return self

    def __exit__(self, *exc):
        import numpy as np
        import torch

        threads, det, rng, np_state = self._saved
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(det)
        torch.random.set_rng_state(rng)
        np.random.set_state(np_state)
        return False


def _fit(model, x_np, y_np, config: TrainConfig, context: StageContext) -> list[dict[str, Any]]:
    """The built-in loop: cross-entropy, seeded batch order, optional cosine schedule."""
    import numpy as np
    import torch

    x = torch.from_numpy(np.array(x_np, dtype=np.float32))  # a writable copy of the cached arrays
    y = torch.from_numpy(np.array(y_np, dtype=np.int64))
    n = len(y)
    opt = _optimizer(model, config.optimizer)
    steps_per_epoch = (n + config.batch_size - 1) // config.batch_size
    total = steps_per_epoch * config.epochs
    sched = None
    if config.schedule == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    order = torch.Generator().manual_seed(config.seed)
    loss_fn = torch.nn.CrossEntropyLoss()
    history = []
    for epoch in range(config.epochs):
        model.train()
        perm = torch.randperm(n, generator=order)
        loss_sum, correct = 0.0, 0
        for start in range(0, n, config.batch_size):
            idx = perm[start:start + config.batch_size]
            xb, yb = x[idx], y[idx]
            opt.zero_grad(set_to_none=True)
            logits = model(xb)
            loss = loss_fn(logits, yb)
            if not torch.isfinite(loss):
                raise InvalidInput(f"training diverged at epoch {epoch + 1} (loss {loss.item()})",
                                   hint="lower optimizer.lr")
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            loss_sum += loss.item() * len(idx)
            correct += int((logits.argmax(1) == yb).sum())
        entry = {"epoch": epoch + 1, "train_loss": round(loss_sum / n, 6), "train_accuracy": round(correct / n, 6)}
        history.append(entry)
        context.log.info("epoch %d/%d: loss %.4f accuracy %.4f", epoch + 1, config.epochs,
                         entry["train_loss"], entry["train_accuracy"])
    return history


def _optimizer(model, cfg: OptimizerConfig):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    cls = torch.optim.Adam if cfg.name == "adam" else torch.optim.AdamW
    # the fused CPU kernel is ~10x faster on large models (AlexNet: 0.1 s a step instead of 1 s)
    # and, being element-wise, just as deterministic
    try:
        return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)
    except (RuntimeError, TypeError):
        return cls(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _evaluate(model, x_np, y_np, batch_size: int) -> tuple[float, float]:
    """Mean cross-entropy and accuracy in evaluation mode."""
    import numpy as np
    import torch

    model.eval()
    n = len(y_np)
    if n == 0:
        return float("nan"), float("nan")
    loss_sum, correct = 0.0, 0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            xb = torch.from_numpy(np.array(x_np[start:start + batch_size], dtype=np.float32))
            yb = torch.from_numpy(np.array(y_np[start:start + batch_size], dtype=np.int64))
            logits = model(xb)
            loss_sum += torch.nn.functional.cross_entropy(logits, yb, reduction="sum").item()
            correct += int((logits.argmax(1) == yb).sum())
    return loss_sum / n, correct / n
