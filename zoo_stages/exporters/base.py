"""The exporter contract: one framework's trained model to a checked, parity-gated ONNX file.

An exporter (a subclass of `Exporter`, registered as a ``zoo.exporters`` entry point, see
`zoo.engine.exporter_loader`) declares:

- ``name``: the framework as recipes name it (``model.framework: sklearn``);
- ``extra``: the pip extra that installs what it needs (``pip install 'zoo-onnx[EXTRA]'``), and
  ``modules``: the importable modules that extra provides; `installed` looks for them without
  importing them, `require` raises `zoo.errors.MissingExtra` naming the install to run;
- `check_model`: checks the recipe's ``model:`` section when the recipe loads (a `ModelFieldError`
  points at the field's line);
- `export`: writes ``model.onnx`` for the export stage (`ExportJob`);
- optionally `dependencies` (files of the model section that enter the export's key) and
  `pretrained_source` (weights the model section pins, exported without a train stage).

`EstimatorExporter` is the shared flow for exporters whose source is a fitted estimator that
predicts on tables (scikit-learn, LightGBM, XGBoost): it loads the train stage's checkpoint
(`load`), converts it (`to_onnx`: one float input of the table's width, zipmap off so outputs
are plain tensors: an int64 ``label`` and float ``probabilities`` for classifiers, one float
output for regressors), names the batch axis of every port ``batch`` and the graph after the
estimator (converters may name it at random: the same model must give the same bytes), caps the IR version at 13,
stamps provenance, checks the model with onnx's full checker, and gates it: the source framework
(`predict`) and onnxruntime run every held-out row of the recipe's data; probabilities and
regression outputs must agree within ``parity.atol + parity.rtol * |source|``, labels exactly.
A failing gate fails the stage with the parity table (`zoo_stages.lib.quality.parity`).

Exporter modules stay light: the framework and its converter are imported inside functions.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from zoo.errors import InvalidInput, MissingExtra

if TYPE_CHECKING:
    from zoo.stage import StageContext

BATCH_AXIS = "batch"


class ModelFieldError(ValueError):
    """A recipe's ``model:`` section that an exporter refuses; `field` is the offending key's
    path inside the section (e.g. ``("estimator",)``), so the error points at its line."""

    def __init__(self, field: tuple[str, ...], message: str, hint: str | None = None):
        super().__init__(message)
        self.field = field
        self.hint = hint


@dataclass(frozen=True)
class ExportJob:
    """What the export stage hands an exporter: the trained model's file (`source`: an upstream
    checkpoint or fetched weights, `label` says which), the stage's config and context, the
    file to write (`target`) and the provenance entries to stamp into it (`props`)."""

    source: Path
    label: str
    config: Any  # zoo_stages.export.ExportConfig
    context: "StageContext"
    target: Path
    props: Mapping[str, str]


class Exporter(ABC):
    """One framework's exporter (see the module docstring)."""

    name: ClassVar[str]
    extra: ClassVar[str]
    modules: ClassVar[tuple[str, ...]] = ()
    # the distributions whose versions decide what it writes: they enter the export stage's key and
    # lock record (with onnx and onnxruntime), and no other exporter's do
    tools: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""

    @classmethod
    def tools_for(cls, model: Mapping[str, Any]) -> tuple[str, ...]:
        """The distributions this exporter uses for the recipe's ``model:`` section (`tools`)."""
        return cls.tools

    @classmethod
    def tools_in(cls, model: Mapping[str, Any], recipe_dir: Path) -> tuple[str, ...]:
        """`tools_for` for a recipe in `recipe_dir` (what its model section's files say may matter)."""
        return cls.tools_for(model)

    @classmethod
    def missing_modules(cls) -> list[str]:
        """The needed modules that cannot be found (nothing is imported to tell)."""
        missing = []
        for module in cls.modules:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):  # a parent package that is absent, or a broken __spec__
                found = False
            if not found:
                missing.append(module)
        return missing

    @classmethod
    def installed(cls) -> bool:
        """Whether every module the exporter needs is installed."""
        return not cls.missing_modules()

    @classmethod
    def install_command(cls) -> str:
        return f"pip install 'zoo-onnx[{cls.extra}]'"

    @classmethod
    def require(cls) -> None:
        """MissingExtra naming the pip install to run unless the exporter's modules are installed."""
        missing = cls.missing_modules()
        if missing:
            raise MissingExtra(f"framework {cls.name!r} needs {', '.join(missing)}, which "
                               f"{'is' if len(missing) == 1 else 'are'} not installed",
                               hint=f"{cls.install_command()} (the {cls.extra!r} extra)")

    @classmethod
    def check_model(cls, model: Mapping[str, Any]) -> None:
        """Check the recipe's ``model:`` section (a plain dict) for this framework; raise
        `ModelFieldError` for a field that does not fit. Runs at recipe load: import nothing heavy."""

    @classmethod
    def dependencies(cls, model: Mapping[str, Any], recipe_dir: Path) -> list[Path]:
        """Files the ``model:`` section names whose content must enter the export's key (e.g. a
        pretrained folder's files); none by default."""
        return []

    def pretrained_source(self, context: "StageContext") -> Path | None:
        """The weights the ``model:`` section itself pins (a pretrained folder, checked), exported
        when no train stage, ``weights:`` or ``onnx:`` gives any (`ExportJob.label` ``pretrained``); None by default."""
        return None

    @abstractmethod
    def export(self, job: ExportJob) -> None:
        """Write the ONNX model at ``job.target`` (parity-gated), its figures in ``job.context.metrics``."""


