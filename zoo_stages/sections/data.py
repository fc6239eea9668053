"""The recipe's `data:` section: the dataset train fits, quantize calibrates on and verify measures.

`DataSpec` is the section's schema (one model for every source; a field given for a source it does
not apply to is an error naming the sources it applies to); `DataSection.check` refuses what the
value alone cannot tell: a path that names no file or folder beside the recipe, and for
``source: dvc`` a commit or path DVC does not track (read with git alone, `zoo.dvcrepo`). Read as
arrays by `zoo_stages.lib.data.datasets`.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from zoo.section import RecipeSection, SectionError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


IMAGE_SOURCES = ("digits", "folder", "npz")
TABLE_SOURCES = ("csv", "parquet", "jsonl")
TEXT_SOURCES = ("text",)  # a corpus of documents for a causal language model
# which sources each optional `data:` field applies to (giving it for another source is an error)
_DATA_FIELD_SOURCES: dict[str, tuple[str, ...]] = {
    "image": IMAGE_SOURCES, "image_size": IMAGE_SOURCES, "channels": IMAGE_SOURCES,
    "inputs": ("npz",) + TABLE_SOURCES, "input": TABLE_SOURCES, "columns": TABLE_SOURCES,
    "normalize": TABLE_SOURCES, "label": ("npz",) + TABLE_SOURCES,
    "text": TABLE_SOURCES + TEXT_SOURCES, "tokenizer": TABLE_SOURCES + TEXT_SOURCES, "max_length": TABLE_SOURCES,
    "token_type_ids": TABLE_SOURCES, "block_size": TEXT_SOURCES,
    "repo": ("dvc",), "rev": ("dvc",), "format": ("dvc",),
}
# data.source: dvc reads a file or folder in one of these formats, named by `format:` or by the path's suffix
DVC_FORMATS = ("folder", "npz", "csv", "parquet", "jsonl")
_DVC_SUFFIXES = {".npz": "npz", ".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl",
                 ".ndjson": "jsonl", "": "folder"}
_TEXT_ONLY = ("tokenizer", "max_length", "token_type_ids")  # need `text:`
_NUMERIC_ONLY = ("inputs", "input", "columns", "normalize")  # tables of numbers, not with `text:`
_DEFAULT_LABEL = {"npz": "y", "csv": "label", "parquet": "label", "jsonl": "label"}
DEFAULT_MAX_LENGTH = 128
DEFAULT_BLOCK_SIZE = 128
# source: text reads documents from one of these files (by the path's suffix)
TEXT_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt"}
DEFAULT_TEXT_KEY = "text"
# fields added after lockfiles recorded the whole `data:` section: left out of its plain value while
# unset, so the records of recipes that do not use them stay as they were
_OMITTED_WHEN_UNSET = ("block_size",)


def data_format(source: str | None, fmt: str | None, path: str | None) -> str | None:
    """The format a `data:` section reads: its source, or for ``dvc`` its `format:` or the path's suffix
    (a path without one is a folder); None when that cannot be told."""
    if source != "dvc":
        return source
    if fmt is not None:
        return fmt
    return _DVC_SUFFIXES.get(PurePosixPath(path).suffix.lower()) if path else None


class ImageSpec(_Strict):
    """How image samples become model inputs: resize, channels, scale, mean/std, layout (in that order)."""

    size: list[int] | None = Field(None, min_length=2, max_length=2,
                                   description="[height, width] to resize to (bilinear); default: the images' own "
                                               "size (images of different sizes then need it)")
    channels: int | None = Field(None, ge=1, le=4, description="1 (grey), 3 (RGB) or 4 (RGBA); grey is replicated, "
                                                               "colour becomes luma for 1; default: the images' own")
    scale: float | None = Field(None, gt=0, description="multiply pixel values by this; default by type: uint8 "
                                                        "1/255, uint16 1/65535, digits 1/16, float 1 (must then lie "
                                                        "in [0, 1])")
    mean: list[float] | None = Field(None, min_length=1, description="subtracted per channel after scaling "
                                                                     "(one value, or one per channel)")
    std: list[float] | None = Field(None, min_length=1, description="divided per channel after the mean "
                                                                    "(one value, or one per channel)")
    layout: Literal["NCHW", "NHWC"] = Field("NCHW", description="axis order of the `image` feature")

    @field_validator("size")
    @classmethod
    def _size(cls, v):
        if v is not None and any(d < 1 or d > 8192 for d in v):
            raise ValueError("size is [height, width], each 1..8192")
        return v

    @field_validator("std")
    @classmethod
    def _std(cls, v):
        if v is not None and any(s <= 0 for s in v):
            raise ValueError("std values must be positive")
        return v

    @model_validator(mode="after")
    def _per_channel(self):
        for name in ("mean", "std"):
            values = getattr(self, name)
            if values is not None and self.channels is not None and len(values) not in (1, self.channels):
                raise ValueError(f"{name} has {len(values)} values; give 1 or one per channel ({self.channels})")
        return self


class TokenizerTrainSpec(_Strict):
    """A tokenizer trained deterministically on the train split's texts."""

    model: Literal["wordpiece", "bpe"] = Field(
        "wordpiece", description="wordpiece: BERT-style ([PAD] [UNK] [CLS] [SEP] [MASK]), for text columns (the "
                                 "default there); bpe: byte-level BPE with one special token, <|endoftext|> (id 0), "
                                 "for source: text (the default there)")
    vocab_size: int = Field(2000, ge=16, le=1_000_000, description="entries of the vocabulary, special tokens "
                                                                   "included (bpe: at least 257, the 256 bytes and "
                                                                   "<|endoftext|>)")
    lowercase: bool = Field(True, description="lowercase texts first (default: true for wordpiece, false for bpe)")
    min_frequency: int = Field(2, ge=1, description="rarer pieces are not learnt")


