"""Equivalence of two torch checkpoints trained from the same recipe on CPUs of different platform
classes: judged by quality on the recipe's held-out split, since weights trained on other kernels
are not numerically close (each step's rounding feeds the next: lenet-digits' weights differ by
0.22 after 10 epochs on AVX2 and AVX-512 CPUs, while its held-out accuracy moves by a few tenths of
a point).

Both checkpoints are loaded into the recipe's network and evaluated as the train kind evaluates
(`zoo_stages.train`: the held-out split of the recipe's `data:`, evaluation mode). Equivalent when
the held-out quality moved by at most the tolerance: accuracy by ``tolerance`` (0.01 = one point)
for classification, mean absolute error by that share of the locked one for regression, perplexity
on the held-out blocks by that share of the locked one for text-generation. The
verdict also reports the held-out loss, the share of samples on which both predict the same class
(classification) and the weights' largest absolute difference, so it says which kind of
equivalence it is and how far the weights moved.

torch is imported inside functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zoo.stage import Equivalence


def compare_checkpoints(locked: Path, rebuilt: Path, shared: Mapping[str, Any], recipe_dir: Path, *,
                        tolerance: float, parent: Any = None) -> Equivalence:
    """Whether the `rebuilt` checkpoint is as good as the `locked` one on the held-out split
    (`parent`: a `model.from` recipe's parent model, which the network is built from)."""
    import numpy as np
    import torch

    from zoo_stages.lib.data import datasets
    from zoo_stages.lib.models import archs, checkpoints, torch_eval
    from zoo_stages.lib.quality import tasks
    from zoo_stages.lib.runtimes import onnx_run

    data = dict(shared.get("data") or {})
    model_section = dict(shared.get("model") or {})
    kind = tasks.kind_of(shared.get("task") or "image-classification")
    val = datasets.load_split(data, recipe_dir, "val")
    if kind != "generation" and (val.labels is None or not len(val.labels)) or kind == "generic":
        return Equivalence(False, ("checkpoint: the held-out split has no labels to judge quality by, and weights "
                                   "trained on other kernels are not numerically close",))
    names = [i.name for i in archs.model_inputs(model_section, data)]
    if kind == "generation":  # the blocks alone, as train fed them
        names = names[:1]
    x_val = torch_eval.as_model_inputs(onnx_run.bind_names(names, val.features, where="the held-out split"))
    first = next(iter(x_val.values()))
    width = int(np.prod(first.shape[1:])) if first.ndim > 1 else 1
    sizes = archs.data_sizes(model_section, data, recipe_dir, regression=kind == "regression", width=width)
    models = [checkpoints.build_with_weights(model_section, recipe_dir, p, label, parent=parent, **sizes)
              for p, label in ((locked, "the locked checkpoint"), (rebuilt, "the rebuilt checkpoint"))]
    targets = torch_eval.targets(x_val, val.labels, kind)
    batch = 16 if kind == "generation" else 256  # (batch, sequence, vocab) logits
    with torch.no_grad():
        figures = [torch_eval.evaluate(m, x_val, val.labels, kind, batch) for m in models]
        # a language model's logits are (blocks, sequence, vocab): only its next-token choices are kept
        outputs = [torch.cat([_kept(m(*(torch.from_numpy(x[i:i + batch]) for x in x_val.values())), kind)
                              for i in range(0, len(targets), batch)]) for m in models]
        states = [m.state_dict() for m in models]
        weights_max = max((float((states[0][k].float() - states[1][k].float()).abs().max())
                           for k in states[0] if states[0][k].numel()), default=0.0)
    (old, new), n = figures, len(targets)
    if kind == "generation":
        metric = "perplexity"
        change = abs(new[metric] - old[metric]) / max(abs(old[metric]), 1e-12)
        agreement = float((outputs[0] == outputs[1]).float().mean())
        agree = f", next-token predictions agree on {agreement:.4f} of positions"
        bound = f"within {tolerance:g} of the locked perplexity"
    elif kind == "classification":
        metric, change = "accuracy", abs(new["accuracy"] - old["accuracy"])
        agreement = float((outputs[0].argmax(1) == outputs[1].argmax(1)).float().mean())
        agree = f", predictions agree on {agreement:.4f} of samples"
        bound = f"within {tolerance:g}"
    else:
        metric, change = "mae", abs(new["mae"] - old["mae"]) / max(abs(old["mae"]), 1e-12)
        agree = ""
        bound = f"within {tolerance:g} of the locked mae"
    unit = "blocks" if kind == "generation" else "samples"
    line = (f"held-out {metric} {old[metric]:.4f} vs {new[metric]:.4f} on {n} {unit}, loss {old['loss']:.4f} vs "
            f"{new['loss']:.4f}{agree}; weights differ by max-abs {weights_max:.3g} (trained on other kernels, "
            "so not compared)")
    if change <= tolerance:
        return Equivalence(True, (f"checkpoint: equivalent quality ({bound}): {line}",))
    return Equivalence(False, (f"checkpoint: quality differs (beyond {tolerance:g}): {line}",))


def _kept(out: Any, kind: str) -> Any:
    """What the verdict compares of a batch's outputs: a language model's next-token choices, else the outputs."""
    return out.argmax(-1) if kind == "generation" else out
