"""The shared flow of the Keras and JAX exporters: models the recipe's own functions trained
(`zoo_stages.lib.models.entry_models`), exported and gated against their framework on held-out data.

The train stage's checkpoint is loaded (a ``.keras`` archive with ``safe_mode=True``, or JAX
parameters from safetensors with the recipe's ``model.entry`` forward function) and converted:
one float32 input per data feature (named as the train stage fed them), batch axis ``batch``,
outputs named ``model.output_name`` (numbered when several), opset ``min(opset, 23)`` (17 without one), IR version
capped at 13, doc strings cleared, provenance stamped, onnx's full check. Gate: the source
framework and onnxruntime run every held-out sample of the recipe's data; every output must
agree within ``parity.atol + parity.rtol * |source|``; a classifier's labels (the argmax of its
(samples, classes) first output) must agree exactly. Exporting the same checkpoint twice gives
the same bytes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from zoo.errors import InvalidInput
from zoo_stages.exporters.base import TORCH_FIELDS, ExportJob, Exporter, ModelFieldError, name_batch_axis

MAX_OPSET = 23  # jax2onnx's default and the newest default-domain opset onnxruntime runs
DEFAULT_OPSET = 17  # without `opset:` in the recipe, as the estimator exporters


class EntryModelExporter(Exporter):
    """Exporters of models trained by the recipe's functions (see the module docstring);
    subclasses name the framework and whether ``model.entry`` (a forward function) is required."""

    needs_forward_entry: ClassVar[bool] = False

    @classmethod
    def check_model(cls, model: Mapping[str, Any]) -> None:
        for field in ("estimator", "params", *(f for f in TORCH_FIELDS if f != "entry")):
            if model.get(field) is not None:
                raise ModelFieldError((field,), f"model.{field} does not apply to framework {cls.name}: the "
                                                "recipe's training function builds the model",
                                      hint=f"remove `{field}:` from the model section")
        if cls.needs_forward_entry and not model.get("entry"):
            raise ModelFieldError(("framework",), f"framework {cls.name} needs `model.entry: file.py:function`, the "
                                                  "forward function apply(params, *inputs)",
                                  hint="see the contract in the README (Keras and JAX models)")
        if not cls.needs_forward_entry and model.get("entry"):
            raise ModelFieldError(("entry",), f"framework {cls.name} keeps the architecture in its checkpoint: "
                                              "the train stage's `config.entry` builds and trains the model",
                                  hint="remove `model.entry`")

    def export(self, job: ExportJob) -> None:
        import numpy as np

        from zoo.files import atomic_write
        from zoo_stages.lib.data import datasets
        from zoo_stages.lib.models import entry_models
        from zoo_stages.lib.onnx import export_io, onnx_io
        from zoo_stages.lib.quality import parity, tasks
        from zoo_stages.lib.release import provenance
        from zoo_stages.lib.runtimes import onnx_run, ort_session

        context, config = job.context, job.config
        if job.label != "checkpoint":
            raise InvalidInput(f"framework {self.name} exports the train stage's checkpoint, not `weights:`",
                               hint="add the train stage to `needs:` and drop `weights:`")
        model_section = dict(context.shared.get("model") or {})
        data = dict(context.shared.get("data") or {})
        if not data:
            raise InvalidInput(f"exporting a {self.name} model needs the recipe's `data:` (its parity gate runs the "
                               "held-out samples)", hint="add the `data:` section the model was trained on")
        kind = tasks.kind_of(context.shared.get("task") or "")
        held_out = datasets.load_split(data, context.recipe.dir, "val")
        inputs = entry_models.model_features(held_out, model_section)
        fw = entry_models.framework(self.name)
        model = fw.load(job.source, model_section, context.recipe.dir)
        opset = min(DEFAULT_OPSET if config.opset is None else config.opset, MAX_OPSET)
        proto = fw.to_onnx(model, {name: a[:1] for name, a in inputs.items()}, opset)
        names = entry_models.output_names(model_section, len(proto.graph.output))
        rename_outputs(proto, names)
        name_batch_axis(proto)
        onnx_io.fix_ir_version(proto)
        proto.doc_string = ""
        proto.graph.doc_string = ""
        provenance.stamp(proto, job.props)
        blob = onnx_io.model_bytes(proto)
        export_io.check(blob)
        atomic_write(job.target, blob, fsync=False)

        session = ort_session.make_session(blob, threads=context.threads, level="all")
        got = onnx_run.run(session, inputs)
        expected = dict(zip(names, fw.predict(model, list(inputs.values()))))
        first = np.asarray(expected[names[0]])
        if kind == "classification" and first.ndim == 2 and first.shape[1] > 1:
            label = f"argmax({names[0]})"  # the class a user reads off the output: exact
            expected[label] = first.argmax(axis=1).astype(np.int64)
            if names[0] in got:
                got[label] = np.asarray(got[names[0]]).argmax(axis=1).astype(np.int64)
        report = parity.compare(expected, got, tolerance=parity.Tolerance(config.parity.atol, config.parity.rtol))
        context.metrics.update({
            "ir_version": int(proto.ir_version),
            "opset_imports": {(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import},
            "inputs": list(inputs),
            "outputs": names,
            "nodes": len(proto.graph.node),
            "op_types": onnx_io.op_counts(proto),
            "size_bytes": len(blob),
            "source": job.label,
            "exporter": self.name,
            "opset": opset,
            "parity": {**report.to_json(), "data": "held-out split"},
            "max_abs": report.max_abs,
            "max_rel": report.max_rel,
        })
        report.require(f"ONNX output differs from {self.name} on the held-out samples beyond "
                       f"atol={config.parity.atol} rtol={config.parity.rtol}",
                       hint="an op may convert inexactly; loosen parity.atol/rtol only if the difference is expected")
        context.log.info("exported %s (%s, opset %d): parity on %d held-out samples, max_abs %.3g", job.target.name,
                         self.name, opset, len(held_out), report.max_abs)


def rename_outputs(proto: Any, names: list[str]) -> None:
    """Give the graph's outputs `names` (in order), renaming every reference to the old names."""
    renamed = {o.name: new for o, new in zip(proto.graph.output, names) if o.name != new}
    if not renamed:
        return
    taken = {v for n in proto.graph.node for v in (*n.input, *n.output)} | {i.name for i in proto.graph.initializer}
    clash = sorted((set(renamed.values()) & taken) - set(renamed))
    if clash:
        raise InvalidInput(f"cannot name the model's outputs {', '.join(clash)}: the graph already has such a value",
                           hint="set another `model.output_name`")
    for node in proto.graph.node:
        node.input[:] = [renamed.get(v, v) for v in node.input]
        node.output[:] = [renamed.get(v, v) for v in node.output]
    for value in (*proto.graph.output, *proto.graph.value_info):
        if value.name in renamed:
            value.name = renamed[value.name]
