"""The `optimize` kind: offline graph optimization with onnxruntime, optionally after a simplifier.

Offline graph optimization with onnxruntime (optionally after onnxsim or onnxoptimizer), saved
through `SessionOptions.optimized_model_filepath` from a single-threaded session, so the same
input gives the same bytes. The result is compared with its input on `parity.samples` fixed
random samples fed to every named input (1 thread; integer inputs get 0 or 1, boolean ones True;
shapes from the model's fixed dims, the recipe's `model.inputs` with named dims at
`parity.dynamic_size`, and `input_shapes`); a float output beyond `atol + rtol·|ref|`, or an
integer output that differs, fails the stage.

`transformer: {model_type: bert, num_heads: 0, hidden_size: 0, opt_level: 1}` first runs
onnxruntime's transformer optimizer (`onnxruntime.transformers.optimizer.optimize_model`):
attention, SkipLayerNormalization, EmbedLayerNormalization and GELU fusions into `com.microsoft`
ops, counted in the metrics (`fused`). 0 means "detect" (from the LayerNorm scales and the Q
projection's Reshape, which `transformers` 5 exports leave to -1 heads). The fused Attention
keeps the raw attention mask, so any mask (not only right padding) gives the same outputs.
Hugging Face models exported with `attn_implementation="eager"` fuse to Attention; `sdpa`
exports keep their attention unfused (LayerNorm and GELU still fuse).

Levels: `basic` (default) keeps standard ONNX ops (constant folding, redundant nodes removed), so
the result stays portable and quantizable. `extended` adds onnxruntime's fused `com.microsoft`
ops (FusedConv, FusedGemm…); `all` also adds `com.microsoft.nchwc` layouts tuned to this host's
SIMD width (`host_specific: true` in the metrics). Models at `extended`/`all` or with
`transformer:` fusions run only on onnxruntime, and only `mode: dynamic` quantizes them: feed
static quantization from export (or a `basic` optimize), and take `convert: fp16` builds from
such a source too.

- **Inputs**: one upstream `model` (or the one named by `model_from`).
- **Outputs**: `model` (`model.onnx`).
- **Metrics**: `level`, `nodes_before`, `nodes_after`, `ops_after`, `custom_domains`,
  `host_specific`, `size_bytes`, `opset`, `parity`; with `transformer:` also `fused` and
  `transformer` (the settings, with the heads and hidden size used).

The provenance stamp (`zoo_stages/lib/release/provenance.py`: the stage's record digest, input
digests, license and the attribution inherited from the input model) and the pruned opset imports are
written into the saved file in place, without re-serialising the graph.

This docstring is the kind's description on the docs site (docs/kinds.md, written by
scripts/gen_kinds_doc.py): Markdown, for users.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Literal, Mapping

from pydantic import Field, field_validator

from zoo.errors import InvalidInput, StageFailed
from zoo.stage import Inputs, KindConfig, StageContext, StageKind
from zoo_stages.lib.quality.numeric_outputs import NumericOutputs
from zoo_stages.lib.onnx import onnx_fields


class ParityConfig(KindConfig):
    """How the optimized model is compared with its input."""

    samples: int = Field(8, ge=1, le=10_000, description="number of fixed random inputs")
    seed: int = Field(0, description="seed of the random inputs (uniform in [0, 1))")
    atol: float = Field(1e-4, ge=0, description="absolute tolerance")
    rtol: float = Field(1e-3, ge=0, description="relative tolerance")
    dynamic_size: int = Field(8, ge=1, le=100_000, description="size of the named dynamic dimensions (sequence, "
                                                              "H, W) of the recipe's model.inputs in the inputs")


class TransformerConfig(KindConfig):
    """onnxruntime's transformer optimizer (``onnxruntime.transformers.optimizer.optimize_model``)."""

    model_type: str = Field("bert", pattern=r"^[a-z0-9_]+$",
                            description="onnxruntime's model type: bert, bart, gpt2, t5, vit, clip, ...")
    num_heads: int = Field(0, ge=0, description="attention heads; 0 = detect from the graph")
    hidden_size: int = Field(0, ge=0, description="hidden size; 0 = detect from the graph")
    opt_level: Literal[0, 1, 2, 99] = Field(
        1, description="onnxruntime optimization before the fusions: 0 none, 1 basic, 2 extended, 99 all")


class OptimizeConfig(KindConfig):
    level: Literal["basic", "extended", "all"] = Field(
        "basic", description="onnxruntime graph optimization level; extended/all add onnxruntime-only fused ops")
    execution_provider: str = Field("CPUExecutionProvider", description="the provider the model is optimized for")
    simplify: Literal["none", "onnxsim", "onnxoptimizer"] = Field(
        "none", description="run a simplifier before onnxruntime's optimizer")
    transformer: TransformerConfig | None = Field(
        None, description="run onnxruntime's transformer optimizer (attention/LayerNorm/GELU fusions) first")
    parity: ParityConfig = Field(default_factory=ParityConfig)
    input_shapes: dict[str, list[Annotated[int, Field(ge=1)]]] | None = Field(
        None, description="shapes of the parity inputs by input name, batch first (e.g. {input: [1, 3, 224, 224]}), "
                          "for inputs with dynamic dims other than the batch")
    model_from: str | None = Field(None, description="upstream stage id whose `model` to optimize (default: the only one)")

    @field_validator("input_shapes")
    @classmethod
    def _one_batch(cls, v):
        if v:
            if any(not shape for shape in v.values()):
                raise ValueError("input_shapes: each shape needs at least the batch dimension")
            batches = {shape[0] for shape in v.values()}
            if len(batches) > 1:
                raise ValueError(f"input_shapes: every input needs the same batch size (got {sorted(batches)})")
        return v


