"""The recipe's dataset as named arrays matching a model's inputs, with a fixed train/held-out split.

Shared by train (fit), quantize (calibration) and verify (metrics), so all three see exactly
the same samples, transformed the same way, in the same order. torch is never imported here;
pyarrow (Parquet) and tokenizers (text) only when a recipe uses them.

Sources (the recipe's ``data:`` section, see `zoo_stages.sections.data.DataSpec`; the parts live in
`zoo_stages.lib.data`):

- ``digits``: scikit-learn's bundled ``load_digits()`` (1797 real 8x8 images, values 0..16);
- ``folder``: one subfolder per class, class index = position of the subfolder name in sorted
  order. Binary PGM/PPM (P5/P6) are read with numpy; PNG, JPEG, BMP, GIF, TIFF and WebP need
  Pillow. Hidden files and files with other extensions are ignored;
- ``npz``: one array per model input plus the label array (`data.npz`); ``x``/``y`` image
  archives keep working (``x`` is the ``image`` feature);
- ``csv`` / ``parquet`` / ``jsonl``: tables (`data.tables`): numeric columns become float32
  features, optionally standardised with train-split statistics; or, with ``text:``, a text
  column tokenized to ``input_ids`` and ``attention_mask`` (`data.text`);
- ``text``: a corpus of documents for a causal language model (`data.corpus`): a .jsonl or .txt
  file, split by document, tokenized by a byte-level BPE learnt from the train split (or a
  tokenizer.json), given as ``input_ids`` int64 [blocks, ``block_size``] with no labels;
- ``dvc``: a file or folder tracked in a DVC repo at a full commit sha (``repo``, ``rev``,
  ``path``), read as ``format`` says (one of the formats above; default by the path's suffix):
  `data.dvc` pins DVC's digest for keys with git alone and downloads the bytes with dvc.

Image sources give one feature, ``image`` (float32), transformed as ``data.image`` says:
scale, channels, resize to [H, W], mean/std, layout (`data.images`; the old ``image_size`` /
``channels`` still work).

Labels (`Split.labels`): int64 class indices for classification data (integer labels as they
are, string labels by sorted name), float32 values for regression data (float labels), None
for data without labels (``label: null``). The split is `data.split`'s sha256 shuffle,
stratified for classes.

What you get: `load_split` (a `Split` of named feature arrays, samples along axis 0);
`split_info` (the split's record); `preprocessing` (what a user must do to an input before
feeding the model: written into the card and manifest); `data_dependencies` (files whose
content enters cache keys); `class_names`; `vocab_size` and `tokenizer_json` for text;
`feature_specs` (per-sample shape and dtype of each feature); `has_tokenizer`, and for a corpus
`documents` (a split's texts) and `tokenizer_files` (tokenizer.json, tokenizer_config.json and
special_tokens_map.json). Stages bind features to a
model's inputs by name (`zoo_stages.lib.runtimes.onnx_run.bind`).

Results are cached in-process (keyed by the section, the resolved files and their sizes and
mtimes), and the returned arrays are read-only: copy them before modifying.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import InvalidInput
from zoo_stages.lib.data.errors import DataError
from zoo_stages.lib.data import corpus, dvc, images, npz, split as splitting, tables, text
from zoo_stages.lib.data.images import IMAGE_FEATURE, resize_bilinear
from zoo_stages.lib.data.loaded import Loaded

if TYPE_CHECKING:
    import numpy as np

__all__ = ["IMAGE_FEATURE", "PREPROCESSING_SCHEMA_VERSION", "Split", "class_names", "clear_cache",
           "data_dependencies", "documents", "feature_specs", "has_tokenizer", "load_split", "preprocessing", "resize_bilinear",
           "split_info", "tokenizer_files", "tokenizer_json", "vocab_size"]

PREPROCESSING_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Split:
    """One split of the recipe's dataset: named feature arrays and their labels.

    Every feature array holds the samples along axis 0, in the same order as ``labels``
    (None for data without labels). The arrays are read-only (cached): copy before modifying.
    """

    features: Mapping[str, "np.ndarray"]
    labels: "np.ndarray | None"

    def __len__(self) -> int:
        first = next(iter(self.features.values()), None)
        return 0 if first is None else int(first.shape[0])

    def take(self, indices: Any) -> "Split":
        """The samples at `indices` (an index array or a slice), in that order."""
        return Split({k: v[indices] for k, v in self.features.items()},
                     None if self.labels is None else self.labels[indices])

    def head(self, n: int | None) -> "Split":
        """The first `n` samples (all of them when `n` is None)."""
        return self if n is None else self.take(slice(0, n))

    def single(self, where: str) -> "np.ndarray":
        """The only feature array; InvalidInput naming `where` when the data has several."""
        if len(self.features) != 1:
            raise InvalidInput(f"{where} takes one input array, but the data has {len(self.features)} "
                               f"({', '.join(self.features)})")
        return next(iter(self.features.values()))


# ---------------------------------------------------------------------------------------------
# public API


def load_split(data: dict, recipe_dir: Path, split: str) -> Split:
    """One split ("train" or "val") of the recipe's dataset (see the module docstring).

    The arrays are read-only and cached, so repeated calls are cheap.
    """
    if split not in ("train", "val"):
        raise InvalidInput(f"unknown dataset split {split!r}", hint="use 'train' or 'val'")
    return _split(_key(data, recipe_dir), split)


def split_info(data: dict, recipe_dir: Path) -> dict:
    """A JSON-able record of the split: source, sizes, seed, label kind, digests of the index lists
    (and for ``dvc`` data, the commit and DVC's digest of the bytes)."""
    key = _key(data, recipe_dir)
    spec = json.loads(key)["spec"]
    loaded = _loaded(key)
    train_idx, val_idx = _indices(key)
    info: dict[str, Any] = {
        "source": spec["source"],
        "path": spec["path"],
        "num_samples": int(len(train_idx) + len(val_idx)),
        "num_available": len(loaded),
        "num_train": int(len(train_idx)),
        "num_val": int(len(val_idx)),
        "labels": loaded.label_kind,
        "num_classes": loaded.num_classes,
        "val_fraction": spec["val_fraction"],
        "split_seed": spec["split_seed"],
        "limit": spec["limit"],
        "method": "sha256-shuffle+stratified" if loaded.label_kind == "classes" else "sha256-shuffle",
        "train_indices_sha256": splitting.digest_indices(train_idx),
        "val_indices_sha256": splitting.digest_indices(val_idx),
    }
    if _modality(spec) in ("image", "npz") and IMAGE_FEATURE in loaded.samples:
        record = images.image_record(images.ImageTransform.of(spec), loaded, _split(key, "train").features[IMAGE_FEATURE])
        info["image"] = {k: record[k] for k in ("size", "channels", "layout")}
        if record["size"][0] == record["size"][1]:
            info["image_size"] = record["size"][0]  # the model card's square spelling
            info["channels"] = record["channels"]
    if loaded.class_names is not None:
        info["classes"] = list(loaded.class_names)
    if _modality(spec) == "corpus":  # the samples split are documents; the stages get blocks of them
        info["unit"] = "documents"
        info["block_size"] = spec["block_size"]
        info["num_train_blocks"] = len(_split(key, "train"))
        info["num_val_blocks"] = len(_split(key, "val"))
        info["corpus_sha256"] = loaded.facts["sha256"]
    if spec["source"] == "dvc":  # which bytes: the commit and the digest DVC recorded there
        out = _dvc_out(key)
        info["dvc"] = {"rev": out.commit, "md5": out.md5, "format": spec["format"]}
    return info


def preprocessing(data: dict, recipe_dir: Path) -> dict:
    """What a user must do to an input before feeding the model (JSON-able, deterministic).

    Images: size, resize method, channels, scale, mean/std, layout; tables: the columns of
    each feature in order and their normalisation; text: the tokenizer (sha256 of its JSON,
    kind, vocab size, lowercase), max_length, padding and truncation. Plus the labels (kind
    and class names), so outputs can be read back.
    """
    key = _key(data, recipe_dir)
    spec = json.loads(key)["spec"]
    loaded = _loaded(key)
    modality = _modality(spec)
    record: dict[str, Any] = {"schema_version": PREPROCESSING_SCHEMA_VERSION, "source": spec["source"],
                              "modality": "image" if modality == "npz" and IMAGE_FEATURE in loaded.samples
                              else "arrays" if modality == "npz" else modality}
    if modality in ("image", "npz") and IMAGE_FEATURE in loaded.samples:
        record["image"] = images.image_record(images.ImageTransform.of(spec), loaded,
                                              _split(key, "train").features[IMAGE_FEATURE])
    if modality == "npz":
        arrays = {name: fact for name, fact in loaded.facts["arrays"].items() if name != IMAGE_FEATURE}
        if arrays:
            record["arrays"] = {name: {**fact, "transform": "none (fed as stored)"} for name, fact in arrays.items()}
    elif modality == "table":
        record["table"] = tables.table_record(spec, loaded, _fitted(key).get("stats", {}))
    elif modality == "text":
        record["text"] = text.text_record(spec, _fitted(key)["tokenizer_json"],
                                          list(_split(key, "train").features))
    elif modality == "corpus":
        record["corpus"] = corpus.corpus_record(spec, _fitted(key)["tokenizer_json"], loaded)
    record["labels"] = {"kind": loaded.label_kind, "source": spec.get("label"),
                        **({"classes": class_names(data, recipe_dir)} if loaded.label_kind == "classes" else {})}
    return record


def data_dependencies(data: dict, recipe_dir: Path) -> list[Path]:
    """Files or folders whose content must enter cache keys (the data, the tokenizer; [] for digits).

    Only the file fields are read: the section was validated when the recipe loaded, and keys
    need nothing else (the rest of the section enters them as it is).
    """
    if not isinstance(data, dict) or not data.get("source"):
        raise DataError("this stage needs the recipe's `data:` section",
                        hint="add e.g. `data: {source: digits, image_size: 8}` to the recipe")
    if data["source"] != "digits" and not data.get("path"):
        raise DataError(f"data.path is required when data.source is {data['source']!r}",
                        hint="set `data.path:` to the folder or file, relative to the recipe")
    return [p for _, p in _files(data, Path(recipe_dir))]


def class_names(data: dict, recipe_dir: Path) -> list[str]:
    """Class names: folder names, string labels, else "0", "1", ...; [] for regression or label-less data."""
    loaded = _loaded(_key(data, recipe_dir))
    if loaded.label_kind != "classes":
        return []
    if loaded.class_names is not None:
        return list(loaded.class_names)
    return [str(i) for i in range(loaded.num_classes)]


def vocab_size(data: dict, recipe_dir: Path) -> int:
    """The text tokenizer's vocabulary size (the embedding rows a model needs)."""
    return text.vocab_size(tokenizer_json(data, recipe_dir))


def has_tokenizer(data: Mapping[str, Any] | None) -> bool:
    """Whether the `data:` section's features are token ids (a text column, or a corpus)."""
    return bool(data) and (data.get("text") is not None or data.get("source") == "text")


def tokenizer_json(data: dict, recipe_dir: Path) -> str:
    """The exact tokenizer JSON the text features were made with (padding and truncation set for a
    text column; none for a corpus): ship it with the model so users tokenize the same way."""
    key = _key(data, recipe_dir)
    if _modality(json.loads(key)["spec"]) not in ("text", "corpus"):
        raise DataError("the recipe's data has no text (no `data.text:`), so no tokenizer",
                        hint="set `data.text: COLUMN` and `data.tokenizer:`")
    return _fitted(key)["tokenizer_json"]


def documents(data: dict, recipe_dir: Path, split: str) -> list[str]:
    """A corpus's documents of one split ("train" or "val"), in the split's order: the texts the
    blocks were made of (prompts for a generator are taken from the held-out ones)."""
    if split not in ("train", "val"):
        raise InvalidInput(f"unknown dataset split {split!r}", hint="use 'train' or 'val'")
    key = _key(data, recipe_dir)
    if _modality(json.loads(key)["spec"]) != "corpus":
        raise DataError("data.source: only a corpus (`source: text`) has documents",
                        hint="give `data: {source: text, path: CORPUS.jsonl, ...}`")
    train_idx, val_idx = _indices(key)
    texts = _loaded(key).samples["text"]
    return [str(texts[int(i)]) for i in (train_idx if split == "train" else val_idx)]


def tokenizer_files(data: dict, recipe_dir: Path) -> dict[str, str]:
    """{file name: text} for a corpus (``source: text``): tokenizer.json, tokenizer_config.json and
    special_tokens_map.json, as transformers saves a fast tokenizer (`data.corpus.tokenizer_files`;
    no chat template: a base language model has none)."""
    key = _key(data, recipe_dir)
    spec = json.loads(key)["spec"]
    if _modality(spec) != "corpus":
        raise DataError("data.source: only a corpus (`source: text`) has a generator's tokenizer files",
                        hint="a text column's tokenizer is `tokenizer_json`")
    return corpus.tokenizer_files(_fitted(key)["tokenizer_json"], spec["block_size"])


def feature_specs(data: dict, recipe_dir: Path) -> dict[str, dict[str, Any]]:
    """Per-sample shape and dtype of each feature, in order: {name: {"shape": [...], "dtype": "float32"}}."""
    train = _split(_key(data, recipe_dir), "train")
    return {name: {"shape": [int(d) for d in v.shape[1:]], "dtype": str(v.dtype)} for name, v in train.features.items()}


def clear_cache() -> None:
    """Forget every cached dataset (tests; long-lived processes after data changed on disk)."""
    for cached in (_loaded, _indices, _fitted, _split):
        cached.cache_clear()


# ---------------------------------------------------------------------------------------------
# validation and caching


def _spec(data: Any) -> dict:
    """The `data:` section with defaults filled in, validated with the recipe's own model."""
    if not isinstance(data, dict) or not data:
        raise DataError("this stage needs the recipe's `data:` section",
                        hint="add e.g. `data: {source: digits, image_size: 8}` to the recipe")
    from pydantic import ValidationError

    from zoo_stages.sections.data import DataSpec

    try:
        spec = DataSpec.model_validate(data).model_dump(mode="json")
    except ValidationError as e:
        first = sorted(e.errors(), key=lambda err: err["type"] != "extra_forbidden")[0]
        where = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        raise DataError(f"data.{where}: {msg}" if where else msg,
                        hint="see `zoo schema` for the `data:` fields") from None
    if spec["source"] != "digits" and not spec["path"]:
        raise DataError(f"data.path is required when data.source is {spec['source']!r}",
                        hint="set `data.path:` to the folder or file, relative to the recipe")
    return spec


def _format(spec: dict) -> str:
    """How the data is read: the source, or for ``dvc`` the format of the tracked path (filled in by DataSpec)."""
    return spec["format"] if spec["source"] == "dvc" else spec["source"]


def _modality(spec: dict) -> str:
    if spec["source"] == "text":
        return "corpus"
    if spec.get("text") is not None:
        return "text"
    if _format(spec) in ("csv", "parquet", "jsonl"):
        return "table"
    return "npz" if _format(spec) == "npz" else "image"


def _files(spec: dict, recipe_dir: Path) -> list[tuple[str, Path]]:
    """(field, resolved path) of every file or folder the section reads; for ``dvc``, the pin file
    that stands for the tracked path's bytes (`data.dvc.pin_file`)."""
    out = []
    if spec["source"] == "dvc":
        out.append(("data.path", dvc.pin_file(dvc.pin(spec, recipe_dir))))
    elif spec["source"] != "digits":
        out.append(("data.path", _resolve(spec["path"], recipe_dir, "data.path", want_dir=spec["source"] == "folder")))
    tokenizer = spec.get("tokenizer") or {}
    if tokenizer.get("path"):
        out.append(("data.tokenizer.path", _resolve(tokenizer["path"], recipe_dir, "data.tokenizer.path", False)))
    return out


def _resolve(given: str, recipe_dir: Path, field: str, want_dir: bool) -> Path:
    p = Path(given).expanduser()
    if not p.is_absolute():
        p = recipe_dir / p
    p = p.resolve()
    if want_dir and not p.is_dir():
        raise DataError(f"{field} {given!r} is not a folder ({p})",
                        hint="data.source: folder needs a folder with one subfolder per class")
    if not want_dir and not p.is_file():
        raise DataError(f"{field} {given!r} is not a file ({p})", hint="paths are relative to the recipe")
    return p


def _key(data: Any, recipe_dir: Path) -> str:
    """A string naming the section, the resolved files and their on-disk state (size, mtime)."""
    spec = _spec(data)
    state: list[Any] = [["dvc", dvc.pin(spec, Path(recipe_dir)).to_json()]] if spec["source"] == "dvc" else []
    for field, p in _files(spec, Path(recipe_dir)):
        entry: list[Any] = [field, str(p)]
        if p.is_file():
            st = p.stat()
            entry += [st.st_size, st.st_mtime_ns]
        else:
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames.sort()
                for name in sorted(filenames):
                    st = os.stat(os.path.join(dirpath, name))
                    entry.append([os.path.relpath(os.path.join(dirpath, name), p), st.st_size, st.st_mtime_ns])
        state.append(entry)
    return json.dumps({"spec": spec, "state": state}, sort_keys=True)


def _paths(key: str) -> dict[str, Path]:
    return {entry[0]: Path(entry[1]) for entry in json.loads(key)["state"] if entry[0] != "dvc"}


def _dvc_out(key: str) -> dvc.DvcOut:
    [record] = [entry[1] for entry in json.loads(key)["state"] if entry[0] == "dvc"]
    record.pop("schema_version")
    return dvc.DvcOut(**record)


@lru_cache(maxsize=4)
def _loaded(key: str) -> Loaded:
    spec = json.loads(key)["spec"]
    source = spec["source"]
    transform = images.ImageTransform.of(spec)
    if source == "digits":
        return images.load_digits(transform)
    path = _paths(key)["data.path"]
    if source == "dvc":  # the bytes DVC tracks, read as the format they are in
        path, spec, source = dvc.fetch(_dvc_out(key)), {**spec, "source": spec["format"]}, spec["format"]
    if source == "folder":
        return images.load_folder(path, spec["path"], transform)
    if source == "npz":
        return npz.load_npz(path, spec, transform)
    if source == "text":
        return corpus.load_documents(path, spec["path"], spec.get("text"))
    return tables.load_table(path, spec)


@lru_cache(maxsize=8)
def _indices(key: str) -> tuple["np.ndarray", "np.ndarray"]:
    spec = json.loads(key)["spec"]
    loaded = _loaded(key)
    classes = loaded.labels if loaded.label_kind == "classes" else None
    return splitting.split_indices(len(loaded), classes, spec["val_fraction"], spec["split_seed"], spec["limit"])


@lru_cache(maxsize=8)
def _fitted(key: str) -> dict[str, Any]:
    """What is learnt from the train split: normalisation statistics, the trained tokenizer."""
    spec = json.loads(key)["spec"]
    loaded = _loaded(key)
    train_idx, _ = _indices(key)
    modality = _modality(spec)
    if modality == "table" and spec.get("normalize") == "standard":
        stats = {}
        for name in loaded.facts["features"]:
            mean, std = tables.standard_stats(loaded.samples[name][train_idx])
            stats[name] = ([float(m) for m in mean], [float(s) for s in std])
        return {"stats": stats}
    if modality == "text":
        tokenizer_spec = spec["tokenizer"]
        if tokenizer_spec.get("path"):
            tokenizer = text.load_tokenizer(_paths(key)["data.tokenizer.path"], tokenizer_spec["path"])
        else:
            train = tokenizer_spec["train"]
            tokenizer = text.train_wordpiece([str(t) for t in loaded.samples["text"][train_idx]],
                                             vocab_size=train["vocab_size"], lowercase=train["lowercase"],
                                             min_frequency=train["min_frequency"])
        return {"tokenizer_json": text.configured(tokenizer, spec["max_length"], "data.tokenizer")}
    if modality == "corpus":  # learnt from the train split's documents only: the held-out ones stay unseen
        tokenizer_spec = spec["tokenizer"]
        if tokenizer_spec.get("path"):
            tokenizer = text.load_tokenizer(_paths(key)["data.tokenizer.path"], tokenizer_spec["path"])
        else:
            train = tokenizer_spec["train"]
            tokenizer = corpus.train_bpe([str(t) for t in loaded.samples["text"][train_idx]],
                                         vocab_size=train["vocab_size"], min_frequency=train["min_frequency"],
                                         lowercase=train["lowercase"])
        tokenizer_json = corpus.plain(tokenizer)
        corpus.end_of_text(tokenizer_json, "data.tokenizer")
        return {"tokenizer_json": tokenizer_json}
    return {}


@lru_cache(maxsize=8)
def _split(key: str, split: str) -> Split:
    import numpy as np

    spec = json.loads(key)["spec"]
    loaded = _loaded(key)
    train_idx, val_idx = _indices(key)
    idx = train_idx if split == "train" else val_idx
    modality = _modality(spec)
    if modality == "corpus":
        features = {"input_ids": corpus.blocks(_fitted(key)["tokenizer_json"],
                                               [str(t) for t in loaded.samples["text"][idx]], spec["block_size"])}
        if not len(features["input_ids"]):
            raise DataError(f"data.block_size: the {split} split's documents make fewer than {spec['block_size']} "
                            "tokens, not one block", hint="lower data.block_size, or give more text")
    elif modality == "text":
        features = text.encode(_fitted(key)["tokenizer_json"], [str(t) for t in loaded.samples["text"][idx]],
                               bool(spec.get("token_type_ids")))
    elif modality == "table":
        stats = _fitted(key).get("stats", {})
        features = {}
        for name, values in loaded.samples.items():
            x = values[idx]
            if name in stats:
                x = tables.standardized(x, np.asarray(stats[name][0]), np.asarray(stats[name][1]))
            features[name] = np.ascontiguousarray(x, dtype=np.float32)
    else:
        features = {name: np.ascontiguousarray(values[idx]) for name, values in loaded.samples.items()}
        if IMAGE_FEATURE in features:
            # after `limit` and the split: only the images used pay for the resize
            features[IMAGE_FEATURE] = images.transform_images(features[IMAGE_FEATURE], images.ImageTransform.of(spec),
                                                              where="data.image")
    labels = None if loaded.labels is None else np.ascontiguousarray(loaded.labels[idx])
    for array in list(features.values()) + ([labels] if labels is not None else []):
        array.setflags(write=False)
    return Split(features, labels)
