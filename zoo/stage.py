"""The contract between the engine and a stage kind.

A stage kind is a class deriving from `StageKind` that declares:

- ``name``: the kind's name as used in recipes (``kind: quantize``);
- ``version``: bump it whenever the kind's output bytes change; it enters the kind's keys and lock records;
- ``Config``: a static pydantic model (derive from `KindConfig`, which forbids unknown keys);
- ``tools``: distribution names whose installed versions enter the cache key (read with
  importlib.metadata, so nothing heavy is imported to compute a key); a kind whose tools depend on
  the recipe (export: the exporter of ``model.framework``) overrides ``tools_used`` to name only
  the ones this stage uses, so another version of a package the model never touched changes
  neither its key nor its lock record;
- ``shared``: what the kind reads of the recipe-wide sections (zoo's ``model``, ``data``, ``task``
  and any a plugin registers: `zoo/section.py`): a whole section (``"data"``, ``"task"``) or single
  fields (``"model.arch"``). Exactly those values enter the cache key,
  and ``context.shared`` holds exactly those (reading anything else raises `UndeclaredField`),
  so a metadata edit (``model.task``) reruns only the kinds that read it;
- ``outputs``: the names of the outputs ``run`` returns;
- ``recipe_fields``: recipe identity fields (name, version, description, license, digest) the kind
  writes into its outputs; their values enter the key (most kinds need none, so bumping a
  recipe's version does not retrain);
- ``lineage``: True if the kind needs the lock records of all its ancestors (``context.lineage``,
  e.g. to embed provenance); the digests of those records (``Upstream.record``) then enter its key;

and implements ``run(inputs, config, context) -> {output name: path inside context.out_dir}``.
Metrics go in ``context.metrics``. A kind that reads an upstream stage by its id
(``inputs.stage(ID)``, an id its config names) says so in ``stage_references``, so a recipe that
forgot that stage in ``needs:`` fails before anything runs; and what it can tell from the files
the recipe names before anything runs (an imported ONNX file's inputs) in ``preflight``, raising
`zoo.errors.FieldError` at the recipe's field. A kind may also override ``dependencies`` to name files
(user code, datasets) whose content must enter the cache key, and ``on_cached`` to redo an effect
of its own outside the cache when the stage is found cached (publishing a release is the engine's:
see ``release_output``).

The engine knows no kind by name; what it shows or checks after a run, a kind says through these
(all optional; the built-in verify and deploy use them, and a plug-in kind can do the same):

- effects: what ``run`` or ``on_cached`` did outside the cache goes in ``context.effects`` as an
  `Effect` (``Effect("published", "alexnet@1.0.0", evidence=...)``). The run summary prints each
  (``published alexnet@1.0.0``); effects are never cached; a no-op fast answer (zoo/engine/fastpath.py)
  is given only while every ``evidence`` file still exists;
- ``report(stage_id, metrics, effects)``: tables (`ReportTable`) the run summary prints after
  the stage ran (verify's gates, deploy's published builds); the CLI lays them out;
- ``gates(metrics)``: the quality gates a stage checked (`GateOutcome`); ``zoo release`` requires
  every one to pass. None (the default) means the kind checks no gates;
- ``release_output(config)``: the output holding the version's release folder (its files and its
  ``zoo-manifest.json``, written with `zoo.manifest`), when the stage releases a version (deploy
  with ``publish: true``). The kind only declares it: the engine publishes that folder to this
  machine's local zoo once the stage completed, ran or found cached (never under ``zoo repro``,
  nor bytes ``--frozen`` refuses), and records the effect `PUBLISHED` (``published alexnet@1.0.0``;
  `published_manifest` reads it back); ``publication(release, config, context)`` may hand it a
  folder that adds what the run measured but the release must not hold (deploy: timings).
  ``zoo release`` ships what the one such stage published. ``release_files`` names the
  version-level files that release must carry (``zoo.lock``...), and ``check_release(manifest,
  read)`` lists problems with it (deploy: provenance subjects that do not match the builds);
- ``equivalence(locked, rebuilt, config, context)``: whether outputs rebuilt on a CPU of another
  platform class (zoo/host.py) are equivalent to the locked ones (`Equivalence`), for
  ``zoo repro --check``; `context` (`EquivalenceContext`) gives the recipe's shared sections
  (the data, to judge quality on its held-out split) and the quality tolerance. None (the default)
  means the kind cannot say, so only identical bytes pass. The built-in kinds judge ONNX models by
  their outputs and training by held-out quality (zoo_stages/lib/quality/equivalence.py).

Zoo models a recipe names (``model.from: zoo:NAME@VERSION``): the engine resolves them, never the
kind. A recipe section says which of its fields name one (`zoo.section.RecipeSection.references`);
for a kind that declares such a field in ``shared``, the engine takes the model from the local zoo
(its files checked against their sha256; offline: a version the zoo lacks must be published or
pulled first) and pins what is read of it, before the stage's key is computed
(zoo/engine/parents.py; resolved when the kind first reads it). The kind gets it as a `PinnedModel` in ``ctx.references`` /
``context.references``, keyed by the field as the recipe writes it (``"model.from"``; absent when
the recipe leaves the field out), reads only the files it names, and lists its ``files`` among its
``dependencies`` where it reads them: so the model's bytes enter the stage's key under names that
are the same on every machine, and travel to a Dask worker whose zoo lacks the version, where the
engine resolves it again from the pin. A kind imports nothing of the model zoo (``zoo.registry``).

Kinds must import heavy libraries (torch, onnx, onnxruntime) inside ``run``, never at module
level: the engine imports kind modules to compute cache keys, and a fully cached run must not
pay for those imports.

A kind's code enters its cache key without being declared: the source of its module and of every
module of its own package that it imports, directly or not, at module level or inside functions
(found by reading the source, zoo.engine.import_closure), so editing a helper reruns the stages that
use it. zoo's own modules are not in it: what a kind may use of zoo (this module, `zoo.errors`,
`zoo.files`, `zoo.pathsafety`, ...) is the kind interface, and `KIND_EPOCH` stands for it in every
key. The few zoo modules whose code computes a kind's bytes are named in `KEYED_ZOO_MODULES` and
enter the keys of the kinds that import them.

Keys, lock records and stamps: a stage's key is its lock record (kind, kind version, config,
declared shared values, matrix, input digests, the files it reads, the tools it uses, declared
recipe fields, ancestor records) plus its code and `KIND_EPOCH`. The lockfile holds the record and
the output digests, not the key, so code that changes no byte leaves every lockfile as it was.
What a kind writes into its outputs may come from the record (``context.record``, its digest),
never from ``context.key``: a rerun for a code change must be able to give the same bytes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from zoo.errors import InvalidInput, UnsafePath

if TYPE_CHECKING:
    from zoo.manifest import Manifest

# the engine's effect of publishing a stage's declared release (`StageKind.release_output`) to the local zoo
PUBLISHED = "published"

# The version of the contract between the engine and the kinds, in every stage key instead of
# zoo's own code. Bump it when this interface changes in a way that can change what a kind
# writes, or when an on-disk format a kind writes through zoo changes its bytes (the manifest's or
# the lockfile's serialisation, the YAML emitter of `zoo.yamlio`, the digests of
# `zoo.engine.hashing`): every stage of every recipe reruns once, as after a kind version bump.
# Changes to zoo that shape no kind's bytes (the registry, the downloader, the CLI, the runner)
# leave it alone, and so every key, cache entry and lockfile.
KIND_EPOCH = 1

# zoo modules whose code computes a kind's output bytes (the ONNX → torch converter, with its quantized ops, that turns a
# `model.from` parent into the network train fine-tunes; the protobuf field walker that rewrites
# an ONNX file's metadata): followed by the key closure like the kind's own package, so an edit
# reruns the stages whose kinds import them. Everything else of zoo a kind imports is interface.
KEYED_ZOO_MODULES = ("zoo.onnx_to_torch", "zoo.onnx_to_torch_quant", "zoo.onnxwire", "zoo.decoder_io", "zoo.textgen")


class KindConfig(BaseModel):
    """Base for every kind's config: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class RecipeInfo:
    """What a stage may know about the recipe it belongs to."""

    name: str
    version: str
    description: str
    license: str
    path: Path
    digest: str

    @property
    def dir(self) -> Path:
        return self.path.parent


