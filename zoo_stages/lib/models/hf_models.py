"""Hugging Face `transformers` models for ``model.framework: transformers`` (train and export).

The recipe's ``model:`` section names the model in one of two ways (both may be given; the
inline ``config`` then overrides the folder's)::

    model:
      framework: transformers
      architecture: DistilBertForSequenceClassification   # any *For* (or *Model) class transformers exposes
      config: {dim: 64, n_layers: 2, n_heads: 2, hidden_dim: 256, max_position_embeddings: 32}
      num_classes: 8
    # or
      pretrained:
        path: models/my-bert          # a local folder: config.json + model.safetensors
        sha256: {config.json: <64 hex>, model.safetensors: <64 hex>}

- the architecture is validated when the recipe loads (`check_architecture`, with the closest
  name), reading transformers' lazy module listing: no torch is imported;
- ``config`` goes to the architecture's own config class; a key that class does not know is
  refused with the closest name. ``num_labels`` comes from ``model.num_classes`` (1 for a
  regression task; none for a ``*ForCausalLM``), ``vocab_size`` (when neither the config nor the
  folder sets it) from the data's tokenizer, so do a causal language model's ``bos_token_id``,
  ``eos_token_id`` and ``pad_token_id`` (the corpus's end-of-text token: what generation stops
  at), and attention is the ``eager`` implementation unless the config chooses
  (its exported graph is the one onnxruntime's transformer optimizer fuses);
- a pretrained folder holds only data: its files are pinned by sha256 (checked before they are
  read), weights come from ``model.safetensors`` alone (`from_pretrained(use_safetensors=True)`),
  ``trust_remote_code`` is never set and nothing is downloaded (``local_files_only``).

The module train and export get is a subclass of the architecture class (`build`), so its
state-dict keys are Hugging Face's own (a checkpoint loads into ``from_pretrained``'s model key
for key); its ``forward`` takes the model's inputs positionally in `model_inputs` order
(``input_ids``, ``attention_mask``, and ``token_type_ids`` when the architecture takes them and
the data makes them, ``data.token_type_ids: true``) and returns the output tensors
(`output_names`: ``logits`` for a classifier, ``last_hidden_state`` for a bare encoder), one
tensor when there is one. `reference_outputs` runs transformers' own forward, for parity gates.

transformers and torch are imported inside functions.
"""

from __future__ import annotations

import difflib
import inspect
import json
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import IntegrityError, InvalidInput

TEXT_EXTRA = "pip install 'zoo-onnx[transformers]'"
PRETRAINED_FILES = ("config.json", "model.safetensors")
# tokenizer files a folder may hold and the recipe may pin (a causal LM's generative build ships them)
PRETRAINED_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                              "chat_template.jinja")
# the inputs a text model may take, in the order the exported graph declares them
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# outputs that are not tensors of the model's result (or only with extra flags)
SKIPPED_OUTPUTS = ("loss", "past_key_values", "hidden_states", "attentions", "cross_attentions")
_CLASS_RE = re.compile(r"^[A-Z][A-Za-z0-9]*(For[A-Z][A-Za-z0-9]*|Model)$")
_NOT_MODELS = ("Auto", "TF", "Flax", "PreTrained", "Pretrained")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise InvalidInput("framework: transformers needs the transformers package, which is not installed",
                           hint=TEXT_EXTRA) from None
    return transformers


@lru_cache(maxsize=1)
def architectures() -> tuple[str, ...]:
    """The model classes transformers exposes (``*For*`` heads and bare ``*Model`` encoders), read
    from its lazy module listing: nothing of torch is imported."""
    return tuple(sorted(n for n in dir(_transformers())
                        if _CLASS_RE.match(n) and not n.startswith(_NOT_MODELS)))


def check_architecture(name: str) -> None:
    """ValueError (with the closest name) unless transformers exposes model class `name`."""
    known = architectures()
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    raise ValueError(f"transformers has no model class {name!r}" + (f" — did you mean {close[0]!r}?" if close else ""))


def architecture_name(section: Mapping[str, Any], recipe_dir: Path) -> str:
    """``model.architecture``, else the pretrained folder's ``config.json`` ``architectures[0]``."""
    if section.get("architecture"):
        return str(section["architecture"])
    names = (_folder_config(section, recipe_dir) or {}).get("architectures") or []
    if not names:
        raise InvalidInput("framework: transformers needs `model.architecture` (the pretrained folder's config.json "
                           "names none)", hint="e.g. architecture: BertForSequenceClassification")
    return str(names[0])


def architecture_class(name: str) -> type:
    """The transformers class `name` (importing torch); InvalidInput unless it is a model class."""
    try:
        check_architecture(name)
    except ValueError as e:
        raise InvalidInput(f"model.architecture: {e}") from None
    transformers = _transformers()
    cls = getattr(transformers, name)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise InvalidInput(f"model.architecture {name!r} is not a transformers model class",
                           hint="name a class such as BertForSequenceClassification or DistilBertModel")
    return cls


