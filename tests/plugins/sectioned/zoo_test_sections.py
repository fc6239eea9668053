"""A third-party package's own recipe-wide sections and the kind that reads one, registered through
the `zoo.sections` and `zoo.stages` entry-point groups (the .dist-info folder beside this file).

Not on the tests' path by default (its sections would join every test recipe's top-level keys):
`tests/test_sections.py` puts this folder on sys.path and PYTHONPATH for the tests that use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from zoo.section import RecipeSection, SectionError
from zoo.stage import KindConfig, StageKind


class LabelsSpec(BaseModel):
    """`labels:` — the class names a model's card shows, and where they came from."""

    model_config = ConfigDict(extra="forbid")

    names: list[str] = Field(min_length=1, description="the class names, in output order")
    language: str = Field("en", pattern=r"^[a-z]{2}$", description="ISO 639-1 code of the names")
    source: str | None = Field(None, description="a file the names were taken from, relative to the recipe")


class Labels(RecipeSection):
    schema = LabelsSpec

    @classmethod
    def check(cls, value: LabelsSpec, recipe_dir: Path) -> None:
        if value.source is not None and not (recipe_dir / value.source).is_file():
            raise SectionError(f"labels.source {value.source!r} is not a file beside the recipe", ("source",),
                               hint="name the file the names were taken from, relative to the recipe")
        if len(set(value.names)) != len(value.names):
            raise SectionError("labels.names has a name twice", ("names",))


class StampNote(RecipeSection):
    """A plain value with a default: `stamp_note: TEXT`."""

    schema = Annotated[str, Field(max_length=40, description="a short note")]
    default = "none"


class Labeler(StageKind):
    """Writes the recipe's `labels.names`, one a line: the only part of the section its key holds."""

    name = "labeler"
    version = "1"
    Config = KindConfig
    shared = ("labels.names",)
    outputs = ("labels",)

    def run(self, inputs, config, context):
        out = context.output_path("labels.txt")
        out.write_text("".join(f"{name}\n" for name in context.shared["labels"]["names"]))
        return {"labels": out}