@dataclass(frozen=True)
class PinnedModel:
    """A model of the local zoo that a recipe field names (``model.from: zoo:NAME@VERSION``), as the
    engine resolved it for a stage (see the module docstring): one ONNX build, its files checked
    against their sha256, and what is read of its manifest. Paths are read-only."""

    ref: str  # NAME@VERSION
    build: str  # the build the recipe names, or the version's float32 ONNX build
    path: Path  # the build's ONNX file
    sha256: str  # of that file
    license: str  # the version's
    outputs: tuple[int | str | None, ...]  # the shape of the build's first output
    # what stands for the model in a key: the pin (what is read of its manifest), the ONNX file and
    # its sidecars (external data); a kind that reads the model lists them in `dependencies`
    files: tuple[Path, ...] = ()

    @property
    def source(self) -> str:
        """The model as a recipe and a lineage name it: ``zoo:NAME@VERSION``."""
        return f"zoo:{self.ref}"


@dataclass(frozen=True)
class Upstream:
    """The result of one stage this stage needs. Paths are read-only."""

    stage_id: str
    kind: str
    outputs: Mapping[str, Path]
    metrics: Mapping[str, Any]
    matrix: Mapping[str, str] = field(default_factory=dict)
    key: str = ""  # its cache key: never write it into an output (see the module docstring)
    record: str = ""  # the digest of its lock record: what provenance may name