# ---------------------------------------------------------------------------------------------
# the pretrained folder


def pretrained_files(section: Mapping[str, Any], recipe_dir: Path) -> dict[str, Path]:
    """{file name: path} of ``model.pretrained``'s folder ({} without one): config.json,
    model.safetensors and the tokenizer files the recipe pins; each file must exist."""
    ref = section.get("pretrained") or {}
    if not ref:
        return {}
    folder = Path(ref["path"]).expanduser()
    folder = (folder if folder.is_absolute() else Path(recipe_dir) / folder).resolve()
    out = {}
    for name in PRETRAINED_FILES:
        path = folder / name
        if not path.is_file():
            raise InvalidInput(f"model.pretrained.path {ref['path']!r} has no {name}",
                               hint="save the model with save_pretrained(DIR, safe_serialization=True); "
                                    f"the folder needs {' and '.join(PRETRAINED_FILES)}")
        out[name] = path
    for name in PRETRAINED_TOKENIZER_FILES:
        if name in (ref.get("sha256") or {}):
            if not (folder / name).is_file():
                raise InvalidInput(f"model.pretrained.sha256 pins {name}, which {ref['path']!r} does not hold",
                                   hint=f"remove the pin of {name}, or put the file in the folder")
            out[name] = folder / name
    return out


def verified_folder(section: Mapping[str, Any], recipe_dir: Path) -> Path:
    """The pretrained folder, each of its files checked against the sha256 the recipe pins."""
    from zoo.files import sha256_file

    files = pretrained_files(section, recipe_dir)
    pins = section["pretrained"]["sha256"]
    for name, path in files.items():
        digest = sha256_file(path)
        if digest != pins[name]:
            raise IntegrityError(f"model.pretrained: {name} has sha256 {digest}, the recipe pins {pins[name]}",
                                 hint="the folder changed since the recipe pinned it; check it and update "
                                      "`model.pretrained.sha256`")
    return next(iter(files.values())).parent


def _folder_config(section: Mapping[str, Any], recipe_dir: Path) -> dict[str, Any] | None:
    files = pretrained_files(section, recipe_dir)
    if not files:
        return None
    try:
        return json.loads(files["config.json"].read_text())
    except (OSError, ValueError) as e:
        raise InvalidInput(f"model.pretrained: config.json is not readable JSON: {e}") from None


# ---------------------------------------------------------------------------------------------
# config, inputs, outputs


def is_causal_lm(name: str | None) -> bool:
    """Whether transformers' class `name` is a causal language model (``*ForCausalLM``)."""
    return bool(name) and str(name).endswith("ForCausalLM")


def config_for(section: Mapping[str, Any], recipe_dir: Path, *, num_labels: int, vocab_size: int | None,
               token_ids: Mapping[str, int] | None = None) -> Any:
    """The architecture's config: the pretrained folder's config.json (if any), then the recipe's
    ``config`` entries, ``num_labels`` (not for a causal language model), the data's ``vocab_size``
    and `token_ids` (``bos_token_id``…) where neither sets them, eager attention."""
    name = architecture_name(section, recipe_dir)
    cls = architecture_class(name)
    config_cls = cls.config_class
    values: dict[str, Any] = dict(_folder_config(section, recipe_dir) or {})
    own = dict(section.get("config") or {})
    known = _config_keys(config_cls)
    for key in own:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            raise InvalidInput(f"model.config.{key}: {config_cls.__name__} has no setting {key!r}"
                               + (f" — did you mean {close[0]!r}?" if close else ""),
                               hint=f"settings of {config_cls.__name__}: see its documentation")
    values.update(own)
    if not is_causal_lm(name):  # a language model's head is the vocabulary
        values["num_labels"] = int(num_labels)
    for key, token_id in (token_ids or {}).items():
        values.setdefault(key, int(token_id))
    values.pop("id2label", None)  # num_labels decides the labels; a folder's map of another size would clash
    values.pop("label2id", None)
    if "vocab_size" not in values and vocab_size:
        values["vocab_size"] = int(vocab_size)
    values.setdefault("attn_implementation", values.pop("_attn_implementation", None) or "eager")
    values.pop("architectures", None)
    values.pop("transformers_version", None)
    values.pop("model_type", None)
    return config_cls(**values)


def _config_keys(config_cls: type) -> set[str]:
    """The settings a config class takes: its own __init__'s and every PretrainedConfig's, and
    the names its attribute_map translates."""
    keys: set[str] = set()
    for klass in config_cls.__mro__:
        if "__init__" in vars(klass):
            keys.update(p for p in inspect.signature(klass.__init__).parameters if p not in ("self", "kwargs"))
        keys.update(getattr(klass, "attribute_map", {}) or {})
    defaults = config_cls()
    keys.update(k for k in defaults.to_dict() if not k.startswith("_"))
    return keys