class TokenizerSpec(_Strict):
    """Where the text tokenizer comes from: a Hugging Face tokenizer.json, or trained from the data."""

    path: str | None = Field(None, description="a Hugging Face `tokenizers` tokenizer.json, relative to the recipe")
    train: TokenizerTrainSpec | None = Field(None, description="train one on the train split's texts instead")

    @model_validator(mode="after")
    def _one(self):
        if (self.path is None) == (self.train is None):
            raise ValueError("give exactly one of tokenizer.path and tokenizer.train")
        return self


class DataSpec(_Strict):
    """The recipe's dataset, shared by train (fit), quantize (calibration) and verify (accuracy).

    One model for every source; a field given for a source it does not apply to is an error
    naming the sources it applies to (checked per field, so the error points at its line).
    """

    source: Literal["digits", "folder", "npz", "csv", "parquet", "jsonl", "dvc", "text"] = Field(
        description="digits: scikit-learn's bundled 8x8 digits; folder: one subfolder per class; npz: named arrays "
                    "(x, y for images); csv / parquet / jsonl: a table of numbers, or of texts with `text:`; dvc: a "
                    "file or folder tracked in a DVC repo (`repo`, `rev`, `path`), in one of those formats; text: a "
                    "corpus of documents for a causal language model (a .jsonl file, one document per line, or a "
                    ".txt file, documents separated by blank lines), given as fixed-length blocks of token ids")
    path: str | None = Field(None, description="folder or file, relative to the recipe (every source but digits, which "
                                                 "ignores it); dvc: the tracked file or folder, relative to the repo's root")
    repo: str | None = Field(None, description="dvc: the DVC repo, a folder relative to the recipe or a git URL")
    rev: str | None = Field(None, description="dvc: the full commit sha of the DVC repo to read (branches, tags and "
                                              "short shas are refused: they can move)")
    format: Literal["folder", "npz", "csv", "parquet", "jsonl"] | None = Field(
        None, description="dvc: how to read the tracked path (default: by its suffix, .csv .parquet .jsonl .npz; "
                          "a path without one is a folder)")
    text: str | None = Field(None, description="csv / parquet / jsonl: the column of texts to tokenize; source: text "
                                                 f"with a .jsonl file: the key of each document's text (default "
                                                 f"`{DEFAULT_TEXT_KEY}`)")
    tokenizer: TokenizerSpec | None = Field(None, description="text: {path: tokenizer.json} or {train: {model, "
                                                              "vocab_size, lowercase}}")
    max_length: int | None = Field(None, ge=2, le=65536, description=f"text: tokens per sample, padded and "
                                                                     f"truncated (default {DEFAULT_MAX_LENGTH})")
    block_size: int | None = Field(None, ge=2, le=65536, description=f"source: text: tokens per sample; each split's "
                                                                     f"documents are tokenized, joined with the "
                                                                     f"end-of-text token and cut into blocks of this "
                                                                     f"length (the rest dropped; default "
                                                                     f"{DEFAULT_BLOCK_SIZE})")
    token_type_ids: bool | None = Field(None, description="text: also give the `token_type_ids` feature (zeros)")
    image: ImageSpec | None = Field(None, description="image transforms: {size: [H, W], channels, scale, mean, std, "
                                                      "layout} (digits, folder, npz)")
    image_size: int | None = Field(None, ge=1, le=8192, description="old spelling of image.size: [N, N]")
    channels: int | None = Field(None, ge=1, le=4, description="old spelling of image.channels")
    inputs: dict[str, str | list[str]] | None = Field(
        None, description="npz: {model input: array name}; tables: {model input: [columns...]} (several float "
                          "features); default: npz arrays by their own names (x becomes `image`), tables one feature")
    input: str | None = Field(None, description="tables: name of the one float32 feature (default `features`)")
    columns: list[str] | None = Field(None, min_length=1, description="tables: the feature columns, in order "
                                                                      "(default: every column but the label)")
    label: str | None = Field(None, description="the label array (npz, default `y`) or column (tables, default "
                                                "`label`); null for data without labels. Integer or string labels "
                                                "are classes, float labels regression values")
    normalize: Literal["standard"] | None = Field(None, description="tables: standard = subtract the mean, divide "
                                                                    "by the std, both from the train split")
    val_fraction: float = Field(0.2, gt=0, lt=1, description="held-out share, fixed by split_seed")
    split_seed: int = Field(0, description="seed of the train/held-out split (recorded)")
    limit: int | None = Field(None, ge=1, description="use at most this many samples (after shuffling; source: "
                                                      "text: documents)")

    @field_validator(*_DATA_FIELD_SOURCES)
    @classmethod
    def _applies(cls, v, info):
        source = info.data.get("source")
        allowed = _DATA_FIELD_SOURCES[info.field_name]
        if v is None or source is None or source in allowed:
            return v
        fmt = data_format(source, info.data.get("format"), info.data.get("path"))
        if source == "dvc" and fmt in allowed:
            return v
        reads = f"source {source}" + (f" (format {fmt})" if source == "dvc" and fmt else "")
        raise ValueError(f"`{info.field_name}` does not apply to {reads} (only to {', '.join(allowed)})")

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, v, info):
        source = data_format(info.data.get("source"), info.data.get("format"), info.data.get("path"))
        for name, value in (v or {}).items():
            if source == "npz" and not isinstance(value, str):
                raise ValueError(f"inputs.{name}: for npz, give the array's name (a string)")
            if source in TABLE_SOURCES and (not isinstance(value, list) or not value):
                raise ValueError(f"inputs.{name}: for tables, give a list of columns")
        return v

    @field_validator("image_size", "channels")
    @classmethod
    def _not_both(cls, v, info):
        if v is not None and info.data.get("image") is not None:
            raise ValueError(f"give data.image (size, channels, ...) or the old data.{info.field_name}, not both")
        return v

    @field_validator("path")
    @classmethod
    def _text_file(cls, v, info):
        if v is not None and info.data.get("source") == "text" and PurePosixPath(v).suffix.lower() not in TEXT_SUFFIXES:
            raise ValueError(f"source: text reads a {' or '.join(sorted(set(TEXT_SUFFIXES)))} file, not {v!r}")
        return v

    @field_validator("text")
    @classmethod
    def _corpus_text(cls, v, info):
        if v is not None and info.data.get("source") in TEXT_SOURCES and _is_txt(info.data.get("path")):
            raise ValueError("a .txt corpus has no keys (its documents are separated by blank lines); drop `text:`")
        return v

    @field_validator("tokenizer")
    @classmethod
    def _corpus_tokenizer(cls, v, info):
        """source: text trains a byte-level BPE (the default there), not lowercased unless asked."""
        train = v.train if v is not None else None
        if train is None or info.data.get("source") not in TEXT_SOURCES:
            return v
        if "model" not in train.model_fields_set:
            train.model = "bpe"
        if train.model != "bpe":
            raise ValueError("source: text trains a byte-level BPE: give train.model: bpe (or leave it out)")
        if "lowercase" not in train.model_fields_set:
            train.lowercase = False
        if train.vocab_size < 257:
            raise ValueError(f"train.vocab_size {train.vocab_size} is below 257, the 256 bytes a byte-level BPE "
                             "starts from and <|endoftext|>")
        return v

    @field_validator(*_TEXT_ONLY)
    @classmethod
    def _text_only(cls, v, info):
        if info.data.get("source") in TEXT_SOURCES:
            return v
        if v is not None and "text" in info.data and info.data.get("text") is None:
            raise ValueError(f"data.{info.field_name} applies to text data only (give data.text: COLUMN)")
        return v

    @field_validator(*_NUMERIC_ONLY)
    @classmethod
    def _numeric_only(cls, v, info):
        if v is not None and info.data.get("text") is not None:
            raise ValueError(f"data.{info.field_name} is for tables of numbers; with data.text the features are "
                             "the token ids")
        if v is not None and info.field_name in ("input", "columns") and info.data.get("inputs") is not None:
            raise ValueError(f"give data.inputs (several features) or data.{info.field_name} (one), not both")
        return v

    @model_validator(mode="after")
    def _defaults(self):
        if self.source in TEXT_SOURCES:
            return self._corpus_defaults()
        if self.tokenizer is not None and self.tokenizer.train is not None and self.tokenizer.train.model == "bpe":
            raise ValueError("data.tokenizer.train.model: bpe is for `source: text` (a causal language model's "
                             "corpus); a text column's classifier takes wordpiece")
        if self.text is not None:
            if self.tokenizer is None:
                raise ValueError("data.text needs data.tokenizer: {path: tokenizer.json} or {train: {vocab_size: ...}}")
            if self.max_length is None:
                self.max_length = DEFAULT_MAX_LENGTH
        if self.source == "dvc":
            fmt = data_format(self.source, self.format, self.path)
            if fmt is None and self.path:
                raise ValueError(f"data.format: cannot tell how to read {self.path!r} from its suffix; give "
                                 f"format: {' | '.join(DVC_FORMATS)}")
            self.format = fmt
        fmt = data_format(self.source, self.format, self.path)
        if "label" not in self.model_fields_set and fmt in _DEFAULT_LABEL:
            self.label = _DEFAULT_LABEL[fmt]
        return self

    def _corpus_defaults(self):
        """source: text: a tokenizer is required, a .jsonl file's `text:` key defaults to `text`,
        blocks of `DEFAULT_BLOCK_SIZE` tokens, no labels (the next token is the target)."""
        if self.tokenizer is None:
            raise ValueError("source: text needs data.tokenizer: {train: {model: bpe, vocab_size: 4096}} or "
                             "{path: tokenizer.json}")
        if not _is_txt(self.path) and self.text is None:
            self.text = DEFAULT_TEXT_KEY
        if self.block_size is None:
            self.block_size = DEFAULT_BLOCK_SIZE
        return self

    @model_serializer(mode="wrap")
    def _plain(self, handler):
        out = handler(self)
        for name in _OMITTED_WHEN_UNSET:
            if out.get(name) is None:
                out.pop(name, None)
        return out



