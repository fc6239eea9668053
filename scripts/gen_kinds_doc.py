"""Regenerate the tables of docs/kinds.md from the code, and check its YAML examples.

Each kind is described once, in its code: between ``<!-- BEGIN GENERATED: KEY -->`` and
``<!-- END GENERATED: KEY -->`` this script writes what it reads there: each built-in kind's
description (its package's module docstring, Markdown: ``doc:KIND``), every config
field of each kind (name, type, default, constraints and description, from its pydantic
``Config``), the recipe-wide ``model:``/``data:`` sections (their registered schemas, zoo_stages/sections/),
quantize's presets and auto candidates, verify's metrics, the gate operators and deploy's
conversion tolerances.

Each ```yaml block in the doc is validated with ``zoo validate`` on a temporary recipe: a block
with ``schema_version`` is a whole recipe; otherwise its top-level ``model``/``data`` keys
replace those of a small base recipe and any other keys are stage entries that replace or
join the base recipe's six stages.

    .venv/bin/python scripts/gen_kinds_doc.py            # rewrite the tables, validate examples
    .venv/bin/python scripts/gen_kinds_doc.py --check    # exit 1 if tables are stale or an example fails
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "kinds.md"
BLOCK = re.compile(r"(<!-- BEGIN GENERATED: (?P<key>[\w:-]+) -->\n)(?P<body>.*?)(<!-- END GENERATED: (?P=key) -->)",
                   re.S)

# What examples are merged into (a valid recipe on its own).
BASE_RECIPE: dict[str, Any] = {
    "schema_version": 1,
    "name": "kinds-doc-example",
    "version": "0.1.0",
    "model": {"arch": "lenet5", "num_classes": 10},
    "data": {"source": "digits", "image_size": 16, "channels": 1},
    "stages": {
        "train": {},
        "export": {},
        "optimize": {},
        "quantize": {"needs": ["export"]},
        "verify": {"needs": ["optimize", "quantize"], "config": {"builds": {"cpu-fp32": "optimize", "cpu-int8": "quantize"}}},
        "deploy": {"needs": ["optimize", "quantize", "verify"],
                   "config": {"builds": {"cpu-fp32": "optimize", "cpu-int8": "quantize"}}},
    },
}


# ---------------------------------------------------------------------------------------------
# field tables


def type_name(annotation: Any) -> str:
    """A short, readable rendering of a field annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" \\| null" if type(None) in args else "")
    if origin in (list, tuple, set):
        return f"list[{', '.join(type_name(a) for a in args)}]" if args else "list"
    if origin is dict:
        return f"map[{type_name(args[0])} → {type_name(args[1])}]" if args else "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """(the pydantic model inside `annotation`, path suffix): `X`, `X | None` → '', `dict[str, X]` → '.<name>'."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        inner, _ = _model_in(args[1])
        return inner, ".<name>" if inner else ""
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for a in args:
            inner, suffix = _model_in(a)
            if inner:
                return inner, suffix
    return None, ""


