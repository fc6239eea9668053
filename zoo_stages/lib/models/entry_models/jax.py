"""JAX (and Flax) models: a forward function and its trained parameters, saved as safetensors.

A JAX model is code plus numbers: the forward function ``apply(params, *inputs)`` named by the
recipe's ``model.entry`` (it stays in the recipe's file, whose digest enters the train and export
keys) and the parameters the train stage's ``config.entry`` returns: a nested mapping with string
keys and array leaves (Flax's ``variables``, e.g. ``{"params": {"Dense_0": {"kernel", "bias"}}}``).

Checkpoint: ``params.safetensors``, the leaves by their path (keys joined with ``/``) in their
own dtypes; safetensors holds a JSON header and raw tensors, so loading runs no code (never
pickle, never ``np.load(allow_pickle=True)``), and the same parameters give the same bytes. Its
metadata records the format and its schema version (``zoo.format: jax-params/1``).

Export traces ``apply`` with the parameters as constants through jax2onnx (`to_onnx`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from zoo.errors import IntegrityError, InvalidInput

CHECKPOINT = "params.safetensors"
FORMAT = "jax-params/1"  # the checkpoint's format and schema version, in its metadata
SEPARATOR = "/"


@dataclass(frozen=True)
class JaxModel:
    """A JAX model: its forward function and parameters (a nested dict of numpy arrays)."""

    apply: Callable[..., Any]
    params: Mapping[str, Any]


def forward_function(model_section: Mapping[str, Any], recipe_dir: Path) -> Callable[..., Any]:
    """The recipe's ``model.entry``: ``apply(params, *inputs)``."""
    from zoo_stages.lib.models import archs

    if not model_section.get("entry"):
        raise InvalidInput("a JAX model needs `model.entry: file.py:function`, its forward function "
                           "apply(params, *inputs)", hint="see the contract in the README (Keras and JAX models)")
    return archs.load_function(model_section["entry"], recipe_dir, "model.entry")


def fit(entry: str, model_section: Mapping[str, Any], recipe_dir: Path, train: Any, val: Any,
        config: Mapping[str, Any], seed: int, context: Any) -> JaxModel:
    """The model whose parameters ``entry(apply, train, val, config, context)`` returns."""
    from zoo_stages.lib.models import archs
    from zoo_stages.lib.models.entry_models.user_code import user_code

    apply = forward_function(model_section, recipe_dir)
    fn = archs.load_function(entry, recipe_dir, "config.entry")
    with user_code(seed):
        params = fn(apply, train, val, dict(config), context)
    return JaxModel(apply, unflatten(flatten(params, f"config.entry {entry!r} returned")))


def save(model: JaxModel, target: Path) -> Path:
    """Write the parameters as safetensors at `target` (see the module docstring)."""
    from safetensors.numpy import save

    from zoo.files import atomic_write

    # one metadata entry: safetensors writes metadata as a map, keep its order trivial
    atomic_write(target, save(flatten(model.params, "the parameters"), metadata={"zoo.format": FORMAT}), fsync=False)
    return target


def load(checkpoint: Path, model_section: Mapping[str, Any], recipe_dir: Path) -> JaxModel:
    """The checkpoint's parameters with the recipe's forward function."""
    from safetensors import safe_open
    from safetensors.numpy import load_file

    with safe_open(str(checkpoint), "np") as f:
        found = (f.metadata() or {}).get("zoo.format")
    if found != FORMAT:
        raise IntegrityError(f"{checkpoint.name} is not a zoo JAX checkpoint of format {FORMAT} (found {found!r})",
                             hint="rebuild it with the train stage of this zoo version")
    return JaxModel(forward_function(model_section, recipe_dir), unflatten(load_file(str(checkpoint))))


def predict(model: JaxModel, inputs: list[Any]) -> list[Any]:
    """JAX's outputs of ``apply(params, *inputs)``, flattened in pytree order, as numpy."""
    import jax
    import numpy as np

    outputs = jax.jit(model.apply)(model.params, *inputs)
    return [np.asarray(o) for o in jax.tree_util.tree_leaves(outputs)]


def to_onnx(model: JaxModel, inputs: Mapping[str, Any], opset: int) -> Any:
    """``apply`` with the parameters as constants, converted by jax2onnx: one float32 input per
    entry of `inputs` (example arrays), batch axis ``batch``."""
    import jax
    import jax.numpy as jnp
    from jax2onnx import to_onnx as convert

    params = jax.tree_util.tree_map(jnp.asarray, model.params)

    def forward(*xs):
        return model.apply(params, *xs)

    specs = [jax.ShapeDtypeStruct(("batch", *a.shape[1:]), jnp.float32) for a in inputs.values()]
    return convert(forward, inputs=specs, input_names=list(inputs), opset=opset,
                   model_name=getattr(model.apply, "__name__", "apply"))


def parameter_count(model: JaxModel) -> int:
    return int(sum(a.size for a in flatten(model.params, "the parameters").values()))


def flatten(params: Any, where: str) -> dict[str, Any]:
    """``{"a/b/c": array}`` for a nested mapping of string keys to arrays; InvalidInput naming
    `where` for anything else."""
    import numpy as np

    flat: dict[str, Any] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                if not isinstance(key, str) or not key or SEPARATOR in key:
                    raise InvalidInput(f"{where} a parameter key {key!r} at {SEPARATOR.join(path) or 'the top'}",
                                       hint=f"parameters are nested dicts with non-empty string keys without "
                                            f"{SEPARATOR!r} (Flax variables are)")
                walk(value, (*path, key))
            return
        array = np.asarray(node)
        if array.dtype.kind not in "fiub" or not path:
            raise InvalidInput(f"{where} {type(node).__name__} at {SEPARATOR.join(path) or 'the top'}, not a "
                               "nested dict of arrays", hint="return the parameters, e.g. Flax's variables")
        flat[SEPARATOR.join(path)] = np.ascontiguousarray(array)

    walk(params, ())
    if not flat:
        raise InvalidInput(f"{where} no parameters", hint="return the trained parameters")
    return flat


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested dict that `flatten` flattened."""
    nested: dict[str, Any] = {}
    for path, array in flat.items():
        *parents, leaf = path.split(SEPARATOR)
        node = nested
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = array
    return nested
