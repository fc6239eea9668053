"""A causal language model (``*ForCausalLM`` of ``framework: transformers``) exported as a
generative build: a decoder with a KV cache in zoo's convention (`zoo/decoder_io.py`), the files a
runtime needs beside it, and the parity gate on generation.

The exporter follows the export config's ``exporter``: ``dynamo`` (the default) or
``torchscript`` export through torch.onnx (`zoo_stages.lib.models.causal_lm`); ``genai`` runs
onnxruntime-genai's model builder (fp32, CPU) on a local Hugging Face folder the stage assembles
from the loaded weights and the tokenizer (`zoo_stages.lib.models.genai_builder`: in a process of
its own, offline). Either way the model is then normalised as every export (IR capped at 13, doc
strings and node metadata dropped, the weights inline below protobuf's 2 GB limit, external data
above it, provenance stamped, onnx's full check), and the `genai` output folder holds
genai_config.json (the builder's, with ``config_only=true`` for a torch.onnx export, fitted to the
file's actual inputs and outputs) and the tokenizer files (`genai_builder.tokenizer_files`).

The tokenizer comes from the pretrained folder (its tokenizer files pinned in
``model.pretrained.sha256``), else from the recipe's ``data:`` (the tokenizer the token blocks
were made with, `datasets.tokenizer_json`); a causal LM without either is refused.

Parity gate (`zoo_stages.lib.quality.generation_parity`): the prompts are the held-out split's
first ``generation.prompts`` rows of ``input_ids`` cut to ``generation.prompt_length`` tokens
(seeded random token ids when the data has none); their prefill logits and
``generation.new_tokens`` steps of greedy decoding with the cache against transformers'
``generate(do_sample=False)``: the same tokens, and the logits within ``parity.atol`` /
``parity.rtol``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput

GENAI_OUTPUT = "genai"
GENAI = "genai"  # the export config's `exporter:` that runs onnxruntime-genai's builder


def export(job: Any, label_pretrained: bool) -> None:
    """Write `job.target` (model.onnx) and the `genai` folder; gate them (see the module docstring)."""
    import torch

    from zoo.files import atomic_write
    from zoo_stages.lib.models import archs, causal_lm, checkpoints, genai_builder, hf_models
    from zoo_stages.lib.onnx import export_io, onnx_io
    from zoo_stages.lib.quality import generation_parity, parity
    from zoo_stages.lib.release import provenance
    from zoo_stages.lib.runtimes import ort_session

    import importlib.util

    from zoo.errors import MissingExtra

    if importlib.util.find_spec("onnxruntime_genai") is None:  # its builder writes genai_config.json
        raise MissingExtra("a causal LM's generative build needs onnxruntime-genai, which is not installed",
                           hint="pip install 'zoo-onnx[genai]' (the 'genai' extra)")
    context, config = job.context, job.config
    section = dict(context.shared.get("model") or {})
    data = dict(context.shared.get("data") or {})
    architecture = hf_models.architecture_name(section, context.recipe.dir)
    problem = causal_lm.unsupported(architecture)
    if problem:
        raise InvalidInput(problem, hint="use one of these architectures for a generative build")
    choice = config.exporter if config.exporter is not None else causal_lm.DEFAULT_EXPORTER
    sizes = archs.data_sizes(section, data, context.recipe.dir)
    work = Path(context.work_dir) / "export-decoder"
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(context.threads)))
    try:
        if label_pretrained:
            model = archs.build_model(section, context.recipe.dir, **sizes).eval()
        else:
            model = checkpoints.build_with_weights(section, context.recipe.dir, job.source, job.label, **sizes)
        geometry = causal_lm.Geometry.of(model.config)
        tokenizer = _tokenizer(section, data, context.recipe.dir, model.config)
        folder = genai_builder.hf_folder(model, tokenizer, work / "hf")
        if choice == GENAI:
            built = genai_builder.run(folder, work / "builder", precision="fp32", log=context.log)
            proto = onnx_io.load_model(built / "model.onnx")
            genai_builder.normalise_builder_model(proto)
            builder_config = json.loads((built / genai_builder.CONFIG_FILE).read_text())
            opset = onnx_io.opset_version(proto)
        else:
            opset = config.opset if config.opset is not None else causal_lm.DEFAULT_OPSET[choice]
            proto = causal_lm.export(model, choice, opset, work / "torch")
            builder_config = genai_builder.config_only(folder, work / "config-only", log=context.log)
        export_io.normalise(proto)
        props = dict(job.props)
        if label_pretrained:
            props = hf_models.with_pretrained_sources(props, hf_models.folder_digest(section))
        provenance.stamp(proto, props)
        blob = onnx_io.serialise(proto)
        if blob is None:  # above protobuf's limit: the weights go to model.onnx.data
            export_io.save_large(proto, job.target)
        else:
            export_io.check(blob)
            atomic_write(job.target, blob, fsync=False)
        inputs = [i.name for i in proto.graph.input]
        outputs = [o.name for o in proto.graph.output]
        genai = context.output_path(GENAI_OUTPUT)
        genai.mkdir(parents=True, exist_ok=True)
        runtime_config = genai_builder.genai_config(builder_config, inputs, outputs, job.target.name)
        atomic_write(genai / genai_builder.CONFIG_FILE, genai_builder.config_bytes(runtime_config), fsync=False)
        shipped = _shipped_tokenizer(tokenizer, model.config, runtime_config)
        for name, content in sorted(shipped.items()):
            atomic_write(genai / name, content, fsync=False)
        session = ort_session.make_session(job.target if blob is None else blob, threads=context.threads,
                                           level="all")
        gate = config.generation
        prompts, where = _prompts(data, context.recipe.dir, geometry, gate)
        try:
            report = generation_parity.check(model, session, prompts, gate.new_tokens,
                                             parity.Tolerance(config.parity.atol, config.parity.rtol),
                                             head_size=geometry.head_size)
        except Exception as e:  # onnxruntime's own errors (a kernel's limits): one line, not a traceback
            if type(e).__module__.split(".")[0] != "onnxruntime":
                raise
            raise InvalidInput(f"onnxruntime cannot run the exported decoder: {str(e).splitlines()[0]}",
                               hint="onnxruntime's GroupQueryAttention (the builder's graph) needs a head size that "
                                    "is a multiple of 16; `exporter: dynamo` exports transformers' own attention"
                               if choice == GENAI else "try another `exporter:` (dynamo, torchscript, genai)") from None
    finally:
        torch.set_num_threads(saved_threads)
    tools = {"onnxruntime-genai": genai_builder.version()}
    context.metrics.update(export_io.describe(proto, job.target))
    context.metrics.update({
        "source": job.label,
        "exporter": "transformers",
        "torch_exporter": None if choice == GENAI else choice,
        "decoder_exporter": "onnxruntime-genai builder" if choice == GENAI else f"torch.onnx ({choice})",
        "architecture": architecture,
        "opset": opset,
        "generative": True,
        "decoder": {"layers": geometry.layers, "kv_heads": geometry.kv_heads, "head_size": geometry.head_size,
                    "vocab_size": geometry.vocab_size, "genai_type": causal_lm.FAMILIES[architecture]},
        "genai_files": sorted([genai_builder.CONFIG_FILE, *shipped]),
        "tools": tools,
        "input_shapes": {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
                         for i in proto.graph.input},
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "parity": {**report.to_json(), "data": where},
        "tokens_matched": report.tokens_matched,
        "tokens": report.tokens,
        "max_abs": max(report.prefill.max_abs, report.decode.max_abs),
        "max_rel": max(report.prefill.max_rel, report.decode.max_rel),
    })
    if label_pretrained:
        context.metrics["pretrained"] = hf_models.folder_digest(section)
    report.require(f"the ONNX decoder ({context.metrics['decoder_exporter']}) does not generate as transformers does "
                   f"on {where}", hint="try another `exporter:` (dynamo, torchscript, genai); loosen parity.atol/rtol "
                                       "only if a logits difference is expected")
    context.log.info("exported %s (%s via %s): %d of %d greedy tokens equal transformers', logits max_abs %.3g",
                     job.target.name, architecture, context.metrics["decoder_exporter"], report.tokens_matched,
                     report.tokens, context.metrics["max_abs"])


def _tokenizer(section: Mapping[str, Any], data: Mapping[str, Any], recipe_dir: Path, config: Any) -> dict[str, bytes]:
    """The tokenizer files of the model as the builder's folder holds them: the pretrained folder's
    pinned ones, else tokenizer.json of the data's tokenizer (with a tokenizer_config.json naming
    its special tokens)."""
    from zoo_stages.lib.models import genai_builder, hf_models

    files = hf_models.pretrained_files(section, recipe_dir)
    if "tokenizer.json" in files:
        if section.get("pretrained"):
            hf_models.verified_folder(section, recipe_dir)
        return {name: files[name].read_bytes() for name in hf_models.PRETRAINED_TOKENIZER_FILES if name in files}
    text = _data_tokenizer(data, recipe_dir)
    if text is None:
        raise InvalidInput("a causal LM's generative build ships its tokenizer, and this recipe gives none",
                           hint="pin the pretrained folder's tokenizer.json (and tokenizer_config.json) in "
                                "`model.pretrained.sha256`, or give the data's `tokenizer:`")
    eos = genai_builder.token_text(text, _first(getattr(config, "eos_token_id", None)))
    bos = genai_builder.token_text(text, _first(getattr(config, "bos_token_id", None)))
    return genai_builder.tokenizer_files(text, None, chat_template=None, special_tokens_map=None, eos_token=eos,
                                         bos_token=bos, context_length=None)


def _data_tokenizer(data: Mapping[str, Any], recipe_dir: Path) -> str | None:
    """The data's tokenizer JSON, or None when the data has none."""
    if not data:
        return None
    from zoo.errors import ZooError
    from zoo_stages.lib.data import datasets

    try:
        return datasets.tokenizer_json(dict(data), recipe_dir)
    except ZooError:
        return None