def default_text(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "see below"
    elif field.default is PydanticUndefined:
        return "**required**"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "see below"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value}`"


def constraints(field: Any) -> str:
    """Numeric and length bounds from the field's metadata (ge=1 → '≥ 1')."""
    symbols = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "min length", "max_length": "max length"}
    found = []
    for meta in field.metadata:
        for attr, sym in symbols.items():
            value = getattr(meta, attr, None)
            if value is not None:
                found.append(f"{sym} {value}")
    return ", ".join(found)


def field_rows(model: type[BaseModel], prefix: str = "") -> list[list[str]]:
    """One row per field, recursing into nested config objects (dotted names)."""
    rows = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        sub, suffix = _model_in(field.annotation)
        description = " ".join((field.description or "").split())
        bounds = constraints(field)
        if bounds:
            description = f"{description} ({bounds})" if description else bounds
        rows.append([f"`{key}`", type_name(field.annotation), default_text(field), description.replace("|", "\\|")])
        if sub is not None:
            rows.extend(field_rows(sub, f"{key}{suffix}."))
    return rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def kind_header(name: str) -> str:
    from zoo.engine import kind_loader

    cls = kind_loader.get(name)
    outputs = ", ".join(f"`{o}`" for o in cls.outputs) or "none"
    # a whole section reads as `data:`, a single field as `model.task` (only those enter its key)
    shared = ("reads the recipe's " + ", ".join(f"`{s}`" if "." in s else f"`{s}:`" for s in cls.shared)) \
        if cls.shared else "reads no recipe-wide section"
    tools = ", ".join(cls.tools) or "none"
    return (f"*{cls.summary}* — outputs: {outputs}; {shared}; "
            f"kind version {cls.version}; tool versions in its cache key: {tools}.\n\n")


DOCSTRING_NOTE = "This docstring is the kind's description on the docs site"


def kind_description(name: str) -> str:
    """A built-in kind's description: the docstring of its module in zoo_stages (a package's
    `__init__` for a kind that is one), without its first line (the module's one-line summary;
    the page has the kind's heading and `summary`) and the note that says where it goes."""
    import importlib
    import inspect

    from zoo.engine import kind_loader

    module = importlib.import_module(".".join(kind_loader.get(name).__module__.split(".")[:2]))
    text = inspect.cleandoc(module.__doc__ or "")
    if not text:
        raise ValueError(f"{module.__name__} has no docstring: it is the {name} kind's description")
    paragraphs = [p for p in text.split("\n\n")[1:] if not p.startswith(DOCSTRING_NOTE)]
    return re.sub(r"``([^`]+)``", r"`\1`", "\n\n".join(paragraphs)) + "\n"


def generated() -> dict[str, str]:
    """Every generated block, by key."""
    from zoo.engine import kind_loader
    from zoo_stages.sections.data import DataSpec
    from zoo_stages.sections.model import ModelSpec
    from zoo_stages import quantize, verify
    from zoo_stages.deploy import config as deploy_config
    from zoo_stages.lib.quality import gates
    from zoo_stages.lib.quantization import quant_settings

    header = ["field", "type", "default", "description"]
    out = {"fields:model": markdown_table(header, field_rows(ModelSpec)),
           "fields:data": markdown_table(header, field_rows(DataSpec))}
    for name in kind_loader.builtin_names():  # the entry points of zoo's distribution (pyproject.toml)
        out[f"fields:{name}"] = kind_header(name) + markdown_table(header, field_rows(kind_loader.get(name).Config))
        out[f"doc:{name}"] = kind_description(name)
    out["quantize:presets"] = markdown_table(
        ["preset", "activation_type", "weight_type", "reduce_range", "per_channel", "symmetric"],
        [[f"`{p}`", v["activation_type"], v["weight_type"], str(v["reduce_range"]).lower(),
          str(v.get("per_channel", "—")).lower(), str(v.get("symmetric", False)).lower()]
         for p, v in quant_settings.PRESETS.items()])
    out["quantize:candidates"] = markdown_table(
        ["order", "candidate", "mode", "format", "per_channel", "activations", "weights", "reduce_range"],
        [[str(i + 1), f"`{c}`", s.mode, s.format or "—", str(s.per_channel).lower(), s.activation_type or "dynamic uint8",
          s.weight_type, str(s.reduce_range).lower()] for i, c in enumerate(quant_settings.CANDIDATES)
         for s in [quant_settings.resolve(quantize.QuantizeConfig(mode="auto"), c)]])
    out["verify:metrics"] = markdown_table(
        ["metric", "meaning"],
        [[f"`{k}`", v.replace("|", "\\|")] for k, v in verify.METRICS.items()]
        + [["`throughput_bs<N>`", "samples/s at batch size N, for each N in `latency.batch_sizes`"]])
    out["gates:operators"] = " ".join(f"`{op}`" for op in gates.OPERATORS) + "\n"
    out["deploy:tolerances"] = markdown_table(
        ["convert", "default atol", "default rtol"],
        [[f"`{k}`", f"{a:g}", f"{r:g}"] for k, (a, r) in deploy_config.DEFAULT_TOLERANCES.items()])
    return out


