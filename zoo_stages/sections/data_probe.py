"""What `zoo validate` (and every run, before its first stage) reads of the data files cheaply.

`DataSection.check` calls `probe` once the files exist; it reads names only, never the samples:

- CSV: the header row; Parquet: the schema in the file's footer (pyarrow, when installed);
  JSON lines: the keys of every object, for files up to `MAX_JSONL_BYTES`;
- npz: the names in the zip's central directory;
- a corpus (``source: text``) in JSON lines: that every object has the ``data.text`` key, for
  files up to `MAX_JSONL_BYTES` (the documents' texts are read by the stage);
- a tokenizer file: that it is a JSON object with a `model` (what `tokenizers` reads).

and checks them with the loaders' own checks (`tables.check_columns`, `npz.check_names`), so the
error before a run is the one the stage would have met, placed at the recipe's line. What cannot
be read cheaply is skipped, never guessed: a DVC-tracked file (in DVC's cache, not beside the
recipe), a Parquet file without pyarrow, a file that is unreadable here (the stage says why).
"""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path
from typing import Any

from zoo.section import SectionError

MAX_JSONL_BYTES = 16 * 1024 * 1024  # larger files are read by the stage alone
MAX_TOKENIZER_BYTES = 256 * 1024 * 1024


class _Unreadable(Exception):
    """The file cannot be read cheaply here: nothing is checked (the stage reads it and says why)."""


def probe(spec: dict[str, Any], recipe_dir: Path) -> None:
    """SectionError at the `data:` field a data file does not fit (`spec`: the section as plain data)."""
    from zoo_stages.lib.data.errors import DataError

    try:
        _probe(spec, recipe_dir)
    except DataError as e:
        raise SectionError(e.message, e.field[1:], hint=e.hint) from None


def column_names(source: str, path: Path) -> list[str] | None:
    """The columns of a table file as its header or schema names them; None when that cannot be
    read cheaply."""
    try:
        if source == "csv":
            return _csv_header(path)
        if source == "parquet":
            return _parquet_names(path)
        if source == "jsonl":
            return _jsonl_keys(path)
    except _Unreadable:
        return None
    return None


def _probe(spec: dict[str, Any], recipe_dir: Path) -> None:
    from zoo_stages.lib.data import npz, tables

    source = spec["source"]
    if source in ("csv", "parquet", "jsonl"):
        names = column_names(source, _resolved(spec["path"], recipe_dir))
        if names is not None:
            if source == "csv":
                tables.check_header(names, spec["path"])
            tables.check_columns(names, spec)
    elif source == "text" and spec.get("text") is not None:
        _check_corpus_keys(spec, recipe_dir)
    elif source == "npz":
        arrays = npz_arrays(_resolved(spec["path"], recipe_dir))
        if arrays is not None:  # else the loader says what is wrong with the file
            npz.check_names(arrays, spec)
    tokenizer = spec.get("tokenizer") or {}
    if tokenizer.get("path"):
        _check_tokenizer(tokenizer["path"], recipe_dir)


def _format(spec: dict[str, Any]) -> str | None:
    """How the data is read: the source, or for ``dvc`` the format DataSpec filled in (from the path's suffix)."""
    return spec.get("format") if spec["source"] == "dvc" else spec["source"]


def _resolved(given: str, recipe_dir: Path) -> Path:
    p = Path(given).expanduser()
    return p if p.is_absolute() else recipe_dir / p


def _csv_header(path: Path) -> list[str]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        raise _Unreadable() from None