class Optimize(NumericOutputs, StageKind):
    name = "optimize"
    # 2: provenance metadata_props; 3: one parity module (per-output records, exact integer outputs);
    # 4: every named input fed (input_shapes, model.inputs), transformer fusions
    # 5: equivalence across platform classes by model outputs and quality (zoo_stages.lib.quality.equivalence)
    version = "5"
    Config = OptimizeConfig
    tools = ("onnx", "onnxruntime", "onnxsim", "onnxoptimizer", "numpy")
    shared = ("model.inputs",)
    outputs = ("model",)
    recipe_fields = ("license",)  # stamped into the model (zoo.license)
    summary = "onnxruntime offline graph optimization (+ onnxsim/onnxoptimizer), parity-checked"

    def stage_references(self, config: OptimizeConfig) -> dict[tuple[str | int, ...], str]:
        """`model_from` names the stage whose model this one reads."""
        return {("model_from",): config.model_from} if config.model_from else {}

    def run(self, inputs: Inputs, config: OptimizeConfig, context: StageContext) -> Mapping[str, Path]:
        import onnx

        from zoo_stages.lib.onnx import onnx_io
        from zoo_stages.lib.release import provenance
        from zoo_stages.lib.runtimes import ort_session

        src = inputs.stage(config.model_from).outputs["model"] if config.model_from else inputs.one("model")
        fused: dict[str, int] | None = None
        heads: tuple[int, int] | None = None
        reference: Path | bytes = Path(src)  # onnxruntime reads the file itself: nothing re-serialised
        source: Path | bytes = Path(src)
        if config.simplify != "none" or config.transformer is not None:
            original = onnx_io.load_model(src)
            reference = onnx_io.model_bytes(original)
            model = simplify(original, config.simplify) if config.simplify != "none" else original
            if config.transformer is not None:
                from zoo_stages.lib.runtimes import transformer_fusion

                t = config.transformer
                model, fused, heads = transformer_fusion.fuse(model, model_type=t.model_type, num_heads=t.num_heads,
                                                              hidden_size=t.hidden_size, opt_level=t.opt_level)
            source = onnx_io.model_bytes(model)
        nodes_before = len(onnx.load(str(src), load_external_data=False).graph.node)

        out = context.output_path("model.onnx")
        providers = (config.execution_provider,)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="optimize") as pool:
            # the reference session loads beside the optimizer (onnxruntime releases the GIL)
            loading = pool.submit(ort_session.make_session, reference, threads=1, level="disable", providers=providers)
            # A single-threaded session: constant folding then computes the same bits every time.
            # The session runs exactly the graph it saves, so it is also the parity candidate.
            optimizer = ort_session.make_session(source, threads=1, level=config.level, providers=providers,
                                                 optimized_path=out)
            ref_session = loading.result()
        model_section = context.shared.get("model") or {}
        parity = check_parity(ref_session, optimizer, config.parity, config.input_shapes, providers=providers,
                              declared=model_section.get("inputs"))
        del optimizer, ref_session

        optimized = onnx_io.prune_opset_imports(onnx.load(str(out), load_external_data=False))
        if optimized.ir_version > onnx_io.MAX_IR_VERSION:
            onnx_fields.rewrite(out, ir_version=onnx_io.MAX_IR_VERSION)
            optimized.ir_version = onnx_io.MAX_IR_VERSION
        # provenance and the pruned opset imports are written after the graph, in place
        provenance.stamp_file(out, provenance.artifact_props(
            self.name, context.record, context.recipe.license, provenance.input_digests(inputs),
            provenance.upstream_attribution(inputs)),
            opset_import=[(o.domain, o.version) for o in optimized.opset_import])

        domains = onnx_io.custom_domains(optimized)
        context.metrics.update({
            "level": config.level,
            "execution_provider": config.execution_provider,
            "simplify": config.simplify,
            "nodes_before": nodes_before,
            "nodes_after": len(optimized.graph.node),
            "ops_after": onnx_io.op_counts(optimized),
            "custom_domains": domains,
            # nchwc layouts depend on the optimizing host's vector width
            "host_specific": "com.microsoft.nchwc" in domains,
            "size_bytes": out.stat().st_size,
            "ir_version": optimized.ir_version,
            "opset": onnx_io.opset_version(optimized),
            "parity": parity,
        })
        if config.transformer is not None:
            context.metrics["transformer"] = {**config.transformer.model_dump(), "num_heads_used": heads[0],
                                              "hidden_size_used": heads[1]}
            context.metrics["fused"] = fused
            if not fused.get("Attention") and not fused.get("MultiHeadAttention"):
                context.log.warning("the transformer optimizer fused no attention (fused: %s); exports with "
                                    "`transformers`' eager attention fuse, sdpa ones may not", fused or "nothing")
        if domains:
            context.log.info("optimized model uses onnxruntime-only operator domains %s (level %s)",
                             ", ".join(domains), config.level)
        return {"model": out}


