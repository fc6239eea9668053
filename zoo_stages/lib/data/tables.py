"""Tables (CSV, Parquet, JSON lines) as columns, float features, labels and normalisation.

- CSV: a header row, then one row per sample (Python's `csv` module, no extra package). A
  column whose every cell reads as an integer is int64; as a number, float64 (an empty cell is
  NaN); otherwise text.
- Parquet: read with pyarrow (the ``tables`` extra), imported only for Parquet files.
- JSON lines: one JSON object per line; keys are columns, in order of first appearance.

Features: ``data.columns`` (default: every column but the label and the text) become one
float32 feature named ``data.input`` (default ``features``) of shape [N, len(columns)], or
``data.inputs: {name: [columns...]}`` give several. ``normalize: standard`` subtracts each
column's mean and divides by its standard deviation (population; 1 where it is 0), both
computed on the train split only and recorded.
"""

from __future__ import annotations

import csv
import difflib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo_stages.lib.data.errors import DataError
from zoo_stages.lib.data.loaded import Loaded, class_labels

if TYPE_CHECKING:
    import numpy as np

DEFAULT_FEATURE = "features"
TABLES_EXTRA = "pip install 'zoo-onnx[tables]'"


def read_table(path: Path, source: str, given: str) -> dict[str, "np.ndarray"]:
    """The file's columns by name, in file order: int64, float64, bool or object (text) arrays."""
    if source == "parquet":
        return _read_parquet(path, given)
    rows = _read_jsonl(path, given) if source == "jsonl" else _read_csv(path, given)
    header, cells = rows
    return {name: _typed([row[i] for row in cells]) for i, name in enumerate(header)}


def load_table(path: Path, spec: dict) -> Loaded:
    """The table's feature columns (grouped per feature) and labels; the text column for text data."""
    given = spec["path"]
    table = read_table(path, spec["source"], given)
    if not table or not len(next(iter(table.values()))):
        raise DataError(f"data.path {given!r} has no rows", hint="the file needs a header and one row per sample")
    check_columns(list(table), spec)
    label = spec.get("label")
    samples: dict[str, Any] = {}
    if spec.get("text") is not None:
        texts = table[spec["text"]]
        if texts.dtype != object or any(not isinstance(t, str) for t in texts):
            raise DataError(f"data.text: column {spec['text']!r} of {given!r} does not hold texts (got {texts.dtype})")
        samples["text"] = texts
        groups = {}
    else:
        groups = feature_groups(table, spec, given)
        for name, cols in groups.items():
            samples[name] = feature_matrix(table, cols, given, where="data.inputs." + name if spec.get("inputs")
                                           else "data.columns")
    facts: dict[str, Any] = {"features": groups, "num_rows": len(next(iter(table.values())))}
    if label is None:
        return Loaded(samples, None, None, facts=facts)
    values = table[label]
    if values.dtype == object and any(v is None or v == "" for v in values):
        raise DataError(f"data.label: column {label!r} of {given!r} has empty cells",
                        hint="drop the rows without a label")
    labels, kind, names = class_labels(values, f"data.label: column {label!r} of {given!r}")
    return Loaded(samples, labels, kind, class_names=names, facts=facts)


def check_columns(names: list[str], spec: dict) -> None:
    """DataError unless a table with these column names holds the label, text and feature columns the
    section names (also checked before a run, from the file's header alone)."""
    given = spec["path"]
    table = dict.fromkeys(names)
    if spec.get("label") is not None:
        column(table, spec["label"], "data.label", given, hint="set `data.label:` to the label column, or `label: null`")
    if spec.get("text") is not None:
        column(table, spec["text"], "data.text", given)
    else:
        feature_groups(table, spec, given)