def takes(cls: type) -> tuple[str, ...]:
    """The text inputs the architecture's forward takes, in `TEXT_INPUTS` order."""
    params = inspect.signature(cls.forward).parameters
    return tuple(name for name in TEXT_INPUTS if name in params)


def model_inputs(section: Mapping[str, Any], data: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(name, holds) of the model's inputs in forward order: input_ids (token ids), attention_mask
    (mask) and token_type_ids (segment ids) where the architecture takes them and, for
    token_type_ids, the data makes them (``data.token_type_ids: true``)."""
    name = section.get("architecture")
    if name:
        accepted = takes(architecture_class(str(name)))
    else:  # from a pretrained folder: its config names the class (read without importing torch first)
        accepted = TEXT_INPUTS
    holds = {"input_ids": "token_ids", "attention_mask": "mask", "token_type_ids": "segments"}
    out = [(n, holds[n]) for n in accepted if n != "token_type_ids" or (data or {}).get("token_type_ids")]
    if not out or out[0][0] != "input_ids":
        raise InvalidInput(f"model.architecture {name!r} takes no input_ids",
                           hint="framework: transformers exports text models (token ids in)")
    return out


def output_names(model: Any, feeds: Mapping[str, Any]) -> list[str]:
    """The names of the tensors transformers' forward returns on `feeds` (torch tensors), in order."""
    import torch

    with torch.no_grad():
        out = reference_forward(model, feeds)
    return [k for k, v in out.items() if k not in SKIPPED_OUTPUTS and isinstance(v, torch.Tensor)]


def reference_forward(model: Any, feeds: Mapping[str, Any]) -> Any:
    """transformers' own forward of the architecture (not zoo's positional one), as a ModelOutput."""
    own = type(model).__mro__[1]  # the architecture class `build` subclassed
    kwargs = {"return_dict": True}
    if "use_cache" in inspect.signature(own.forward).parameters:
        kwargs["use_cache"] = False
    return own.forward(model, **feeds, **kwargs)


def reference_outputs(model: Any, feeds: Mapping[str, Any], names: list[str]) -> dict[str, Any]:
    """{output name: numpy array} of transformers' own forward on `feeds` (numpy int64 arrays)."""
    import torch

    with torch.no_grad():
        out = reference_forward(model, {k: torch.from_numpy(v) for k, v in feeds.items()})
    return {name: out[name].numpy() for name in names}


# ---------------------------------------------------------------------------------------------
# building


def build(section: Mapping[str, Any], recipe_dir: Path, *, num_labels: int, vocab_size: int | None,
          pretrained_weights: bool = True, token_ids: Mapping[str, int] | None = None) -> Any:
    """The model of the section as zoo calls it (see the module docstring): with the pretrained
    folder's weights when there is one and `pretrained_weights`, else freshly initialised (train
    seeds it; export then loads a checkpoint into it)."""
    arch = architecture_class(architecture_name(section, recipe_dir))
    config = config_for(section, recipe_dir, num_labels=num_labels, vocab_size=vocab_size, token_ids=token_ids)
    cls = _positional(arch, takes(arch))
    if pretrained_weights and section.get("pretrained"):
        folder = verified_folder(section, recipe_dir)
        return cls.from_pretrained(str(folder), config=config, use_safetensors=True, trust_remote_code=False,
                                   local_files_only=True, ignore_mismatched_sizes=True)
    return cls(config)


@lru_cache(maxsize=None)
def _positional(arch: type, accepted: tuple[str, ...]) -> type:
    """A subclass of `arch` whose forward takes the inputs positionally (those the caller passes,
    in `accepted` order) and returns the output tensors: what train calls and export traces."""

    def forward(self, *inputs):
        names = [n for n in accepted if n != "token_type_ids" or len(inputs) == len(accepted)]
        out = reference_forward(self, dict(zip(names, inputs)))
        tensors = tuple(v for k, v in out.items() if k not in SKIPPED_OUTPUTS)
        return tensors[0] if len(tensors) == 1 else tensors

    return type(arch.__name__, (arch,), {"forward": forward, "__module__": __name__, "__qualname__": arch.__name__})


def folder_digest(section: Mapping[str, Any]) -> dict[str, str]:
    """The pinned digests of the pretrained folder's files (for metrics and provenance)."""
    return dict((section.get("pretrained") or {}).get("sha256") or {})


def with_pretrained_sources(props: Mapping[str, str], digests: Mapping[str, str]) -> dict[str, str]:
    """`props` with the pretrained folder's files in ``zoo.sources``."""
    from zoo_stages.lib.release import provenance

    key = provenance.PREFIX + "sources"
    sources = json.loads(props.get(key) or "{}")
    sources.update({f"pretrained/{name}": f"sha256:{digest}" for name, digest in digests.items()})
    return {**props, key: provenance.canonical(dict(sorted(sources.items())))}
