"""The contract between the recipe parser and a recipe-wide section (``model:``, ``data:``, ``task:``).

The engine holds only a recipe's generic parts (name, version, stages, …). Every other top-level
key is a section a distribution registers, exactly as it registers stage kinds:
``[project.entry-points."zoo.sections"] mysection = "mypkg.sections:MySection"`` (the entry
point's name is the key in the recipe). zoo's own ``model``, ``data`` and ``task`` are the
entry points of its distribution; a plugin brings its own the same way, and its kinds read it
through their ``shared`` declarations (``"mysection"`` or ``"mysection.field"``), so a section's
values enter exactly the keys of the kinds that declare them.

A section is a class deriving from `RecipeSection` that declares:

- ``schema``: a pydantic model (a mapping in the recipe; give it ``extra="forbid"`` so a
  misspelt key is an error with a did-you-mean), or the type of a plain value, which may be
  ``Annotated`` with a pydantic ``Field`` (pattern, description) and validators;
- ``default``: the value a recipe without the section gets (None: the section is absent);

and may override ``infer`` to give a recipe that leaves the section out a value told from its
other sections (``task:`` from the data and the model), when ``default`` is None, and set
``missing_hint`` when a kind that reads the section (its ``shared``) cannot do without it: a recipe that
neither gives nor infers it is then refused with that hint;
``check`` for what the value alone cannot tell (a file beside the recipe, another
registry), and ``references`` to name the models of the zoo its value refers to (``model.from``),
which the engine resolves and pins for the kinds that declare those fields (zoo/engine/parents.py;
a kind reads them as ``context.references``, `zoo.stage.PinnedModel`). Its module is imported by every ``zoo validate``, ``plan`` and cached run, so it must be
light: pydantic and the standard library, heavy imports inside ``check``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar


class SectionError(ValueError):
    """A section's value is refused by its ``check``; the recipe's error points at ``field``.

    ``field`` is the path inside the section (``("tokenizer", "path")``; empty for the section as a
    whole), ``hint`` the line printed under the error.
    """

    def __init__(self, message: str, field: tuple[str | int, ...] = (), hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = tuple(field)
        self.hint = hint


class RecipeSection:
    """Base class of a recipe-wide section; see the module docstring."""

    schema: ClassVar[Any]
    default: ClassVar[Any] = None

    @classmethod
    def check(cls, value: Any, recipe_dir: Path) -> None:
        """Refuse a validated `value` (never None) with `SectionError` for what its schema cannot tell;
        `recipe_dir` is the recipe's folder, which relative paths are read from."""

    @classmethod
    def infer(cls, sections: dict[str, Any], recipe_dir: Path) -> Any:
        """The value of a recipe that leaves this section out, told from its other `sections` (plain
        data, each already checked; None for an absent one), or None when they cannot tell. Called
        only for a section whose `default` is None; the value is validated by `schema`. A `SectionError`
        raised here names its `field` from the recipe's top (``("data", "label")``)."""
        return None

    # set for a section a kind cannot do without: a recipe that neither gives nor infers it while a
    # stage's kind reads it (its `shared`) is refused with this hint; None: the section is optional
    missing_hint: ClassVar[str | None] = None

    @classmethod
    def references(cls, value: Any) -> dict[str, str]:
        """The zoo models `value` names: {field, as the recipe writes it inside the section (``from``):
        ``zoo:NAME@VERSION`` or ``zoo:NAME@VERSION#BUILD``}. `value` is plain data (never None), cut
        to the fields one kind declares, so a kind is given exactly the models its key holds."""
        return {}