def _is_txt(path: str | None) -> bool:
    return path is not None and TEXT_SUFFIXES.get(PurePosixPath(path).suffix.lower()) == "txt"


class DataSection(RecipeSection):
    """`data:`, absent unless the recipe gives it."""

    schema = DataSpec

    @classmethod
    def check(cls, value: DataSpec, recipe_dir: Path) -> None:
        """`data.path` must name an existing file or folder (folder), `data.tokenizer.path` a file,
        relative to the recipe; a dvc source what its repo tracks at `data.rev`; and the columns,
        arrays and tokenizer the section names must be in those files, as far as their headers tell
        (`zoo_stages.sections.data_probe`)."""
        if value.source != "digits" and not value.path:
            raise SectionError(f"data.path is required when data.source is {value.source!r}",
                               hint="set `data.path:` to the folder or file, relative to the recipe")
        if value.source == "dvc":
            _check_dvc(value, recipe_dir)
        want_dir = value.source == "folder"
        if value.source not in ("digits", "dvc"):  # digits ignores data.path; dvc's is inside the DVC repo
            _check_file(value.path, want_dir, ("path",), recipe_dir,
                        f"data.source: {value.source} needs a {'folder' if want_dir else 'file'} at this path, "
                        "relative to the recipe (" + _SOURCE_FILES[value.source] + ")")
        if value.tokenizer is not None and value.tokenizer.path:
            _check_file(value.tokenizer.path, False, ("tokenizer", "path"), recipe_dir,
                        "a Hugging Face tokenizer.json, relative to the recipe")
        if value.source != "dvc":  # a DVC-tracked file is in DVC's cache: the stage reads it
            from zoo_stages.sections.data_probe import probe

            probe(value.model_dump(mode="json"), recipe_dir)