# the torch-only fields of the model section (an estimator has none of them)
TORCH_FIELDS = ("arch", "entry", "hidden", "dropout", "hidden_size", "num_layers", "num_heads",
                "intermediate_size", "max_length", "vocab_size", "inputs")


# the fields of a Hugging Face model (framework: transformers)
TRANSFORMERS_FIELDS = ("architecture", "config", "pretrained")


def sort_opset_imports(proto: Any) -> None:
    """Put the model's opset imports in domain order. skl2onnx (and onnxmltools) collect them in a
    set, so their order, and the file's bytes, followed Python's string hash seed: one run in
    three gave other bytes for the same model."""
    ordered = sorted(proto.opset_import, key=lambda o: (o.domain, o.version))
    entries = [(o.domain, o.version) for o in ordered]
    del proto.opset_import[:]
    for domain, version in entries:
        proto.opset_import.add(domain=domain, version=version)


def refuse_transformers_fields(model: Mapping[str, Any], framework: str) -> None:
    """ModelFieldError for a transformers field in another framework's model section."""
    for field in TRANSFORMERS_FIELDS:
        if model.get(field) is not None:
            raise ModelFieldError((field,), f"model.{field} applies to framework transformers, not {framework}",
                                  hint="set `framework: transformers`, or remove the field")


