"""Write the small datasets the recipes ship under recipes/data/ (deterministic, offline).

- ``breast-cancer.csv``: scikit-learn's bundled ``load_breast_cancer()`` (UCI Breast Cancer
  Wisconsin (Diagnostic), 569 rows): its 30 float columns under their feature names, values
  written with ``%.6g`` (which gives back every stored value exactly), and the label column
  ``target`` holding the class NAME (``malignant`` / ``benign``).
- ``languages.csv``: names of territories, languages and scripts from the Unicode CLDR data
  shipped inside Babel, in eight languages written in the Latin script (en, de, fr, es, it,
  pt, nl, sv); columns ``text,language``. A name that appears (ignoring case) in more than one
  language is dropped, since it cannot identify one; rows are sorted by (language, text).
  Task: tell the language of a name.
- ``pydoc-topics.jsonl``: the documentation topics that ship with CPython (``pydoc_data.topics``:
  the reference manual's sections that ``help('if')`` shows; about 65,000 words of English prose
  with code examples), one JSON object per topic, ``{"text": ..., "topic": ...}``, sorted by topic.
  The corpus of the causal language model in ``recipes/pydoc-llama.yaml``. Written from the
  running Python's copy; their bytes differ between Python versions (even patch releases), so the
  committed file, not the user's Python, is what recipes read, and the README records the
  version it came from and its sha256 (``--check`` on another Python checks the file against
  that digest instead of regenerating it).
- ``README.md``: the sources, their versions (scikit-learn, Babel, CLDR, CPython) and licenses.

    .venv/bin/python scripts/make_datasets.py            # rewrite recipes/data/
    .venv/bin/python scripts/make_datasets.py --check    # exit 1 if recipes/data/ differs

tests/test_data_files.py checks that the committed files equal this script's output.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import platform
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "recipes" / "data"
LANGUAGES = ("en", "de", "fr", "es", "it", "pt", "nl", "sv")
FLOAT_FORMAT = "%.6g"


def _csv(header: list[str], rows: list[list[str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue().encode("utf-8")


def breast_cancer() -> bytes:
    """The breast-cancer table: 30 feature columns, then ``target`` (malignant / benign)."""
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    rows = [[FLOAT_FORMAT % v for v in features] + [str(bunch.target_names[t])]
            for features, t in zip(bunch.data, bunch.target)]
    return _csv([str(n) for n in bunch.feature_names] + ["target"], rows)


def languages() -> bytes:
    """CLDR display names (territories, languages, scripts) labelled with their language."""
    from babel import Locale

    names: dict[str, set[str]] = {}
    for code in LANGUAGES:
        locale = Locale(code)
        for table in (locale.territories, locale.languages, locale.scripts):
            names[code] = names.get(code, set()) | {" ".join(str(v).split()) for v in table.values() if str(v).strip()}
    owners: dict[str, set[str]] = {}
    for code, texts in names.items():
        for t in texts:
            owners.setdefault(t.casefold(), set()).add(code)
    rows = sorted([t, code] for code, texts in names.items() for t in texts if len(owners[t.casefold()]) == 1)
    rows.sort(key=lambda r: (r[1], r[0]))
    return _csv(["text", "language"], rows)


PYDOC_FILE = "pydoc-topics.jsonl"


def pydoc_topics() -> bytes:
    """The running CPython's documentation topics, one JSON line per topic, sorted by topic."""
    from pydoc_data.topics import topics

    return "".join(json.dumps({"text": topics[k], "topic": k}, ensure_ascii=False, sort_keys=True) + "\n"
                   for k in sorted(topics)).encode("utf-8")


def pydoc_source(readme_text: str) -> tuple[str, str] | None:
    """(CPython version, sha256) that README.md records for pydoc-topics.jsonl; None if it records none."""
    m = re.search(r"pydoc_data\.topics` of CPython (\S+), sha256 `([0-9a-f]{64})`", readme_text)
    return (m.group(1), m.group(2)) if m else None


