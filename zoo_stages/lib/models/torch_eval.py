"""A torch model's inputs, loss and figures by the task's kind (`zoo_stages.lib.quality.tasks.kind_of`):
cross-entropy and accuracy for classification, mean squared error and mean absolute error of the
1-wide output for regression, and for generation (a causal language model on blocks of token ids,
`zoo_stages.lib.data.corpus`) the next-token cross-entropy and the perplexity (its exponential, per
token): the targets are the blocks themselves, shifted by one. The train kind's loop and evaluation use them, and so does the
equivalence check that judges a checkpoint trained on another platform class by its held-out
quality (`zoo_stages.lib.quality.training_quality`). torch and numpy are imported inside functions.
"""

from __future__ import annotations

from typing import Any, Mapping

from zoo.errors import InvalidInput


def as_model_inputs(features: Mapping[str, Any]) -> dict[str, Any]:
    """The bound features as torch takes them: floats as float32, integers and booleans as int64
    (token ids, masks); read-only cached arrays are copied once here."""
    import numpy as np

    out = {}
    for name, array in features.items():
        a = np.asarray(array)
        out[name] = np.array(a, dtype=np.float32 if a.dtype.kind == "f" else np.int64)
    return out


def labels(y_np, kind: str):
    import numpy as np
    import torch

    return torch.from_numpy(np.array(y_np, dtype=np.int64 if kind in ("classification", "generation") else np.float32))


def targets(x_np: Mapping[str, Any], y_np, kind: str):
    """What the loss compares the outputs with: the labels, or for generation the token blocks
    (`input_ids`), whose next tokens the model predicts."""
    if kind == "generation":
        if "input_ids" not in x_np:
            raise InvalidInput("a text-generation model is trained on `input_ids` blocks, which the data lacks",
                               hint="give a corpus: `data: {source: text, ...}`")
        return x_np["input_ids"]
    return y_np


def loss(out, y, kind: str, reduction: str = "mean"):
    """Cross-entropy on the logits (classification), MSE of the 1-wide output (regression), or the
    next-token cross-entropy of (N, L, vocab) logits against the (N, L) blocks (generation: position
    t predicts token t + 1; a "sum" is over every predicted token)."""
    import torch

    if kind == "generation":
        if out.ndim != 3:
            raise InvalidInput(f"a text-generation model must give (batch, sequence, vocab) logits, it gives "
                               f"{tuple(out.shape)}", hint="use a *ForCausalLM architecture")
        return torch.nn.functional.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), y[:, 1:].reshape(-1),
                                                 reduction=reduction)
    if kind == "classification":
        return torch.nn.functional.cross_entropy(out, y, reduction=reduction)
    pred = regression_output(out)
    return torch.nn.functional.mse_loss(pred, y, reduction=reduction)


def regression_output(out):
    """The (N,) predictions of a regression model's (N,) or (N, 1) output."""
    pred = out.reshape(out.shape[0], -1)
    if pred.shape[1] != 1:
        raise InvalidInput(f"a regression task needs one output value per sample, the model gives {pred.shape[1]}",
                           hint="regression models built by zoo have a 1-wide output; a model.entry must return one")
    return pred[:, 0]


def evaluate(model, x_np: Mapping[str, Any], y_np, kind: str, batch_size: int) -> dict[str, float]:
    """In evaluation mode: mean loss, and accuracy (classification), mean absolute error (regression)
    or perplexity (generation: the mean is per predicted token)."""
    import math

    import torch

    model.eval()
    y_np = targets(x_np, y_np, kind)
    n = 0 if y_np is None else len(y_np)
    if n == 0 or kind == "generic":
        return {"loss": float("nan")}
    y = labels(y_np, kind)
    loss_sum, correct, abs_sum = 0.0, 0, 0.0
    with torch.no_grad():
        for start in range(0, n, batch_size):
            out = model(*(torch.from_numpy(x[start:start + batch_size]) for x in x_np.values()))
            yb = y[start:start + batch_size]
            loss_sum += loss(out, yb, kind, reduction="sum").item()
            if kind == "generation":
                continue
            if kind == "classification":
                correct += int((out.argmax(1) == yb).sum())
            else:
                abs_sum += float((regression_output(out) - yb).abs().sum())
    if kind == "generation":
        mean = loss_sum / (n * (y.shape[1] - 1))
        return {"loss": mean, "perplexity": math.exp(min(mean, 700.0))}
    figures = {"loss": loss_sum / n}
    if kind == "classification":
        figures["accuracy"] = correct / n
    else:
        figures["mae"] = abs_sum / n
    return figures
