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
- ``README.md``: the sources, their versions (scikit-learn, Babel, CLDR) and licenses.

    .venv/bin/python scripts/make_datasets.py            # rewrite recipes/data/
    .venv/bin/python scripts/make_datasets.py --check    # exit 1 if recipes/data/ differs

tests/test_data_files.py checks that the committed files equal this script's output.
"""

from __future__ import annotations

import argparse
import csv
import io
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


def readme() -> bytes:
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
""".encode("utf-8")


def files() -> dict[str, bytes]:
    """Every file of recipes/data/, by name."""
    return {"breast-cancer.csv": breast_cancer(), "languages.csv": languages(), "README.md": readme()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if recipes/data/ differs from the output")
    args = parser.parse_args(argv)
    stale = []
    for name, content in files().items():
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
