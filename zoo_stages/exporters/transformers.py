"""The Hugging Face `transformers` exporter (``model.framework: transformers``).

The model is the recipe's architecture with the train stage's checkpoint (or ``weights:``), or
the pinned pretrained folder's weights when no stage trained it (`zoo_stages.lib.models.hf_models`).
It is exported with ``torch.onnx`` on the model with NAMED inputs and outputs: ``input_ids``,
``attention_mask`` and ``token_type_ids`` where the class takes them (int64, dynamic ``batch`` and
``sequence`` axes, or the recipe's ``model.inputs`` names and dims), and the output fields of
transformers' own ``ModelOutput`` (``logits`` for a classifier, ``last_hidden_state`` for a bare
encoder; ``batch`` and ``sequence`` axes named where they vary). The TorchScript exporter with
eager attention is the default for these models (its graph is what onnxruntime's transformer
optimizer fuses into Attention nodes, and it exports in a fraction of dynamo's time); an
explicit ``exporter: dynamo`` in the export config uses torch's dynamo exporter.

A causal LM (``*ForCausalLM`` of the families `zoo_stages.lib.models.causal_lm.FAMILIES`) is
exported as a generative build with a KV cache by `zoo_stages.exporters.decoder` (torch.onnx's
dynamo by default, or onnxruntime-genai's builder with ``exporter: genai``), with its
genai_config.json and tokenizer files and a parity gate on greedy decoding.

Optimum (``optimum-onnx``) is not used: the release that installs beside this environment pins
``transformers<4.58`` and would downgrade transformers 5 (checked with ``pip install --dry-run``).

Then, as every exporter: IR version capped, doc strings and node metadata dropped, provenance
stamped (with the pretrained files' digests), onnx's full check, deterministic bytes (exporting
the same weights twice gives the same file). Parity gate: onnxruntime against transformers' own
forward (`hf_models.reference_outputs`, not zoo's positional wrapper) on the held-out split's
tokenized texts (its first ``max(parity.samples, 256)`` rows), or, for a recipe without text
``data:``, on seeded random token ids below the vocabulary size (attention masks of ones);
every output element within ``parity.atol + parity.rtol * |reference|``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput
from zoo_stages.exporters.base import TORCH_FIELDS, ExportJob, Exporter, ModelFieldError

PARITY_ROWS = 256  # held-out rows compared at least (parity.samples when larger)
EXAMPLE_BATCH = 2  # the traced example: dynamo specialises sizes 0 and 1
DEFAULT_EXPORTER = "torchscript"
DEFAULT_OPSET = {"torchscript": 17, "dynamo": 18}


class TransformersExporter(Exporter):
    name = "transformers"
    extra = "transformers"
    modules = ("transformers", "tokenizers", "torch", "safetensors")
    tools = ("transformers", "tokenizers", "torch", "onnxscript", "safetensors", "numpy")
    summary = ("Hugging Face transformers model (architecture + config, or a pinned pretrained folder) via torch.onnx; "
               "causal LMs with a KV cache, also via onnxruntime-genai's builder")

    @classmethod
    def check_model(cls, model: Mapping[str, Any]) -> None:
        for field in (*TORCH_FIELDS, "estimator", "params", "from", "build", "head"):
            if field != "inputs" and model.get(field) is not None:
                raise ModelFieldError((field,), f"model.{field} does not apply to framework transformers, which "
                                                "builds `architecture:` from `config:` (or a `pretrained:` folder)",
                                      hint=f"remove `{field}:`; settings of the architecture go in `config:`")
        if not model.get("architecture") and not model.get("pretrained"):
            raise ModelFieldError(("framework",), "framework transformers needs `model.architecture` (with "
                                                  "`config:`) or a `model.pretrained` folder",
                                  hint="e.g. architecture: DistilBertForSequenceClassification")
        if model.get("architecture"):
            from zoo_stages.lib.models import hf_models

            try:
                hf_models.check_architecture(model["architecture"])
            except ValueError as e:
                raise ModelFieldError(("architecture",), f"model.architecture: {e}",
                                      hint="a model class of transformers, e.g. BertForSequenceClassification, "
                                           "DistilBertForSequenceClassification, GPT2ForSequenceClassification") \
                    from None
            except InvalidInput as e:  # transformers is not installed: say so at the line
                raise ModelFieldError(("framework",), e.message, hint=e.hint) from None
            from zoo_stages.lib.models import causal_lm

            if causal_lm.is_causal_lm(model["architecture"]) and causal_lm.unsupported(model["architecture"]):
                raise ModelFieldError(("architecture",), f"model.architecture: "
                                                         f"{causal_lm.unsupported(model['architecture'])}",
                                      hint="a causal LM is exported as a generative build with a KV cache")

    @classmethod
    def tools_in(cls, model: Mapping[str, Any], recipe_dir: Path) -> tuple[str, ...]:
        """A causal LM's export also runs onnxruntime-genai's builder (its genai_config.json, or
        the whole model with `exporter: genai`)."""
        from zoo_stages.lib.models import causal_lm

        if causal_lm.is_causal_lm(_architecture(model, recipe_dir)):
            return (*cls.tools, "onnxruntime-genai")
        return cls.tools

    @classmethod
    def dependencies(cls, model: Mapping[str, Any], recipe_dir: Path) -> list[Path]:
        from zoo_stages.lib.models import hf_models

        return list(hf_models.pretrained_files(model, recipe_dir).values())

    def pretrained_source(self, context: Any) -> Path | None:
        from zoo_stages.lib.models import hf_models

        model = dict(context.shared.get("model") or {})
        return hf_models.verified_folder(model, context.recipe.dir) if model.get("pretrained") else None

    def export(self, job: ExportJob) -> None:
        import torch

        from zoo.files import atomic_write
        from zoo_stages.lib.models import archs, checkpoints, hf_models
        from zoo_stages.lib.onnx import export_io, onnx_io
        from zoo_stages.lib.quality import parity, tasks
        from zoo_stages.lib.release import provenance
        from zoo_stages.lib.runtimes import onnx_run, ort_session

        context, config = job.context, job.config
        section = dict(context.shared.get("model") or {})
        data = dict(context.shared.get("data") or {})
        from zoo_stages.lib.models import causal_lm

        if causal_lm.is_causal_lm(hf_models.architecture_name(section, context.recipe.dir)):
            from zoo_stages.exporters import decoder

            return decoder.export(job, job.label == "pretrained")
        if config.exporter == "genai":
            raise InvalidInput("`exporter: genai` (onnxruntime-genai's model builder) exports causal language models "
                               f"({', '.join(sorted(causal_lm.FAMILIES))}), not "
                               f"{hf_models.architecture_name(section, context.recipe.dir)}",
                               hint="drop `exporter:` or use dynamo/torchscript")
        regression = tasks.kind_of(context.shared.get("task") or "") == "regression"
        sizes = archs.data_sizes(section, data, context.recipe.dir, regression=regression)
        saved_threads = torch.get_num_threads()
        torch.set_num_threads(max(1, int(context.threads)))
        try:
            if job.label == "pretrained":
                model = archs.build_model(section, context.recipe.dir, **sizes).eval()
            else:
                model = checkpoints.build_with_weights(section, context.recipe.dir, job.source, job.label, **sizes)
            ports = archs.model_inputs(section, data)  # the graph's names, in forward order
            own = [name for name, _ in hf_models.model_inputs(section, data)]  # transformers' names
            feeds, where = _parity_feeds(ports, data, context, model, config)
            example = {p.name: a[:EXAMPLE_BATCH] for p, a in zip(ports, feeds.values())}
            reference = {n: a for n, a in zip(own, feeds.values())}
            torch_example = {n: torch.from_numpy(a[:EXAMPLE_BATCH]) for n, a in reference.items()}
            outputs = hf_models.output_names(model, torch_example)
            axes = _axes(ports, section, model, own, example, outputs)
            exporter = config.exporter if "exporter" in config.model_fields_set else DEFAULT_EXPORTER
            # without `opset:` each exporter's own default (dynamo implements opsets from 18)
            opset = config.opset if config.opset is not None else DEFAULT_OPSET[exporter]
            proto = _torch_onnx(model, example, ports, outputs, axes, opset, exporter,
                                context.work_dir / "export-transformers")
            _normalise(proto)
            props = dict(job.props)
            if job.label == "pretrained":
                props = hf_models.with_pretrained_sources(props, hf_models.folder_digest(section))
            provenance.stamp(proto, props)
            blob = onnx_io.model_bytes(proto)
            export_io.check(blob)
            atomic_write(job.target, blob, fsync=False)
            session = ort_session.make_session(blob, threads=context.threads, level="all")
            got = onnx_run.run(session, {p.name: a for p, a in zip(ports, feeds.values())})
            expected = hf_models.reference_outputs(model, reference, outputs)
        finally:
            torch.set_num_threads(saved_threads)
        report = parity.compare(expected, got, tolerance=parity.Tolerance(config.parity.atol, config.parity.rtol))
        context.metrics.update({
            "ir_version": int(proto.ir_version),
            "opset_imports": {(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import},
            "inputs": [p.name for p in ports],
            "outputs": outputs,
            "nodes": len(proto.graph.node),
            "op_types": onnx_io.op_counts(proto),
            "size_bytes": len(blob),
            "source": job.label,
            "exporter": self.name,
            "torch_exporter": exporter,
            "architecture": type(model).__name__,
            "opset": opset,
            "input_shapes": {p.name: list(axes[p.name]) for p in ports},
            "num_parameters": int(sum(p.numel() for p in model.parameters())),
            "parity": {**report.to_json(), "data": where, "rows": int(len(next(iter(feeds.values()))))},
            "max_abs": report.max_abs,
            "max_rel": report.max_rel,
        })
        if job.label == "pretrained":
            context.metrics["pretrained"] = hf_models.folder_digest(section)
        report.require(f"ONNX output differs from transformers' forward on {where} beyond atol={config.parity.atol} "
                       f"rtol={config.parity.rtol}",
                       hint="try another opset or `exporter: dynamo`; loosen parity.atol/rtol only if the "
                            "difference is expected")
        context.log.info("exported %s (%s via %s, opset %d): parity on %s, max_abs %.3g", job.target.name,
                         type(model).__name__, exporter, opset, where, report.max_abs)


def _parity_feeds(ports, data: Mapping[str, Any], context: Any, model: Any, config: Any) -> tuple[dict, str]:
    """({input name: int64 array}, what they are): the held-out split's tokenized texts (its first
    rows), or seeded random token ids when the recipe has no text data."""
    import numpy as np

    from zoo_stages.lib.data import datasets
    from zoo_stages.lib.runtimes import onnx_run

    rows = max(int(config.parity.samples), PARITY_ROWS)
    if data.get("text"):
        held_out = datasets.load_split(data, context.recipe.dir, "val")
        bound = onnx_run.bind_names([p.name for p in ports], held_out.features, where="the held-out split")
        # copies: the cached splits are read-only, and torch tensors share their memory
        feeds = {name: np.array(np.asarray(a)[:rows], dtype=np.int64) for name, a in bound.items()}
        if len(next(iter(feeds.values()))) >= EXAMPLE_BATCH:
            return feeds, "the held-out split"
    rng = np.random.default_rng(config.parity.seed)
    length = min(16, int(getattr(model.config, "max_position_embeddings", 16) or 16))
    shape = (int(config.parity.samples) if config.parity.samples >= EXAMPLE_BATCH else EXAMPLE_BATCH, length)
    feeds = {}
    for port in ports:
        if port.holds == "token_ids":
            feeds[port.name] = rng.integers(0, int(model.config.vocab_size), shape, dtype=np.int64)
        elif port.holds == "mask":
            feeds[port.name] = np.ones(shape, dtype=np.int64)
        else:
            feeds[port.name] = np.zeros(shape, dtype=np.int64)
    return feeds, "seeded random token ids"


def _axes(ports, section: Mapping[str, Any], model: Any, own: list[str], example: Mapping[str, Any],
          outputs: list[str]) -> dict[str, tuple]:
    """Every port's and output's dimensions (names for the dynamic ones): the inputs' from the
    recipe's ``model.inputs`` where declared, else (batch, sequence); an output's batch axis and
    the axes that follow the sequence length (found by running two lengths)."""
    import torch

    from zoo_stages.lib.models import hf_models

    declared = section.get("inputs") or {}
    dims: dict[str, tuple] = {}
    for port in ports:
        dims[port.name] = tuple(declared[port.name]["shape"]) if port.name in declared else ("batch", "sequence")
    shapes = []
    for length in (int(next(iter(example.values())).shape[1]), int(next(iter(example.values())).shape[1]) - 1):
        feeds = {n: torch.from_numpy(a[:, :length].copy()) for n, a in zip(own, example.values())}
        with torch.no_grad():
            out = hf_models.reference_forward(model, feeds)
        shapes.append({name: tuple(out[name].shape) for name in outputs})
    sequence = next((d for d in dims[ports[0].name][1:2] if isinstance(d, str)), "sequence")
    batch = dims[ports[0].name][0]
    for name in outputs:
        long, short = shapes[0][name], shapes[1][name]
        dims[name] = tuple(batch if j == 0 else sequence if a != b else int(a)
                           for j, (a, b) in enumerate(zip(long, short)))
    return dims


def _torch_onnx(model: Any, example: Mapping[str, Any], ports, outputs: list[str], axes: Mapping[str, tuple],
                opset: int, exporter: str, work: Path) -> Any:
    """The ModelProto torch.onnx exports from `model` traced on `example` (named ports and outputs)."""
    import io
    import shutil
    import warnings

    import onnx
    import torch

    args = tuple(torch.from_numpy(a) for a in example.values())
    names = [p.name for p in ports]
    with warnings.catch_warnings():
        # the tracer warns about the sizes transformers reads while building masks (axes are declared dynamic)
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="Exporting aten::index operator", category=UserWarning)
        if exporter == "dynamo":
            found: dict[str, Any] = {}
            dynamic = tuple({j: found.setdefault(d, torch.export.Dim(d)) for j, d in enumerate(axes[n])
                             if isinstance(d, str)} or None for n in names)
            if work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True)
            torch.onnx.export(model, args, str(work / "raw.onnx"), dynamo=True, external_data=False,
                              input_names=names, output_names=outputs, opset_version=opset,
                              dynamic_shapes=dynamic, optimize=True, verbose=False)
            return onnx.load(str(work / "raw.onnx"))
        buffer = io.BytesIO()
        dynamic_axes = {n: {j: d for j, d in enumerate(axes[n]) if isinstance(d, str)} for n in [*names, *outputs]}
        try:
            torch.onnx.export(model, args, buffer, dynamo=False, input_names=names, output_names=outputs,
                              opset_version=opset, dynamic_axes={k: v for k, v in dynamic_axes.items() if v},
                              do_constant_folding=True)
        except (torch.onnx.errors.UnsupportedOperatorError, torch.onnx.errors.SymbolicValueError) as e:
            raise InvalidInput(f"the TorchScript exporter cannot export this model at opset {opset}: {e}",
                               hint="raise `opset`, or set `exporter: dynamo`") from None
    return onnx.load_from_string(buffer.getvalue())


def _normalise(proto: Any) -> None:
    """Cap the IR version; drop doc strings and node metadata (they may hold source paths)."""
    from zoo_stages.lib.onnx import onnx_io

    onnx_io.fix_ir_version(proto)
    proto.doc_string = ""
    proto.graph.doc_string = ""
    for node in proto.graph.node:
        node.doc_string = ""
        del node.metadata_props[:]


def _architecture(model: Mapping[str, Any], recipe_dir: Path) -> str | None:
    """``model.architecture``, else the pretrained folder's config.json's; None when unreadable."""
    from zoo_stages.lib.models import hf_models

    try:
        return hf_models.architecture_name(model, recipe_dir)
    except InvalidInput:
        return None