class Inputs:
    """The results of the stages a stage needs, in the order of its `needs`."""

    def __init__(self, upstream: list[Upstream]):
        self._upstream = list(upstream)

    def __iter__(self) -> Iterator[Upstream]:
        return iter(self._upstream)

    def __len__(self) -> int:
        return len(self._upstream)

    def stage(self, stage_id: str) -> Upstream:
        """The upstream result of stage `stage_id` (e.g. ``quantize[cpu-int8]``)."""
        for up in self._upstream:
            if up.stage_id == stage_id:
                return up
        raise InvalidInput(f"this stage does not need a stage called {stage_id!r}",
                           hint=f"add {stage_id!r} to its `needs:`")

    def of_kind(self, kind: str) -> list[Upstream]:
        """All upstream results produced by stages of `kind`."""
        return [up for up in self._upstream if up.kind == kind]

    def all(self, name: str) -> dict[str, Path]:
        """Every upstream output called `name`, keyed by stage id (fan-in)."""
        return {up.stage_id: up.outputs[name] for up in self._upstream if name in up.outputs}

    def one(self, name: str) -> Path:
        """The single upstream output called `name`; an error if none or several provide it."""
        found = self.all(name)
        if len(found) == 1:
            return next(iter(found.values()))
        if not found:
            have = sorted({n for up in self._upstream for n in up.outputs}) or ["nothing"]
            raise InvalidInput(f"no upstream stage provides an output called {name!r} (upstream provides: {', '.join(have)})",
                               hint="check this stage's `needs:`")
        raise InvalidInput(f"several upstream stages provide {name!r}: {', '.join(found)}",
                           hint="name the one to use in the stage config")

    def maybe(self, name: str) -> Path | None:
        """Like `one`, but None when no upstream stage provides `name`."""
        found = self.all(name)
        return self.one(name) if found else None


class UndeclaredField(LookupError):
    """A kind read a recipe-wide section or field that its ``shared`` does not declare.

    A bug in the kind (the value is not in its cache key), not a user error: the message names
    the declaration to add.
    """