def _parquet_names(path: Path) -> list[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _Unreadable() from None
    try:
        return list(pq.read_schema(path).names)
    except Exception:  # noqa: BLE001 (pyarrow's own ArrowInvalid/OSError family: the stage reports it)
        raise _Unreadable() from None


def _jsonl_keys(path: Path) -> list[str]:
    keys: dict[str, None] = {}
    try:
        if path.stat().st_size > MAX_JSONL_BYTES:
            raise _Unreadable()
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    obj = json.loads(line)
                    if not isinstance(obj, dict):
                        raise _Unreadable()
                    keys.update(dict.fromkeys(obj))
    except (OSError, UnicodeDecodeError, ValueError):
        raise _Unreadable() from None
    return list(keys)


def _check_corpus_keys(spec: dict[str, Any], recipe_dir: Path) -> None:
    """Every object of a .jsonl corpus must hold the `data.text` key (the loader's own message)."""
    path, key = _resolved(spec["path"], recipe_dir), spec["text"]
    missing = None
    try:
        if path.stat().st_size > MAX_JSONL_BYTES:
            return
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    obj = json.loads(line)
                    if not isinstance(obj, dict) or key not in obj:
                        missing = n
                        break
    except (OSError, UnicodeDecodeError, ValueError):
        return  # the stage reads the file and says what is wrong with it
    if missing is not None:  # SectionError is a ValueError: raised outside the reading's handler
        raise SectionError(f"data.text: line {missing} of {spec['path']!r} has no key {key!r}", ("text",),
                           hint="set `data.text:` to the key that holds each document's text")


def _check_tokenizer(given: str, recipe_dir: Path) -> None:
    """A tokenizer.json must be a JSON object with a `model`: what Hugging Face `tokenizers` reads."""
    path = _resolved(given, recipe_dir)
    hint = "save one with tokenizer.save('tokenizer.json'), or use `tokenizer: {train: {...}}`"
    try:
        if path.stat().st_size > MAX_TOKENIZER_BYTES:
            return
        document = json.loads(path.read_bytes())
    except OSError:
        return
    except (UnicodeDecodeError, ValueError) as e:
        raise SectionError(f"data.tokenizer.path {given!r} is not a Hugging Face tokenizer.json: not JSON ({e})",
                           ("tokenizer", "path"), hint=hint) from None
    if not isinstance(document, dict) or not isinstance(document.get("model"), dict):
        raise SectionError(f"data.tokenizer.path {given!r} is not a Hugging Face tokenizer.json: it has no `model`",
                           ("tokenizer", "path"), hint=hint)


MAX_LABEL_SCAN_BYTES = 64 * 1024 * 1024  # a larger table's labels are not read to infer `task:`


def label_kind(spec: dict[str, Any], recipe_dir: Path) -> str | None:
    """"classification" or "regression": what the loader will make of the data's labels (integer,
    boolean and text labels are classes, float labels values: `loaded.class_labels`), read from the
    label column or array alone; None without labels, or when that cannot be read cheaply here."""
    label = spec.get("label")  # DataSpec fills in the format's default; None: no labels
    fmt = _format(spec)
    if spec["source"] == "dvc" or label is None:  # DVC's files are not beside the recipe
        return None
    path = _resolved(spec["path"], recipe_dir)
    try:
        if fmt in ("csv", "jsonl", "parquet"):
            cells = _label_cells(fmt, path, label)
            if cells is None:
                return None
            from zoo_stages.lib.data.tables import _typed

            dtype = _typed(cells).dtype
        elif fmt == "npz":
            dtype = _npz_dtype(path, label)
        else:
            return None
    except _Unreadable:
        return None
    if dtype is None:
        return None
    return "regression" if dtype.kind == "f" else "classification"


def _label_cells(fmt: str, path: Path, label: str) -> list[Any] | None:
    if fmt == "parquet":
        try:
            import pyarrow.parquet as pq

            if label not in pq.read_schema(path).names:
                return None
            return pq.read_table(path, columns=[label]).column(0).to_pylist()
        except Exception:  # noqa: BLE001 (no pyarrow, or a file the stage will report)
            raise _Unreadable() from None
    try:
        if path.stat().st_size > MAX_LABEL_SCAN_BYTES:
            return None
        if fmt == "jsonl":
            if label not in _jsonl_keys(path):
                return None
            with open(path, encoding="utf-8") as f:
                return [json.loads(line).get(label) for line in f if line.strip()]
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.reader(f)
            header = next(rows, [])
            if label not in header:
                return None
            at = header.index(label)
            return [row[at] for row in rows if row and len(row) == len(header)]
    except (OSError, UnicodeDecodeError, ValueError, csv.Error):
        raise _Unreadable() from None


def _npz_dtype(path: Path, array: str) -> Any:
    """The dtype of one array of an .npz archive, from its .npy header (no data is read)."""
    import numpy as np

    try:
        with zipfile.ZipFile(path) as archive, archive.open(array + ".npy") as f:
            version = np.lib.format.read_magic(f)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            return reader(f)[2]
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        raise _Unreadable() from None


def npz_arrays(path: Path) -> list[str] | None:
    """The array names of an .npz archive, from the zip's listing; None when it cannot be read."""
    try:
        with zipfile.ZipFile(path) as archive:
            return [n.removesuffix(".npy") for n in archive.namelist() if n.endswith(".npy")]
    except (OSError, zipfile.BadZipFile):
        return None


def feature_names(spec: dict[str, Any], recipe_dir: Path) -> list[str] | None:
    """The names of the features the data gives a model, told from the section and the files'
    listings alone: a table's (`data.inputs`, else `data.input` or ``features``), an npz archive's
    (`data.inputs`, else its arrays but the label, ``x`` named ``image``), an image source's
    ``image``. None for text and a corpus (the tokenizer names them) and for what cannot be read cheaply."""
    from zoo_stages.lib.data.images import IMAGE_FEATURE
    from zoo_stages.lib.data.npz import LEGACY_IMAGE_ARRAY
    from zoo_stages.lib.data.tables import DEFAULT_FEATURE

    fmt = _format(spec)
    if spec.get("text") is not None or fmt == "text":  # a corpus feeds a decoder's input_ids, its other inputs its own
        return None
    if spec.get("inputs"):
        return list(spec["inputs"])
    if fmt in ("csv", "parquet", "jsonl"):
        return [spec.get("input") or DEFAULT_FEATURE]
    if fmt in ("digits", "folder"):
        return [IMAGE_FEATURE]
    if fmt == "npz" and spec["source"] != "dvc":
        arrays = npz_arrays(_resolved(spec["path"], recipe_dir))
        if arrays is None:
            return None
        return [IMAGE_FEATURE if a == LEGACY_IMAGE_ARRAY else a for a in arrays if a != spec.get("label")]
    return None