def _check_dvc(data: DataSpec, recipe_dir: Path) -> None:
    """`data.repo` must be a git+DVC repo holding the full commit `data.rev`, at which DVC tracks
    `data.path` (a folder for format: folder, a file otherwise). Read with git alone (`zoo.dvcrepo`)."""
    from zoo import dvcrepo
    from zoo.errors import InvalidInput
    from zoo.paths import cache_dir

    for name in ("repo", "rev"):
        if not getattr(data, name):
            raise SectionError(f"data.{name} is required when data.source is 'dvc'",
                               hint="data: {source: dvc, repo: FOLDER-OR-GIT-URL, rev: FULL-COMMIT-SHA, path: IN/REPO}")
    try:
        repo = dvcrepo.repo_location(data.repo, recipe_dir)
    except RuntimeError:  # "~someone" with no such user
        raise SectionError(f"data.repo {data.repo!r} is not a folder", ("repo",)) from None
    try:
        out = dvcrepo.out_at(repo, data.rev, data.path, cache_dir())
    except InvalidInput as e:  # its message starts with the field it is about ("data.rev: …")
        field = e.message.split(" ", 1)[0].rstrip(":").split(".")
        raise SectionError(e.message, tuple(field[1:]) if field[0] == "data" else (), hint=e.hint) from None
    if out.is_dir != (data.format == "folder"):
        what = "a folder" if out.is_dir else "a file"
        raise SectionError(f"data.path {data.path!r} is {what} in the DVC repo, but data.format is {data.format}",
                           ("path",), hint="format: folder reads a folder (one subfolder per class); the others a file")


_SOURCE_FILES = {"text": "a .jsonl file, one JSON object per document, or a .txt file, documents separated by blank "
                         "lines",
                 "folder": "one subfolder per class", "npz": "a .npz file with one array per input and the labels",
                 "csv": "a CSV file with a header row", "parquet": "a Parquet file",
                 "jsonl": "a file of JSON objects, one per line"}


def _check_file(given: str, want_dir: bool, field: tuple[str, ...], recipe_dir: Path, hint: str) -> None:
    p = Path(given)
    try:
        p = p.expanduser()
    except RuntimeError:  # "~someone" with no such user: checked as written, so it is reported missing
        pass
    if not p.is_absolute():
        p = recipe_dir / p
    if want_dir and p.is_dir() or not want_dir and p.is_file():
        return
    what = "folder" if want_dir else "file"
    state = f"is not a {what}" if p.exists() else "does not exist"
    raise SectionError(f"{'.'.join(('data', *field))} {given!r} {state} ({p})", field, hint=hint)