def render(text: str, blocks: dict[str, str]) -> tuple[str, list[str]]:
    """`text` with every generated block replaced; also the keys the doc has no generator for."""
    unknown = []

    def sub(m: re.Match) -> str:
        key = m.group("key")
        if key not in blocks:
            unknown.append(key)
            return m.group(0)
        # blank lines around the content: markdown ends the comment's HTML block before a table
        return m.group(1) + "\n" + blocks[key] + "\n" + m.group(4)

    return BLOCK.sub(sub, text), unknown


# ---------------------------------------------------------------------------------------------
# examples


def examples(text: str) -> list[tuple[int, str]]:
    """(line number, body) of every ```yaml block."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```yaml":
            start, body = i + 1, []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            found.append((start + 1, "\n".join(body) + "\n"))
        i += 1
    return found


def as_recipe(snippet: str) -> dict[str, Any]:
    data = yaml.safe_load(snippet)
    if not isinstance(data, dict):
        raise ValueError("an example must be a YAML mapping")
    if "schema_version" in data:
        return data
    recipe = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE_RECIPE.items()}
    recipe["stages"] = dict(BASE_RECIPE["stages"])
    for key, value in data.items():
        if key in ("model", "data", "task", "license", "description"):
            recipe[key] = value
        elif key == "stages":
            recipe["stages"].update(value)
        else:
            recipe["stages"][key] = value
    return recipe


def validate_examples(text: str) -> list[str]:
    """`zoo validate` every example; the failures as 'line N: message'."""
    zoo = [str(Path(sys.executable).parent / "zoo")] if (Path(sys.executable).parent / "zoo").exists() \
        else [sys.executable, "-m", "zoo"]
    failures = []
    with tempfile.TemporaryDirectory(prefix="kinds-doc-") as tmp:
        for n, (line, snippet) in enumerate(examples(text)):
            folder = Path(tmp) / f"example-{n}"
            folder.mkdir()
            try:
                recipe = as_recipe(snippet)
            except (ValueError, yaml.YAMLError) as e:
                failures.append(f"line {line}: not a valid example: {e}")
                continue
            path = folder / "recipe.yaml"
            path.write_text(yaml.safe_dump(recipe, sort_keys=False))
            proc = subprocess.run(zoo + ["validate", str(path)], cwd=folder, capture_output=True, text=True,
                                  env=dict(os.environ, ZOO_CACHE_DIR=str(folder / "cache"),
                                           ZOO_HOME=str(folder / "home")))
            if proc.returncode != 0:
                failures.append(f"line {line}: " + (proc.stderr.strip() or proc.stdout.strip()).replace("\n", "\n    "))
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the doc is stale or wrong")
    parser.add_argument("--no-examples", action="store_true", help="skip validating the YAML examples")
    parser.add_argument("--doc", type=Path, default=DOC)
    args = parser.parse_args()

    text = args.doc.read_text()
    blocks = generated()
    new, unknown = render(text, blocks)
    problems = [f"unknown generated block {k!r}" for k in unknown]
    present = {m.group("key") for m in BLOCK.finditer(text)}
    # a new kind (an entry point in pyproject.toml) needs its section in the doc
    problems += [f"{args.doc} has no block for {k!r}: add <!-- BEGIN GENERATED: {k} --> … <!-- END GENERATED: {k} -->"
                 for k in sorted(set(blocks) - present)]
    if new != text:
        if args.check:
            problems.append(f"{args.doc} is out of date: run scripts/gen_kinds_doc.py")
        else:
            tmp = args.doc.with_name(f".{args.doc.name}.tmp")
            tmp.write_text(new)
            tmp.replace(args.doc)
            print(f"updated the generated tables of {args.doc}")
    else:
        print(f"{args.doc}: generated tables are up to date")
    if not args.no_examples:
        failures = validate_examples(new)
        print(f"{len(examples(new))} YAML examples, {len(failures)} failing")
        problems += failures
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