class SharedView(dict):
    """Recipe-wide values cut down to what a kind declares (``context.shared`` and its sections).

    A plain dict of the declared values, except that reading a section or field the kind did not
    declare raises `UndeclaredField` instead of looking absent (``.get`` would otherwise hand a
    kind its default, silently). Copies (``dict(view)``) hold only the declared values.
    """

    def __init__(self, values: Mapping[str, Any] = (), *, kind: str = "", where: str = "",
                 undeclared: tuple[str, ...] | frozenset[str] = ()):
        super().__init__(values)
        self.kind, self.where, self.undeclared = kind, where, frozenset(undeclared)

    def __missing__(self, key: Any) -> Any:
        self._refuse(key)
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        self._refuse(key)
        return default

    def _refuse(self, key: Any) -> None:
        if key in self.undeclared:
            name = f"{self.where}.{key}" if self.where else str(key)
            raise UndeclaredField(f"kind {self.kind!r} reads the recipe's `{name}`, which its `shared` does not "
                                  f"declare (so it is not in the stage's cache key): add {name!r} to its `shared`")


@dataclass(frozen=True)
class Effect:
    """Something a stage did outside the cache: ``Effect("published", "alexnet@1.0.0", evidence)``.

    `kind` is a past-tense verb and `ref` what it acted on; the run summary prints ``kind ref``.
    `evidence`: files that exist for as long as the effect holds (the local zoo's manifest and
    blobs of a published version). A no-op fast answer to the next `zoo run` requires every one of
    them, so a removed one sends the run down the full path, where ``on_cached`` redoes the effect.
    """

    kind: str
    ref: str
    evidence: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.kind} {self.ref}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ref": self.ref, "evidence": list(self.evidence)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Effect:
        return cls(kind=str(data["kind"]), ref=str(data["ref"]),
                   evidence=tuple(str(p) for p in data.get("evidence") or ()))


def published_manifest(effect: Effect) -> Manifest:
    """The manifest of the version a `PUBLISHED` effect names, as this machine's local zoo stores it
    (the effect's first evidence file: the engine, which publishes, puts it there). OSError or
    ValueError when the version is gone or its manifest does not parse."""
    from zoo.manifest import read_manifest

    if effect.kind != PUBLISHED or not effect.evidence:
        raise ValueError(f"{effect} is not the publication of a version")
    return read_manifest(Path(effect.evidence[0]))


@dataclass(frozen=True)
class Equivalence:
    """What `StageKind.equivalence` found: equivalent within the kind's tolerance or not, with one
    line per compared file or measure (which kind of equivalence, its figures, or why not)."""

    equivalent: bool
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class GateOutcome:
    """One quality gate a stage checked (what `StageKind.gates` returns)."""

    gate: str  # as the recipe writes it, e.g. "cpu-int8.accuracy_drop <= 0.01"
    value: float | None  # the measured value; None when it could not be measured
    passed: bool
    implicit: bool = False  # added by the kind, not the recipe: checked and released, not in the run summary


@dataclass(frozen=True)
class Column:
    """One column of a `ReportTable`: its header and how its cells are shown."""

    header: str
    align: Literal["left", "right"] = "left"
    # numbers: a format spec (".4f"), or "size" for a byte count ("217.6 MB"); other cells show as str()
    format: str = ""
    missing: str = "-"  # shown for None (and, in a formatted column, for anything that is not a number)


