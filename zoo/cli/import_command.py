"""`zoo import SOURCE [--name N --version V] [--shape NAME=DIMS]`: a zoo version from an existing model.

Only parses arguments, calls `zoo.release.importer.import_model`, and prints.
"""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from zoo.cli.jsonout import emit


def register(app: typer.Typer) -> None:
    app.command("import")(import_cmd)


def import_cmd(
    source: str = typer.Argument(..., show_default=False,
                                 help="A local .onnx file, https://...#sha256=<64 hex>, "
                                      "hf://org/repo[@revision][/file.onnx] or a catalog name "
                                      "such as torchvision:resnet18."),
    name: Optional[str] = typer.Option(None, "--name", help="Name in the zoo [default: from the file or repo name]."),
    version: Optional[str] = typer.Option(None, "--version",
                                          help="Version [default: the hf:// revision when it is a version, else 1.0.0]."),
    shape: Optional[List[str]] = typer.Option(None, "--shape",
                                              help="NAME=D1,D2,...: sizes after the batch axis of an input the model "
                                                   "leaves dynamic (for verify's random inputs); repeatable."),
    as_json: bool = typer.Option(False, "--json", help="Print a machine-readable JSON summary."),
) -> None:
    """Make a zoo version from an existing model, without writing a recipe: the generated recipe
    (export, verify, deploy) runs through the engine and is published in the version with its lockfile."""
    from zoo.cli.progress import NullProgress, PlainProgress
    from zoo.errors import InvalidInput
    from zoo.release.importer import import_model, parse_shape

    shapes = dict(parse_shape(s) for s in shape or ())
    if len(shapes) != len(shape or ()):
        raise InvalidInput("--shape names an input twice", hint="give each input's sizes once")
    progress = NullProgress() if as_json else PlainProgress(stream=sys.stderr)
    with progress:
        result = import_model(source, name=name, version=version, shapes=shapes, on_update=progress.update)
    if as_json:
        emit(result.to_json())
        return
    src = result.source
    pinned = ", ".join(f"{k} {src[k]}" for k in ("revision", "sha256", "license") if src.get(k))
    print(f"source: {src.get('url') or src.get('path') or src['source']}" + (f" ({pinned})" if pinned else ""))
    ran = f"{len(result.executed)} stage(s) ran" if result.executed else "every stage cached"
    print(f"recipe: {result.recipe} ({ran}); in the version as {', '.join(sorted(result.files))}")
    if result.created:
        print(f"imported {result.ref}; to rebuild it: `zoo pull {result.ref} --to DIR` places its recipe and "
              "lockfile, `zoo repro DIR/import/recipe.yaml --check` compares the bytes", flush=True)
    else:
        print(f"{result.ref} is already in the local zoo with the same content", flush=True)