def column(table: dict, name: str, field: str, given: str, hint: str | None = None) -> "np.ndarray":
    """One column; DataError naming `field`, with a did-you-mean, when the table has none."""
    if name not in table:
        close = difflib.get_close_matches(name, list(table), n=1)
        raise DataError(f"{field}: {given!r} has no column {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                        + f" (columns: {_listed(list(table))})", hint=hint)
    return table[name]


def _listed(names: list[str], most: int = 12) -> str:
    """Column names for a message: all of a small table's, the first `most` and a count of a wide one's."""
    if len(names) <= most:
        return ", ".join(names)
    return ", ".join(names[:most]) + f", … ({len(names)} in all)"


def feature_groups(table: dict, spec: dict, given: str) -> dict[str, list[str]]:
    """{feature name: [columns...]}: ``data.inputs``, or ``data.columns`` as one ``data.input``."""
    if spec.get("inputs"):
        groups = dict(spec["inputs"])
    else:
        cols = spec.get("columns") or [c for c in table if c not in (spec.get("label"), spec.get("text"))]
        groups = {spec.get("input") or DEFAULT_FEATURE: cols}
    for name, cols in groups.items():
        field = f"data.inputs.{name}" if spec.get("inputs") else "data.columns"
        if not cols:
            raise DataError(f"{field}: no feature columns (the table has only the label)")
        for c in cols:
            column(table, c, field, given)
            if c == spec.get("label"):
                raise DataError(f"{field}: {c!r} is the label column", hint="a label cannot also be a feature")
        dup = sorted({c for c in cols if cols.count(c) > 1})
        if dup:
            raise DataError(f"{field}: column {dup[0]!r} is listed twice")
    return groups


def _first_not_number(values) -> object:
    """The value to quote when a column is text: the first that is not a number (a column read as
    text is mostly numbers with one stray word, and quoting a number would say nothing)."""
    for v in values:
        if v is None:
            continue
        try:
            float(v)
        except (TypeError, ValueError):
            return v
    return next((v for v in values if v is not None), None)


def feature_matrix(table: dict, cols: list[str], given: str, where: str) -> "np.ndarray":
    """float32 [N, len(cols)] of numeric columns; DataError for text or missing values."""
    import numpy as np

    out = np.empty((len(table[cols[0]]), len(cols)), dtype=np.float32)
    for j, c in enumerate(cols):
        values = table[c]
        if values.dtype == object:
            raise DataError(f"{where}: column {c!r} of {given!r} holds text, not numbers "
                            f"(e.g. {_first_not_number(values)!r})",
                            hint="feature columns must be numbers; leave the column out of data.columns")
        values = values.astype(np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if len(bad):
            raise DataError(f"{where}: column {c!r} of {given!r} has {len(bad)} missing, NaN or infinite "
                            f"value(s) (first at data row {int(bad[0]) + 1})",
                            hint="fill or drop those rows before training")
        out[:, j] = values
    return out


def standard_stats(x: "np.ndarray") -> tuple["np.ndarray", "np.ndarray"]:
    """Per-column mean and population std of train rows (float64; std 1 where it is 0)."""
    import numpy as np

    mean = x.astype(np.float64).mean(axis=0)
    std = x.astype(np.float64).std(axis=0)
    return mean, np.where(std > 0, std, 1.0)


def standardized(x: "np.ndarray", mean: "np.ndarray", std: "np.ndarray") -> "np.ndarray":
    import numpy as np

    return ((x.astype(np.float64) - mean) / std).astype(np.float32)


def table_record(spec: dict, loaded: Loaded, stats: dict[str, tuple[list[float], list[float]]]) -> dict[str, Any]:
    """What a user must do to a table row before feeding the model (for `preprocessing`)."""
    features = {}
    for name, cols in loaded.facts["features"].items():
        entry: dict[str, Any] = {"columns": list(cols), "dtype": "float32", "shape": [len(cols)]}
        if name in stats:
            mean, std = stats[name]
            entry["normalize"] = {"method": "standard", "formula": "(value - mean) / std",
                                  "fitted_on": "train split",
                                  "mean": dict(zip(cols, mean)), "std": dict(zip(cols, std))}
        features[name] = entry
    return {"features": features}


def _read_csv(path: Path, given: str) -> tuple[list[str], list[list[str]]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"data.path {given!r} is not a readable UTF-8 CSV file: {e}") from None
    if not rows:
        raise DataError(f"data.path {given!r} is empty", hint="a CSV file starts with a header row")
    header = rows[0]
    check_header(header, given)
    cells = [r for r in rows[1:] if r]
    for i, r in enumerate(rows[1:], start=2):
        if r and len(r) != len(header):
            raise DataError(f"data.path {given!r}: line {i} has {len(r)} fields, the header {len(header)}",
                            hint="every row needs one value per column (quote values with commas)")
    return header, cells


def check_header(header: list[str], given: str) -> None:
    """DataError when a CSV header names a column twice (also checked before a run)."""
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise DataError(f"data.path {given!r}: the header names column {dup[0]!r} twice")


def _read_jsonl(path: Path, given: str) -> tuple[list[str], list[list[Any]]]:
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for i, line in enumerate(f, start=1):
                if line.strip():
                    obj = json.loads(line)
                    if not isinstance(obj, dict):
                        raise DataError(f"data.path {given!r}: line {i} is not a JSON object")
                    records.append(obj)
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"data.path {given!r} is not a readable UTF-8 file: {e}") from None
    except json.JSONDecodeError as e:
        raise DataError(f"data.path {given!r}: line {i} is not JSON: {e.msg}") from None
    header: dict[str, None] = {}
    for obj in records:
        header.update(dict.fromkeys(obj))
    return list(header), [[obj.get(k) for k in header] for obj in records]


def _typed(cells: list[Any]) -> "np.ndarray":
    """A column's cells (CSV strings or JSON values) as int64, float64, bool or object (text)."""
    import numpy as np

    if all(isinstance(c, bool) for c in cells):
        return np.array(cells, dtype=bool)
    if all(isinstance(c, int) and not isinstance(c, bool) for c in cells):
        return np.array(cells, dtype=np.int64)
    if all(c is None or isinstance(c, (int, float)) and not isinstance(c, bool) for c in cells):
        return np.array([np.nan if c is None else c for c in cells], dtype=np.float64)
    if all(isinstance(c, str) for c in cells):
        try:
            return np.array([int(c) for c in cells], dtype=np.int64)
        except ValueError:
            pass
        try:
            return np.array([float(c) if c.strip() else np.nan for c in cells], dtype=np.float64)
        except ValueError:
            pass
    out = np.empty(len(cells), dtype=object)
    out[:] = cells
    return out


def _read_parquet(path: Path, given: str) -> dict[str, "np.ndarray"]:
    import numpy as np

    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("data.source: parquet needs pyarrow, which is not installed", hint=TABLES_EXTRA) from None
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises its own ArrowInvalid/OSError family
        raise DataError(f"data.path {given!r} is not a readable Parquet file: {e}") from None
    out = {}
    for name, col in zip(table.column_names, table.columns):
        values = col.to_pylist()
        if all(isinstance(v, str) for v in values) or not all(v is None or isinstance(v, (int, float)) for v in values):
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            out[name] = arr
        else:
            out[name] = _typed(values)
    return out
