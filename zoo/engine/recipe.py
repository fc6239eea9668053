"""The recipe format: pydantic models, loading with positions, and errors that point at the YAML.

A recipe is validated in two steps, so errors can name the exact field:
1. the envelope (top level, each stage's ``kind/needs/config/cache/matrix/resources``, and the
   recipe-wide sections, each by the schema and ``check`` of the distribution that registers it:
   `zoo.engine.section_loader`; this module knows none of them);
2. each stage's ``config`` against its kind's static config class (``extra="forbid"``).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model, field_validator

from zoo.engine import kind_loader, section_loader
from zoo.errors import InvalidInput, RecipeError, UnknownKind
from zoo.engine.yamlpos import Located, dotted, load_with_positions
from zoo.section import RecipeSection, SectionError

SCHEMA_VERSION = 1
# A matrix stage becomes one instance per combination of axis values; past a few hundred it is a
# typo or an attack (4 axes x 60 values is 13 million instances), not a build matrix.
MAX_MATRIX_INSTANCES = 256  # per stage: the product of its axis sizes
MAX_INSTANCES = 4096  # per recipe, all stages together
MAX_STAGE_ID = 100
NAME_RE = r"^[a-z0-9][a-z0-9._-]*$"
STAGE_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
RESOURCE_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_.-]*$"


def resource_amount(name: str, amount: Any) -> float:
    """A stage's need of one Dask worker resource as a number: ``1``, ``0.5``, ``"8GB"`` (bytes)."""
    if not re.fullmatch(RESOURCE_NAME_RE, str(name)):
        raise ValueError(f"resource name {_short(repr(name))} must be a word (letters, digits, _ . -)")
    if isinstance(amount, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", amount)
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"resource {name}: {_short(repr(amount))} is not a number or a size "
                             "(units: KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
        amount = float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if not math.isfinite(amount) or amount <= 0:
        raise ValueError(f"resource {name}: the amount must be a positive number, not {amount}")
    return int(amount) if float(amount).is_integer() else float(amount)


class StageSpec(_Strict):
    """One entry of `stages:`; `config` is validated later against the kind's config class."""

    kind: str | None = Field(None, description="stage kind; defaults to the stage id when the id names a kind")
    needs: list[str] | None = Field(None, description="stage ids this stage depends on; default: the stage before it")
    config: dict[str, Any] = Field(default_factory=dict)
    cache: Literal["default", "recompute", "disable"] = "default"
    matrix: dict[str, list[str | int | float | bool]] | None = Field(
        None, description="expand into one stage per value, e.g. {build: [cpu-fp32, cpu-int8]}")
    description: str = ""
    resources: dict[str, float | int | str] = Field(
        default_factory=dict,
        description="what a worker must offer to run this stage on a Dask cluster, e.g. {GPU: 1, memory: 8GB} "
                    "(numbers; sizes with KB/MB/GB/TB or KiB/MiB/GiB/TiB become bytes); ignored by local runs, "
                    "not part of the cache key")

    @field_validator("resources", mode="before")
    @classmethod
    def _no_flags(cls, v):
        for name, amount in (v.items() if isinstance(v, dict) else ()):
            if isinstance(amount, bool):  # pydantic would take `true` for 1
                raise ValueError(f"resource {name}: a number or a size such as 8GB, not {str(amount).lower()}")
        return v

    @field_validator("resources")
    @classmethod
    def _resources(cls, v):
        return {str(name): resource_amount(name, amount) for name, amount in v.items()}

    @field_validator("matrix")
    @classmethod
    def _matrix_not_empty(cls, v):
        if v is not None:
            if not v:
                raise ValueError("matrix must have at least one axis")
            for axis, values in v.items():
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", axis):
                    raise ValueError(f"matrix axis {axis!r} must be an identifier")
                if not values:
                    raise ValueError(f"matrix axis {axis!r} has no values")
                if len(set(map(str, values))) != len(values):
                    raise ValueError(f"matrix axis {axis!r} has duplicate values")
        return v


class RecipeHead(_Strict):
    """The recipe's own fields before its sections; `recipe_model` adds the sections, then `stages`."""

    schema_version: Literal[1] = Field(description="recipe format version; this zoo reads 1")
    name: str = Field(pattern=NAME_RE, description="model name in the zoo (lowercase, digits, . _ -)")
    version: str = Field(pattern=r"^\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$", description="semantic version X.Y.Z")
    description: str = ""
    license: str = "unspecified"


def _stage_ids(v: dict[str, StageSpec]) -> dict[str, StageSpec]:
    for sid in v:
        if not re.fullmatch(STAGE_ID_RE, str(sid)):
            raise ValueError(f"stage id {_short(repr(sid))} may use letters, digits, '-' and '_' only")
        if len(sid) > MAX_STAGE_ID:  # it names folders and log files
            raise ValueError(f"stage id {_short(repr(sid))} is longer than {MAX_STAGE_ID} characters")
    return v


STAGES_FIELD = (Annotated[dict[str, StageSpec], Field(min_length=1), AfterValidator(_stage_ids)], ...)
GENERIC_FIELDS = (*RecipeHead.model_fields, "stages")  # every other top-level key is a registered section


def recipe_model() -> type[RecipeHead]:
    """The whole recipe file's model: the generic fields, each registered section (`zoo.sections`
    entry points, `zoo.engine.section_loader`) with its schema, then `stages` (the order errors
    are found in)."""
    return _recipe_model(tuple(section_loader.sections().items()))


@lru_cache(maxsize=4)
def _recipe_model(sections: tuple[tuple[str, type[RecipeSection]], ...]) -> type[RecipeHead]:
    fields: dict[str, Any] = {}
    for name, section in sections:
        if name in GENERIC_FIELDS:
            raise InvalidInput(f"recipe section {name!r} ({section.__module__}) has the name of a recipe's own field",
                               hint=f"a section may not be named {', '.join(GENERIC_FIELDS)}")
        schema = section.schema if section.default is not None else Optional[section.schema]
        fields[name] = (schema, section.default)
    return create_model("RecipeSpec", __base__=RecipeHead, __doc__="The whole recipe file (envelope).",
                        **fields, stages=STAGES_FIELD)


@dataclass
class Recipe:
    """A validated recipe: the envelope, each stage's validated config, and where it came from."""

    spec: RecipeHead  # a `recipe_model()` instance: the sections and `stages` are its attributes too
    path: Path
    digest: str
    instances: dict[str, list["Instance"]]  # stage id -> its instances (one unless it has a matrix)
    kinds: dict[str, str]  # stage id -> kind name
    located: Located

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def version(self) -> str:
        return self.spec.version

    def shared(self) -> dict[str, Any]:
        """The recipe-wide sections as plain data (None for an absent one), for kinds that declare them."""
        sections = [name for name in type(self.spec).model_fields if name not in GENERIC_FIELDS]
        return {name: section_loader.as_plain(getattr(self.spec, name)) for name in sections}


def load(path: str | Path) -> Recipe:
    """Parse and fully validate a recipe, raising RecipeError/UnknownKind that point at the YAML."""
    from zoo.engine.hashing import digest_bytes

    file = Path(path)
    located = load_with_positions(file)
    if not isinstance(located.data, dict):
        raise located.error((), "a recipe must be a YAML mapping with `schema_version`, `name`, `version` and `stages`",
                            hint="see recipes/lenet-digits.yaml for a complete example")
    model = recipe_model()
    try:
        spec = model.model_validate(located.data)
    except ValidationError as e:
        raise _pydantic_error(e, located, (), model) from None
    _refuse_non_finite(spec.model_dump(by_alias=True, exclude={"stages"}, exclude_unset=True), located, ())
    _check_sections(spec, file, located)
    _check_matrix_sizes(spec, located)

    instances: dict[str, list[Instance]] = {}
    kind_names: dict[str, str] = {}
    for sid, stage in spec.stages.items():
        kind_name = stage.kind or sid
        if stage.kind is None and not kind_loader.is_kind(sid):
            close = difflib.get_close_matches(sid, list(kind_loader.available()), n=1)
            hint = (f"add `kind: {close[0]}`" if close else "add `kind: KIND` to the stage") + \
                f" (known kinds: {', '.join(sorted(kind_loader.available()))})"
            raise located.error(("stages", sid), f"stage {sid!r} has no `kind` and its id is not a kind name",
                                key=True, hint=hint)
        try:
            kind = kind_loader.get(kind_name)
        except UnknownKind as e:
            raise located.error(("stages", sid, "kind") if stage.kind else ("stages", sid), e.message,
                                hint=e.hint, key=stage.kind is None) from None
        kind_names[sid] = kind_name
        instances[sid] = []
        for matrix in _expand_matrix(stage.matrix):
            raw = _interpolate(stage.config, matrix, located, ("stages", sid, "config"))
            try:
                config = kind.Config.model_validate(raw)
            except ValidationError as e:
                raise _pydantic_error(e, located, ("stages", sid, "config"), kind.Config) from None
            # strings such as "1e999" or "inf" pass a float field as infinity; a kind's own defaults are not checked
            given = config.model_dump(by_alias=True, exclude_unset=True) if isinstance(config, BaseModel) else config
            _refuse_non_finite(given, located, ("stages", sid, "config"))
            iid = sid if not matrix else f"{sid}[{','.join(str(v) for v in matrix.values())}]"
            instances[sid].append(Instance(id=iid, base_id=sid, kind=kind_name, matrix=matrix, config=config))
    _infer_sections(spec, file, located, kind_names)
    return Recipe(spec=spec, path=file.resolve(), digest=digest_bytes(located.text.encode()),
                  instances=instances, kinds=kind_names, located=located)


@dataclass(frozen=True)
class Instance:
    """One concrete stage after matrix expansion (``quantize[cpu-int8]``), with its validated config."""

    id: str
    base_id: str
    kind: str
    matrix: dict[str, str]
    config: Any


def _check_sections(spec: RecipeHead, file: Path, located: Located) -> None:
    """Each given section's own `check` (files beside the recipe, other registries), its refusal
    placed at the field it names."""
    for name in type(spec).model_fields:
        value = getattr(spec, name)
        if name in GENERIC_FIELDS or value is None:
            continue
        try:
            section_loader.get(name).check(value, file.resolve().parent)
        except SectionError as e:
            raise located.error((name, *e.field), e.message, hint=e.hint) from None


def _infer_sections(spec: RecipeHead, file: Path, located: Located, kinds: dict[str, str]) -> None:
    """Give each section the recipe leaves out (and that has no default) the value its `infer` tells
    from the other sections; a RecipeError when it cannot, the section says it is needed
    (`missing_hint`) and a stage's kind reads it."""
    absent = [name for name in type(spec).model_fields
              if name not in GENERIC_FIELDS and getattr(spec, name) is None]
    for name in absent:
        section = section_loader.get(name)
        plain = {other: section_loader.as_plain(getattr(spec, other))
                 for other in type(spec).model_fields if other not in GENERIC_FIELDS}
        try:
            value = section.infer(plain, file.resolve().parent)
        except SectionError as e:
            raise located.error(e.field, e.message, hint=e.hint) from None  # its field: a path from the top
        if value is not None:
            setattr(spec, name, TypeAdapter(section.schema).validate_python(value))
            continue
        if section.missing_hint is None:  # an optional section
            continue
        for sid, kind_name in kinds.items():
            if any(f == name or f.startswith(name + ".") for f in kind_loader.get(kind_name).shared):
                raise located.error(("stages", sid), f"the recipe has no `{name}:`, which stage {sid!r} ({kind_name}) "
                                    "reads, and nothing else in the recipe tells it", key=True,
                                    hint=section.missing_hint)


def _check_matrix_sizes(spec: RecipeHead, located: Located) -> None:
    """Refuse a matrix (or a recipe) with more instances than the limits, before expanding anything."""
    total = 0
    for sid, stage in spec.stages.items():
        sizes = [len(values) for values in (stage.matrix or {}).values()]
        count = math.prod(sizes)
        if count > MAX_MATRIX_INSTANCES:
            raise located.error(("stages", sid, "matrix"),
                                f"the matrix of stage {sid!r} expands to {count:,} instances "
                                f"({' x '.join(map(str, sizes))}); at most {MAX_MATRIX_INSTANCES} are allowed",
                                hint="split the stage into several, or drop axis values", key=True)
        total += count
        if total > MAX_INSTANCES:
            raise located.error(("stages", sid), f"the recipe expands to more than {MAX_INSTANCES:,} stage instances",
                                hint="split the recipe, or use smaller matrices", key=True)


def _refuse_non_finite(value: Any, located: Located, path: tuple) -> None:
    """A RecipeError at the first infinite or NaN float in `value` (validated data, walked iteratively)."""
    todo = [(value, path)]
    while todo:
        current, where = todo.pop()
        if isinstance(current, float) and not math.isfinite(current):
            raise located.error(where, f"{dotted(where)}: the value reads as {current}, not a finite number",
                                hint="numbers must be finite (\"1e999\" and \"inf\" read as infinity)")
        if isinstance(current, dict):
            todo.extend((v, where + (k,)) for k, v in current.items())
        elif isinstance(current, (list, tuple)):
            todo.extend((v, where + (i,)) for i, v in enumerate(current))


def _expand_matrix(matrix: dict[str, list] | None) -> list[dict[str, str]]:
    """The cartesian product of the matrix axes, in declaration order ([{}] without a matrix)."""
    combos: list[dict[str, str]] = [{}]
    for axis, values in (matrix or {}).items():
        combos = [{**c, axis: str(v)} for c in combos for v in values]
    return combos


_VAR = re.compile(r"\$\{matrix\.([A-Za-z_][A-Za-z0-9_]*)\}")


def _interpolate(value: Any, matrix: dict[str, str], located: Located, path: tuple) -> Any:
    """Replace ``${matrix.AXIS}`` in config strings with this instance's value."""
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(1) not in matrix:
                raise located.error(path, f"{m.group(0)} names no matrix axis of this stage",
                                    hint=f"axes: {', '.join(matrix) or 'none (add `matrix:`)'}")
            return matrix[m.group(1)]
        return _VAR.sub(sub, value)
    if isinstance(value, dict):
        return {k: _interpolate(v, matrix, located, path + (k,)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, matrix, located, path + (i,)) for i, v in enumerate(value)]
    return value


def _pydantic_error(err: ValidationError, located: Located, prefix: tuple, model: type[BaseModel]) -> RecipeError:
    """The first validation error, placed at its YAML position, with a suggestion."""
    # a misspelt key also makes a required one "missing": report the misspelling, it is the cause
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    first = errors[0]
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-")))
    path = prefix + loc
    where = dotted(path)
    kind = first["type"]
    if kind == "extra_forbidden":
        field_name = _short(str(loc[-1]))
        allowed = _allowed_fields(model, loc[:-1])
        close = difflib.get_close_matches(field_name, allowed, n=1)
        parent = dotted(path[:-1]) if path[:-1] else "the top level"
        msg = f"unknown key {field_name!r} in {parent}"
        if close:
            msg += f" — did you mean {close[0]!r}?"
        hint = f"allowed keys: {', '.join(allowed)}" if allowed else None
        return located.error(path, msg, key=True, hint=hint)
    if kind == "missing":
        return located.error(path[:-1], f"missing required key {loc[-1]!r} in {dotted(path[:-1]) if path[:-1] else 'the top level'}",
                             hint=f"add `{loc[-1]}:`")
    value = first.get("input")
    shown = f" (got {_short(repr(value))})" if not isinstance(value, (dict, list)) else ""
    return located.error(path, f"{where}: {first['msg']}{shown}", hint=_type_hint(first))


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _type_hint(error: dict) -> str | None:
    ctx = error.get("ctx") or {}
    if "expected" in ctx:
        return f"expected {ctx['expected']}"
    if "pattern" in ctx:
        return f"the value must match {ctx['pattern']}"
    return None


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (nested) model at `loc`, for 'did you mean' suggestions."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        fields = {f.alias or n: f for n, f in getattr(current, "model_fields", {}).items()}
        field = fields.get(part)
        if field is None:
            # inside a dict[str, Model]: the key is a stage id, the model is the value type
            current = _model_in(current) if not hasattr(current, "model_fields") else None
            if current is None:
                return []
            continue
        current = _model_in(field.annotation)
    if current is not None and hasattr(current, "model_fields"):
        return [f.alias or n for n, f in current.model_fields.items()]
    return []


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as `dict[str, StageSpec]` or `X | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def json_schema() -> dict[str, Any]:
    """JSON Schema for recipes (for yaml-language-server), with each kind's config schema."""
    schema = recipe_model().model_json_schema()
    defs = schema.setdefault("$defs", {})
    alternatives = []
    for name in sorted(kind_loader.available()):
        try:
            cls = kind_loader.get(name)
        except UnknownKind:
            continue
        sub = cls.Config.model_json_schema(ref_template="#/$defs/{model}")
        for k, v in sub.pop("$defs", {}).items():
            defs[k] = v
        title = f"{name}Config"
        defs[title] = sub
        alternatives.append({
            "if": {"anyOf": [{"properties": {"kind": {"const": name}}, "required": ["kind"]}]},
            "then": {"properties": {"config": {"$ref": f"#/$defs/{title}"}}},
        })
    stage = defs["StageSpec"]
    stage["allOf"] = alternatives
    schema["$id"] = "https://zoo.dev/schema/recipe-v1.json"
    schema["title"] = "zoo recipe"
    return schema