def _pydoc_readme(version: str, digest: str, corpus: bytes) -> str:
    words = sum(len(json.loads(line)["text"].split()) for line in corpus.decode("utf-8").splitlines())
    return f"""## {PYDOC_FILE}

The documentation topics (`pydoc_data.topics` of CPython {version}, sha256 `{digest}`), the sections
of the Python Language Reference and Library Reference that `help('if')` shows: {len(corpus.splitlines())}
topics, {words:,} words of English prose with code examples. One JSON object per line,
`{{"text": ..., "topic": ...}}`, sorted by topic. Their bytes differ between Python versions, so
recipes read this file, not the running Python's copy; `scripts/make_datasets.py` rewrites it from
the running Python with `--refresh-pydoc`, and otherwise keeps it (checked against the digest above).
Recipe: `data: {{source: text, path: data/{PYDOC_FILE}, tokenizer: {{train: {{model: bpe, vocab_size: 4096}}}}}}`.

Python documentation: Copyright © 2001 Python Software Foundation; PSF License Version 2
(https://docs.python.org/3/license.html).
"""


def readme(pydoc: tuple[str, str, bytes]) -> bytes:
    import babel
    import sklearn
    from babel.core import get_cldr_version

    return f"""# Datasets shipped with the recipes

Written by `scripts/make_datasets.py` (do not edit by hand; `tests/test_data_files.py` checks
that these files equal its output).

## breast-cancer.csv

scikit-learn {sklearn.__version__}'s bundled `load_breast_cancer()`: the Breast Cancer Wisconsin
(Diagnostic) data set (W. N. Street, W. H. Wolberg, O. L. Mangasarian, UCI Machine Learning
Repository, CC BY 4.0). 569 rows; 30 float columns named as scikit-learn names them
(`mean radius` ... `worst fractal dimension`), written with `{FLOAT_FORMAT}` (every stored value
exactly), and the label column `target` holding the class name: `malignant` or `benign` (zoo
numbers classes by sorted name: benign 0, malignant 1; scikit-learn's own `target` is the reverse).
Recipe: `data: {{source: csv, path: data/breast-cancer.csv, label: target, normalize: standard}}`.

## languages.csv

Names of territories, languages and scripts (`Locale(code).territories`, `.languages`,
`.scripts`) from the Unicode CLDR {get_cldr_version()} data shipped inside Babel {babel.__version__},
in {len(LANGUAGES)} languages written in the Latin script: {', '.join(LANGUAGES)}. Columns `text,language`;
a name that appears in more than one language (ignoring case) is dropped, rows are sorted by
language, then text. Task: tell which language a name is written in.
Recipe: `data: {{source: csv, path: data/languages.csv, text: text, label: language, ...}}`.

CLDR data: Copyright © 1991-2025 Unicode, Inc.; Unicode License v3
(https://www.unicode.org/license.txt). Babel: BSD-3-Clause.

{_pydoc_readme(*pydoc)}""".encode("utf-8")


def pydoc_corpus(refresh: bool) -> tuple[str, str, bytes]:
    """(CPython version, sha256, bytes) of the pydoc corpus: the committed file as README.md records
    it, unless `refresh` (or nothing is committed yet), then the running Python's topics."""
    committed, notes = OUT / PYDOC_FILE, OUT / "README.md"
    recorded = pydoc_source(notes.read_text(encoding="utf-8")) if notes.is_file() else None
    if not refresh and recorded is not None and committed.is_file():
        return recorded[0], recorded[1], committed.read_bytes()
    fresh = pydoc_topics()
    return platform.python_version(), hashlib.sha256(fresh).hexdigest(), fresh


def files(refresh_pydoc: bool = False) -> dict[str, bytes]:
    """Every file of recipes/data/, by name."""
    pydoc = pydoc_corpus(refresh_pydoc)
    return {"breast-cancer.csv": breast_cancer(), "languages.csv": languages(), PYDOC_FILE: pydoc[2],
            "README.md": readme(pydoc)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if recipes/data/ differs from the output")
    parser.add_argument("--refresh-pydoc", action="store_true",
                        help=f"rewrite {PYDOC_FILE} from the running Python's pydoc_data (its bytes vary by version)")
    args = parser.parse_args(argv)
    stale = []
    generated = files(refresh_pydoc=args.refresh_pydoc)
    if hashlib.sha256(generated[PYDOC_FILE]).hexdigest() != pydoc_source(generated["README.md"].decode())[1]:
        stale.append(f"{PYDOC_FILE} (its sha256 is not the one README.md records)")
    for name, content in generated.items():
        path = OUT / name
        if args.check:
            if not path.is_file() or path.read_bytes() != content:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            print(f"wrote {path.relative_to(REPO)} ({len(content):,} bytes)")
    if stale:
        print(f"stale: {', '.join(stale)} (run scripts/make_datasets.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