class EstimatorExporter(Exporter):
    """Exporters of fitted table estimators (see the module docstring); subclasses give
    `estimators` (their `zoo_stages.lib.models.estimators` module), `load`, `to_onnx` and `predict`."""

    max_opset: ClassVar[int] = 17  # the highest default-domain opset the converter writes
    default_opset: ClassVar[int] = 17  # without `opset:` in the recipe (capped at max_opset)

    @classmethod
    def estimators(cls):
        """The framework's module in `zoo_stages.lib.models.estimators` (what train fits, the checkpoint format)."""
        from zoo_stages.lib.models.estimators import framework

        return framework(cls.name)

    @classmethod
    def check_model(cls, model: Mapping[str, Any]) -> None:
        from zoo_stages.lib.models.estimators.estimator import lookup

        for field in TORCH_FIELDS:
            if model.get(field) is not None:
                raise ModelFieldError((field,), f"model.{field} is a torch setting; framework {cls.name} fits "
                                                f"`estimator:` with `params:`",
                                      hint=f"remove `{field}:` from the model section")
        refuse_transformers_fields(model, cls.name)
        if not model.get("estimator"):
            raise ModelFieldError(("framework",), f"framework {cls.name} needs `model.estimator`",
                                  hint=f"e.g. estimator: {next(iter(cls.estimators().ESTIMATORS))}")
        try:
            lookup(cls.estimators().ESTIMATORS, model["estimator"], cls.name)
        except ValueError as e:
            raise ModelFieldError(("estimator",), f"model.estimator: {e}") from None

    @abstractmethod
    def load(self, checkpoint: Path, kind: str) -> Any:
        """The fitted model in the train stage's checkpoint (`kind`: classification or regression)."""

    @abstractmethod
    def to_onnx(self, model: Any, input_name: str, width: int, opset: int) -> Any:
        """The model as an onnx ModelProto with one float input `input_name` of [None, `width`]."""

    @abstractmethod
    def predict(self, model: Any, features: Any, kind: str) -> dict[str, Any]:
        """The source framework's outputs on `features` ((samples, width) float32), named and
        shaped as the ONNX model's outputs: classifiers ``label`` (int64) and ``probabilities``."""

    def export(self, job: ExportJob) -> None:
        import numpy as np

        from zoo_stages.lib.data import datasets
        from zoo_stages.lib.onnx import export_io, onnx_io
        from zoo_stages.lib.quality import parity, tasks
        from zoo_stages.lib.release import provenance
        from zoo_stages.lib.runtimes import onnx_run, ort_session
        from zoo_stages.lib.models.estimators.training import table_features

        context, config = job.context, job.config
        if job.label != "checkpoint":
            raise InvalidInput(f"framework {self.name} exports the train stage's checkpoint, not `weights:`",
                               hint="add the train stage to `needs:` and drop `weights:`")
        kind = tasks.kind_of(context.shared.get("task") or "")
        data = dict(context.shared.get("data") or {})
        if not data:
            raise InvalidInput(f"exporting a {self.name} model needs the recipe's `data:` (its parity gate runs "
                               "the held-out rows)", hint="add the `data:` section the model was trained on")
        held_out = datasets.load_split(data, context.recipe.dir, "val")
        features = table_features(held_out)
        input_name = (context.shared.get("model") or {}).get("input_name") or next(iter(held_out.features))
        model = self.load(job.source, kind)
        opset = min(self.default_opset if config.opset is None else config.opset, self.max_opset)
        proto = self.to_onnx(model, input_name, int(features.shape[1]), opset)
        name_batch_axis(proto)
        onnx_io.fix_ir_version(proto)
        proto.graph.name = type(model).__name__  # onnxmltools names the graph with a random uuid
        sort_opset_imports(proto)
        proto.doc_string = ""
        proto.graph.doc_string = ""
        provenance.stamp(proto, job.props)
        blob = onnx_io.model_bytes(proto)
        export_io.check(blob)
        from zoo.files import atomic_write

        atomic_write(job.target, blob, fsync=False)

        session = ort_session.make_session(blob, threads=context.threads, level="all")
        got = onnx_run.run(session, {input_name: features})
        expected = {k: np.asarray(v) for k, v in self.predict(model, features, kind).items()}
        report = parity.compare(expected, got, tolerance=parity.Tolerance(config.parity.atol, config.parity.rtol))
        context.metrics.update({
            "ir_version": int(proto.ir_version),
            "opset_imports": {(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import},
            "inputs": [input_name],
            "outputs": [o.name for o in proto.graph.output],
            "nodes": len(proto.graph.node),
            "op_types": onnx_io.op_counts(proto),
            "size_bytes": len(blob),
            "source": job.label,
            "exporter": self.name,
            "estimator": type(model).__name__,
            "opset": opset,
            "parity": {**report.to_json(), "data": "held-out split"},
            "max_abs": report.max_abs,
            "max_rel": report.max_rel,
        })
        report.require(f"ONNX output differs from {self.name} on the held-out rows beyond "
                       f"atol={config.parity.atol} rtol={config.parity.rtol}",
                       hint="a converter may not support an estimator option; loosen parity.atol/rtol only if the "
                            "difference is expected")
        context.log.info("exported %s (%s, opset %d): parity on %d held-out rows, max_abs %.3g", job.target.name,
                         self.name, opset, len(features), report.max_abs)


def name_batch_axis(proto: Any) -> None:
    """Name the first axis of every graph input and output ``batch`` (converters leave it
    unnamed, and LightGBM's declares its label output 1 long): every row is one sample."""
    for value in (*proto.graph.input, *proto.graph.output):
        dims = value.type.tensor_type.shape.dim
        if len(dims):
            dims[0].Clear()
            dims[0].dim_param = BATCH_AXIS