def simplify(model, tool: str):
    """The model simplified by `tool` ("onnxsim" or "onnxoptimizer"), IR version fixed.

    Raises StageFailed when the simplifier errors or (onnxsim) its own check fails.
    """
    import importlib.util

    from zoo_stages.lib.onnx import onnx_io

    if tool in ("onnxsim", "onnxoptimizer") and importlib.util.find_spec(tool) is None:
        raise InvalidInput(f"`simplify: {tool}` needs the {tool} package, which is not installed",
                           hint="pip install 'zoo-onnx[simplify]', or set `simplify: none`")
    copy = type(model)()
    copy.CopyFrom(model)
    if tool == "onnxsim":
        try:
            import onnxsim

            result, ok = onnxsim.simplify(copy)
        except Exception as e:  # onnxsim raises RuntimeError/ValueError from its C++ core
            raise StageFailed(f"onnxsim could not simplify the model: {e}",
                              hint="set `simplify: onnxoptimizer` or `simplify: none`") from None
        if not ok:
            raise StageFailed("onnxsim simplified the model but its own output check failed",
                              hint="set `simplify: onnxoptimizer` or `simplify: none`")
    elif tool == "onnxoptimizer":
        try:
            import onnxoptimizer

            # only the passes that fuse or remove nodes: they never change numerics beyond rounding
            result = onnxoptimizer.optimize(copy, onnxoptimizer.get_fuse_and_elimination_passes())
        except Exception as e:  # onnxoptimizer raises from C++ on unsupported graphs
            raise StageFailed(f"onnxoptimizer could not optimize the model: {e}",
                              hint="set `simplify: onnxsim` or `simplify: none`") from None
    else:
        raise ValueError(f"unknown simplifier {tool!r}")
    return onnx_io.fix_ir_version(result)


def check_parity(reference, candidate, parity: ParityConfig, input_shapes: Mapping[str, list[int]] | None = None,
                 providers: tuple[str, ...] = ("CPUExecutionProvider",),
                 declared: Mapping[str, Mapping] | None = None) -> dict:
    """Compare `candidate` with `reference` on fixed random inputs; GateFailed with a table if off.

    Each is a model (proto, path or bytes), run unoptimized on one thread, or an existing
    session (the optimizer's own, which runs the graph it saved). Every input is fed
    ``parity.samples`` batches: per-sample shapes from the model's fixed dims, the recipe's
    ``model.inputs`` (`declared`; named dims become ``parity.dynamic_size``) and `input_shapes`
    (``{input: [batch, ...]}``, over both; its batch is the batch size, default 1 unless the model
    fixes it). Returns `zoo_stages.lib.quality.parity.ParityReport.to_json` plus the seed and the largest
    absolute difference.
    """
    import onnxruntime as ort

    from zoo_stages.lib.runtimes import onnx_run, ort_session
    from zoo_stages.lib.quality import parity as paritylib

    def session(model):
        if isinstance(model, ort.InferenceSession):
            return model
        return ort_session.make_session(model, threads=1, level="disable", providers=providers)

    ref_sess = session(reference)
    cand_sess = session(candidate)
    shapes = onnx_run.declared_shapes(ref_sess, declared, sequence=parity.dynamic_size)
    batch = onnx_run.fixed_batch(ref_sess) or 1
    if input_shapes:
        known = {s.name for s in onnx_run.input_specs(ref_sess)}
        unknown = sorted(set(input_shapes) - known)
        if unknown:
            raise InvalidInput(f"input_shapes names {', '.join(map(repr, unknown))}, which the model does not take",
                               hint=f"the model's inputs are {', '.join(sorted(known))}")
        shapes.update({name: list(shape[1:]) for name, shape in input_shapes.items()})
        batch = next(iter(input_shapes.values()))[0]
    feeds = onnx_run.random_feeds(ref_sess, parity.samples * batch, parity.seed, shapes,
                                  hint="set `input_shapes: {NAME: [1, ...]}` in the optimize config, or declare "
                                       "the recipe's `model.inputs`")
    # all samples in one run (a fixed batch dimension is fed its size at a time)
    report = paritylib.compare(onnx_run.run(ref_sess, feeds), onnx_run.run(cand_sess, feeds),
                               tolerance=paritylib.Tolerance(atol=parity.atol, rtol=parity.rtol),
                               samples=parity.samples)
    report.require("the optimized model's outputs differ from its input's beyond tolerance",
                   hint="use a lower `level`, `simplify: none`, or widen parity.atol/rtol if the drift is acceptable")
    return {**report.to_json(), "seed": parity.seed, "max_abs": report.max_abs}
