"""Fine-tuning and transfer learning: a recipe's network taken from a model in the local zoo.

The recipe's ``model: {from: zoo:NAME@VERSION, build: BUILD, head: keep|new}`` names the parent:
a pinned version in the local zoo (published by its recipe's deploy stage, or pulled), and one of
its ONNX builds (default: its float32 one). The engine resolves it before the stage's key is
computed (zoo/engine/parents.py: the build's files checked against their sha256, what is read of
its manifest written to a pin) and hands it to the stage as ``context.references["model.from"]``
(`zoo.stage.PinnedModel`); this module only reads the files it is given. The build is converted
back to torch by `zoo.onnx_to_torch`, weights included; nothing in it is run. ``head: new``
replaces the parent's last Linear layer by a fresh one of ``model.num_classes`` outputs (transfer
learning); with ``keep`` (the default) the parent's output width must be ``num_classes``.

train and export both build the network here (`archs.build_model`), so the parent's files (its
pin, its ONNX file and sidecars: external data) are dependencies of both (their digests enter the
keys: a republished parent retrains, even one whose weights alone changed, and a Dask worker is
given them), and export records it as an attribution source, which deploy writes into the
version's lineage (``lineage.sources["zoo:NAME@VERSION"] = "sha256:..."``) and its model card.

`freeze` fixes parameters by name (``train.config.freeze``: fnmatch patterns such as
``features.*``) so that only the rest trains.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import InvalidInput

if TYPE_CHECKING:
    from zoo.stage import PinnedModel

FIELD = "model.from"  # the field whose model the engine resolves (zoo_stages/sections/model.py `references`)


def parent(references: Mapping[str, "PinnedModel"]) -> "PinnedModel | None":
    """The parent `model.from` names, as the engine resolved it for this stage (`context.references`);
    None when the recipe has no `model.from`."""
    return references.get(FIELD)


def dependencies(references: Mapping[str, "PinnedModel"]) -> list[Path]:
    """The parent's pin, ONNX file and its sidecars (external data), whose contents enter the key of
    every stage that builds the network (and travel to a Dask worker with the stage)."""
    found = parent(references)
    return list(found.files) if found is not None else []


def build_model(model_section: Mapping[str, Any], found: "PinnedModel | None", outputs: int) -> Any:
    """The parent converted to torch (its weights), with its head kept or replaced (`outputs` wide)."""
    from zoo import onnx_to_torch

    if found is None:  # a kind that reads `model.from` without declaring it, so the engine resolved nothing
        raise InvalidInput(f"{FIELD} {model_section.get('from')}: this stage was given no parent model",
                           hint=f"the stage's kind must declare {FIELD!r} (and 'model.build') in its `shared`")
    module = onnx_to_torch.convert(found.path, where=f"{FIELD} {found.source} build {found.build}")
    if model_section.get("head") == "new":
        onnx_to_torch.replace_head(module, outputs)
        return module
    width = found.outputs[-1] if found.outputs else None
    if isinstance(width, int) and width != outputs:
        raise InvalidInput(f"model.from {found.source} gives {width} outputs but the recipe's model has {outputs} "
                           "(model.num_classes)",
                           hint=f"set `model.num_classes: {width}`, or `model.head: new` for a fresh last layer "
                                f"of {outputs} outputs")
    return module


def attribution(references: Mapping[str, "PinnedModel"]) -> list[dict[str, str]]:
    """The parent as an attribution record (export stamps it; deploy puts it in the lineage)."""
    from zoo_stages.lib.release import provenance

    found = parent(references)
    if found is None:
        return []
    return [provenance.source_attribution(found.source, url=f"{found.source}#{found.build}", sha256=found.sha256,
                                          license=found.license)]


def freeze(model: Any, patterns: list[str]) -> int:
    """Fix the parameters whose names match any of `patterns` (fnmatch); returns how many tensors.
    A pattern that matches nothing is InvalidInput listing the model's parameter names."""
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(n, pattern) for n in names):
            raise InvalidInput(f"config.freeze: {pattern!r} matches none of the model's parameters",
                               hint=f"its parameters: {', '.join(names[:20])}" + (" ..." if len(names) > 20 else ""))
    frozen = 0
    for name, p in model.named_parameters():
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns):
            p.requires_grad_(False)
            frozen += 1
    return frozen