def _shipped_tokenizer(tokenizer: Mapping[str, bytes], config: Any, runtime_config: Mapping[str, Any]
                       ) -> dict[str, bytes]:
    """The tokenizer files beside the build (`genai_builder.tokenizer_files` of the source's)."""
    from zoo_stages.lib.models import genai_builder

    text = tokenizer["tokenizer.json"].decode("utf-8")
    own = json.loads(tokenizer["tokenizer_config.json"]) if "tokenizer_config.json" in tokenizer else {}
    template = own.get("chat_template")
    if "chat_template.jinja" in tokenizer:  # transformers 5 saves the template beside the config
        template = tokenizer["chat_template.jinja"].decode("utf-8")
    special = json.loads(tokenizer["special_tokens_map.json"]) if "special_tokens_map.json" in tokenizer else None
    return genai_builder.tokenizer_files(
        text, own, chat_template=template, special_tokens_map=special,
        eos_token=genai_builder.token_text(text, _first(getattr(config, "eos_token_id", None))),
        bos_token=genai_builder.token_text(text, _first(getattr(config, "bos_token_id", None))),
        context_length=int(runtime_config["model"].get("context_length") or 0) or None)


def _first(value: Any) -> int | None:
    if isinstance(value, (list, tuple)):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _prompts(data: Mapping[str, Any], recipe_dir: Path, geometry: Any, gate: Any) -> tuple[Any, str]:
    """([prompts, prompt_length] int64, what they are): the held-out split's token blocks, else
    seeded random token ids."""
    import numpy as np

    if data:
        from zoo_stages.lib.data import datasets

        held_out = datasets.load_split(dict(data), recipe_dir, "val")
        ids = held_out.features.get("input_ids")
        if ids is not None:
            ids = np.asarray(ids)
            if ids.ndim == 2 and len(ids) >= 1 and ids.shape[1] >= gate.prompt_length:
                return np.array(ids[:gate.prompts, :gate.prompt_length], dtype=np.int64), "the held-out split's tokens"
    rng = np.random.default_rng(gate.seed)
    return rng.integers(0, geometry.vocab_size, (gate.prompts, gate.prompt_length), dtype=np.int64), \
        "seeded random token ids"
