"""Model checkpoints: saved as safetensors, loaded without ever running pickled code.

`save_checkpoint` writes a state dict as safetensors (temp file, then rename). `load_weights`
reads safetensors or a torch.save state dict with ``weights_only=True`` (pickled objects other
than tensors are refused, never executed) and checks every tensor's name and shape against the
model before loading. torch is imported inside functions.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from zoo.errors import InvalidInput


def save_checkpoint(model, target: Path) -> Path:
    """The state dict as safetensors, written to a temp file and renamed into place."""
    from safetensors.torch import save_file

    from zoo.files import atomic_output

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    with atomic_output(target, fsync=False) as tmp:  # the cache fsyncs the outputs it commits
        # a single metadata key: safetensors writes metadata as a map, keep its order trivial
        save_file(state, str(tmp), metadata={"format": "pt"})
    return target


def build_with_weights(model_section: dict, recipe_dir: Path, weights: Path, label: str, **sizes):
    """The recipe's model with `weights` loaded, in eval mode (`sizes`: `archs.build_model`'s
    keywords, what the data decides, and a `model.from` recipe's ``parent``).

    The module is first built on torch's meta device: its random initialisation (0.4-0.7 s for
    AlexNet's 61M parameters) would be overwritten anyway, so the loaded tensors are assigned
    instead of copied. A module that keeps tensors outside its state dict (non-persistent
    buffers) would stay half on the meta device: it is then built and loaded the ordinary way.
    """
    import torch

    from zoo_stages.lib.models import archs

    with torch.device("meta"):
        model = archs.build_model(model_section, recipe_dir, pretrained_weights=False, **sizes)
    load_weights(model, weights, label, assign=True)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        model = archs.build_model(model_section, recipe_dir, pretrained_weights=False, **sizes)
        load_weights(model, weights, label)
    return model.eval()


def load_weights(model, path: Path, label: str, *, assign: bool = False) -> None:
    """Load a state dict (safetensors, or torch.save with weights_only=True) into `model`.

    `assign` puts the loaded tensors themselves into the module (for a module built on the
    meta device) instead of copying them into its own.
    """
    import torch

    with open(path, "rb") as f:
        head = f.read(16)
    try:
        if head[:4] == b"PK\x03\x04":  # torch.save's zip format: memory-mapped, no copy of the weights
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
                state = state["state_dict"]  # the common {"state_dict": ..., "epoch": ...} wrapper
        elif head[:1] == b"\x80":  # the legacy pickle format
            state = torch.load(path, map_location="cpu", weights_only=True)
            if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
                state = state["state_dict"]  # the common {"state_dict": ..., "epoch": ...} wrapper
        elif len(head) > 8 and head[8:9] == b"{":  # safetensors: u64 header length, then JSON
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            raise InvalidInput(f"the {label} file {path} is neither safetensors nor a torch state dict",
                               hint="save weights with safetensors.torch.save_file or torch.save(model.state_dict())")
    except InvalidInput:
        raise
    except pickle.UnpicklingError:
        raise InvalidInput(f"the {label} file {path} holds pickled objects other than a state dict of tensors",
                           hint="zoo loads weights with weights_only=True and never runs pickled code; "
                                "save `model.state_dict()` (or use safetensors), not the model object") from None
    except Exception as e:
        raise InvalidInput(f"cannot load the {label} file {path}: {type(e).__name__}: {str(e).splitlines()[0]}",
                           hint="it must be a plain state dict (tensors only); weights_only loading refuses code") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InvalidInput(f"the {label} file {path} does not hold a state dict of tensors")
    own = model.state_dict()
    for k in own:
        # files saved before batch norm counted its batches (torchvision's older ImageNet weights)
        # lack this buffer: torch fills it in for them too; it only matters for momentum=None
        if k.endswith(".num_batches_tracked") and k not in state:
            state[k] = torch.zeros((), dtype=torch.long)
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [f"{k} is {tuple(v.shape)} but the model has {tuple(own[k].shape)}"
                  for k, v in state.items() if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if missing or unexpected or mismatched:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else ""))
        if unexpected:
            parts.append(f"unexpected {', '.join(unexpected[:5])}" + (" ..." if len(unexpected) > 5 else ""))
        parts.extend(mismatched[:5])
        raise InvalidInput(f"the {label} do not fit the model: {'; '.join(parts)}",
                           hint="check model.arch / model.num_classes / the model's sizes / data.channels (or input_shape) "
                                "against the weights")
    model.load_state_dict(state, strict=True, assign=assign)