@dataclass(frozen=True)
class ReportTable:
    """A table the run summary prints for a stage (`StageKind.report`); the CLI lays it out.

    A table without columns prints its title only (a one-line note).
    """

    title: str
    columns: tuple[Column, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()
    show_header: bool = True


@dataclass
class StageContext:
    """Everything a running stage may use besides its inputs and config."""

    stage_id: str
    out_dir: Path
    work_dir: Path
    recipe: RecipeInfo
    shared: Mapping[str, Any]
    matrix: Mapping[str, str]
    threads: int = 1
    key: str = ""  # the cache key: for logs and the engine, never for output bytes (it holds code)
    record: str = ""  # the digest of this stage's lock record (key less code): what stamps may name
    publish: bool = True  # False while `zoo repro` rebuilds: no side effects outside out_dir
    lineage: Mapping[str, Any] = field(default_factory=dict)  # ancestor id -> lock record (kinds with lineage=True)
    # the zoo models the kind's declared fields name, by field ("model.from"): see the module docstring
    references: Mapping[str, PinnedModel] = field(default_factory=dict)
    # under `zoo run --frozen` / `zoo release`: the lockfile's output digests for this key on this
    # platform (see `lock_mismatch`); None otherwise
    locked_outputs: Mapping[str, str] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    effects: list[Effect] = field(default_factory=list)  # what the stage did outside the cache (not cached)
    # in `on_cached` and `publication` only: the upstream results, as `run` got them (outputs in this
    # machine's cache, each with the metrics of its entry), so an effect can use what was measured upstream
    inputs: Inputs | None = None
    # in `on_cached` and `publication` only: the metrics of the stage's entry (what the run that made it measured)
    entry_metrics: Mapping[str, Any] | None = None
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("zoo.stage"))

    def resolve(self, path: str | Path) -> Path:
        """A path from the recipe, relative to the recipe's folder (absolute paths kept)."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.recipe.dir / p)

    def lock_mismatch(self, outputs: Mapping[str, str | Path]) -> list[str]:
        """Under `--frozen`, the names among `outputs` ({name: path}) whose bytes differ from the
        lockfile's record of this stage on this platform; [] when the run is not frozen or all match.

        A kind with an effect of its own outside the cache asks before it acts, so a run the lockfile
        refuses leaves nothing outside the cache behind (the engine does so for the release it publishes).
        """
        if self.locked_outputs is None:
            return []
        from zoo.engine.cache import output_digest

        return [name for name, path in outputs.items() if self.locked_outputs.get(name) != output_digest(Path(path))]

    def output_path(self, relative: str) -> Path:
        """A path inside out_dir, refusing names that would escape it."""
        target = (self.out_dir / relative).resolve()
        if not target.is_relative_to(self.out_dir.resolve()):
            raise UnsafePath(f"output {relative!r} escapes the stage's output folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        return target


@dataclass(frozen=True)
class KeyContext:
    """What a kind may use to list its dependencies (before anything runs)."""

    recipe: RecipeInfo
    shared: Mapping[str, Any]
    matrix: Mapping[str, str]
    # the zoo models the kind's declared fields name, by field ("model.from"): see the module docstring
    references: Mapping[str, PinnedModel] = field(default_factory=dict)

    def resolve(self, path: str | Path) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self.recipe.dir / p)


@dataclass(frozen=True)
class EquivalenceContext(KeyContext):
    """What `StageKind.equivalence` may use besides the two sets of outputs: the recipe's sections
    (as for keys) and how far quality metrics may move (`quality_tolerance`: an absolute change of
    accuracy-like metrics, 0.01 = one point; a relative change of error metrics)."""

    quality_tolerance: float = 0.01


class StageKind:
    """Base class of every stage kind; see the module docstring for the contract."""

    name: ClassVar[str]
    version: ClassVar[str] = "1"
    Config: ClassVar[type[KindConfig]] = KindConfig
    tools: ClassVar[tuple[str, ...]] = ()
    shared: ClassVar[tuple[str, ...]] = ()  # e.g. ("data", "model.arch", "model.num_classes")
    outputs: ClassVar[tuple[str, ...]] = ()
    recipe_fields: ClassVar[tuple[str, ...]] = ()
    lineage: ClassVar[bool] = False
    summary: ClassVar[str] = ""

    def dependencies(self, config: KindConfig, ctx: KeyContext) -> list[Path]:
        """Files or folders whose content enters the cache key (user code, local data)."""
        return []

    def stage_references(self, config: KindConfig) -> Mapping[tuple[str | int, ...], str]:
        """The upstream stages `config` names, {path inside the config: stage id} (deploy's
        ``builds.NAME.from``): each must be one of the stage's `needs`, which the engine checks
        before anything runs (`zoo validate`, and every run before its first stage,
        zoo/engine/preflight.py) at the recipe line of that path. {} by default."""
        return {}

    def preflight(self, config: KindConfig, ctx: KeyContext) -> None:
        """What the stage can tell before anything runs from files the recipe names that exist now (an
        imported ONNX file's inputs against ``model.inputs``): raise `zoo.errors.FieldError` whose
        `field` is a path from the recipe's top (``("model", "inputs", "x")``), or inside this stage's
        config when it starts with ``"config"``. Called by `zoo validate` and before every run
        (zoo/engine/preflight.py): it must be cheap (no heavy import, no data read in full) and say
        nothing of what is not there yet (a file an upstream stage writes, a download)."""

    def tools_used(self, config: KindConfig, ctx: KeyContext) -> Sequence[str]:
        """The distributions this stage uses for this recipe, whose versions enter its key and lock
        record: `tools` unless the kind knows better (a subset, or an exporter plug-in's own)."""
        return self.tools

    def run(self, inputs: Inputs, config: KindConfig, context: StageContext) -> Mapping[str, Path]:
        """Do the work; write outputs under context.out_dir and return {name: path}."""
        raise NotImplementedError

    def on_cached(self, outputs: Mapping[str, Path], config: KindConfig, context: StageContext) -> None:
        """Redo what `run` does outside the cache, for a stage found cached instead of run.

        A cache hit skips `run`, so an effect beyond the outputs (a kind's own, e.g. a file it
        writes outside the cache) would be missing where the cache is shared between machines or
        was reset. (A release the stage declares needs none of this: the engine publishes it.) Called in the engine's process with the cached (read-only) outputs; must be
        idempotent and cheap when the effect is already in place. `context.inputs` holds the
        upstream results as `run` got them. Metrics set in context.metrics are reported for this
        run (not cached), and so are the effects it declares in context.effects. Never called while
        `zoo repro` rebuilds.
        """

    # -- what the engine asks after a run (see "The engine knows no kind by name" above) --------

    release_files: ClassVar[tuple[str, ...]] = ()  # version-level files a release it publishes must carry

    def report(self, stage_id: str, metrics: Mapping[str, Any], effects: Sequence[Effect]) -> list[ReportTable]:
        """Tables for the run summary, after this stage ran (not when it was found cached)."""
        return []

    def gates(self, metrics: Mapping[str, Any]) -> list[GateOutcome] | None:
        """The quality gates the stage checked, read from its metrics; None if the kind checks none."""
        return None

    def release_output(self, config: KindConfig) -> str | None:
        """The output that is the release folder this stage publishes to the local zoo; None if it publishes none."""
        return None

    def publication(self, release: Path, config: KindConfig, context: StageContext) -> Path:
        """The folder the engine publishes for the release output `release` (read-only: the run
        cache's): `release` itself (the default), or a folder under `context.work_dir` with the same
        builds that adds what the run measured but the release must not hold, for it to stay
        bit-reproducible (deploy: the timings verify and deploy measured, in manifest and card).

        Asked only when the local zoo lacks the version (a republish compares the release itself),
        in the engine's process, after the stage ran here, ran on another machine or was found
        cached: `context.inputs` holds the upstream results and `context.entry_metrics` the
        metrics of the stage's entry.
        """
        return release

    def check_release(self, manifest: Manifest, read: Callable[[str], bytes]) -> list[str]:
        """Problems with the version this stage published (its local zoo manifest); [] if none.

        `read(path)` returns the bytes of one of the version's files (``manifest.files``), e.g. one
        of `release_files`, which are present by the time this is called.
        """
        return []

    def equivalence(self, locked: Mapping[str, Path], rebuilt: Mapping[str, Path], config: KindConfig,
                    context: EquivalenceContext) -> Equivalence | None:
        """Whether `rebuilt` ({output name: path}, built here) is equivalent to `locked` (the same
        stage's outputs, from the same inputs, as a machine of another platform class built them);
        None when the kind cannot say (then only identical bytes pass). The verdict's lines say
        which kind of equivalence was judged (model outputs, held-out quality...). Called by
        `zoo repro --check` in the engine's process, with read-only files; may import heavy
        libraries."""
        return None
