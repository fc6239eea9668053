"""Commands for reproducible releases: `zoo repro`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("repro")(repro)


def repro(
    recipe: Path = typer.Argument(..., help="Path to a recipe YAML file (with its lockfile beside it).",
                                  show_default=False),
    check: bool = typer.Option(False, "--check", help="Rebuild without the cache and compare with the lockfile."),
    stage: Optional[List[str]] = typer.Option(None, "--stage", "-s", help="Only rebuild these stages."),
    jobs: int = typer.Option(1, "--jobs", "-j", min=1),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Rebuild a recipe's stages bit for bit and say, per stage, whether the outputs are identical."""
    from zoo import repro as repro_mod
    from zoo.errors import InvalidInput

    if not check:
        raise InvalidInput("zoo repro needs --check", hint=f"zoo repro {recipe} --check")
    report = repro_mod.check(recipe, stages=stage or None, cache_dir=cache_dir, jobs=jobs)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        for s in report.stages:
            print(f"{s.id:<24} {s.status}")
            for line in s.details:
                print(f"    {line}")
        print(f"\n{report.recipe}: " + ("every rebuilt stage is bit-identical to the lockfile" if report.ok
                                         else "rebuild DIFFERS from the lockfile"))
    sys.stdout.flush()
    raise typer.Exit(0 if report.ok else 1)
