"""The model card (README.md) of a release: YAML front matter plus Markdown, from the manifest.

The card is rendered from the same `Manifest` that deploy writes (plus a few facts the
manifest does not hold: dataset, intended use, limitations), so the two cannot disagree.
Output is byte-deterministic: sorted keys, fixed number formatting, no dates.
"""

from __future__ import annotations

from typing import Any, Mapping

from zoo.errors import InvalidInput
from zoo.manifest import Build, Manifest, describe_measured_on, describe_quantization

FRONT_MATTER_DELIMITER = "---"

# metrics shown in the builds table, in this order, when any build has them: only those that
# apply to the task are ever recorded (no accuracy for a regression or a label-less model)
_TABLE_METRICS = (("accuracy", "Accuracy"), ("accuracy_drop", "Accuracy drop"), ("macro_f1", "Macro-F1"),
                  ("mae", "MAE"), ("rmse", "RMSE"), ("r2", "R²"), ("latency_p50_ms", "p50 latency (ms)"))

DEFAULT_INTENDED_USE = (
    "Research and evaluation of the task above on inputs that resemble the training data, "
    "prepared as the Preprocessing section says. Check the metrics of the build you deploy on "
    "your own data before relying on its outputs."
)
DEFAULT_LIMITATIONS = (
    "Quality figures come from the held-out split of the recipe's dataset; other data may "
    "give different results. Latency figures were measured on the build machine's CPU."
)


def render_card(manifest: Manifest, *, dataset: Mapping[str, Any] | None = None, intended_use: str = "",
                limitations: str = "", verification: Mapping[str, Any] | None = None,
                conversions: Mapping[str, Mapping[str, Any]] | None = None, appendix: str = "") -> str:
    """The README.md text of `manifest`: YAML front matter, then Markdown sections.

    `dataset` is the recipe's ``data:`` section, `verification` verify's summary (reference
    build, gates), `conversions` build name -> how it was converted (kind, source, parity);
    `appendix` is Markdown appended last (deploy's Provenance section).
    """
    import yaml

    front = front_matter(manifest, dataset=dataset)
    head = yaml.safe_dump(front, sort_keys=True, allow_unicode=True, default_flow_style=False, width=100)
    parts = [FRONT_MATTER_DELIMITER, head.rstrip("\n"), FRONT_MATTER_DELIMITER, ""]
    parts += [f"# {manifest.name} {manifest.version}", ""]
    if manifest.description:
        parts += [manifest.description.strip(), ""]
    parts += [f"- **Task:** {manifest.task or 'unspecified'}", f"- **License:** {manifest.license}"]
    if dataset:
        parts.append(f"- **Dataset:** {_dataset_line(dataset)}")
    parts.append("")
    parts += _builds_section(manifest)
    parts += _ports_section(manifest)
    parts += _preprocessing_section(manifest)
    parts += _metrics_section(manifest)
    if verification:
        parts += _verification_section(verification)
    if conversions:
        parts += _conversions_section(conversions)
    parts += ["## Intended use", "", (intended_use or DEFAULT_INTENDED_USE).strip(), ""]
    parts += ["## Limitations", "", (limitations or DEFAULT_LIMITATIONS).strip(), ""]
    parts += _pull_section(manifest)
    parts += _lineage_section(manifest)
    text = "\n".join(parts).rstrip("\n") + "\n"
    if appendix.strip("\n"):
        text = text + "\n" + appendix.rstrip("\n") + "\n"
    return text


def front_matter(manifest: Manifest, *, dataset: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The card's YAML front matter as plain data (also what tests and tools read back)."""
    fm: dict[str, Any] = {
        "name": manifest.name,
        "version": manifest.version,
        "license": manifest.license,
        "task": manifest.task,
        "pipeline_tag": manifest.task,
        "library_name": "onnx",
        "tags": sorted({"onnx", *(b.precision for b in manifest.builds.values()),
                        *(b.format for b in manifest.builds.values())}),
        "metrics": {name: dict(sorted(b.metrics.items())) for name, b in manifest.builds.items()},
        "builds": {name: _build_summary(b) for name, b in manifest.builds.items()},
        "lineage": {
            "recipe": dict(sorted(manifest.lineage.recipe.items())),
            "stages": dict(sorted(manifest.lineage.stages.items())),
            "tools": dict(sorted(manifest.lineage.tools.items())),
        },
    }
    if manifest.preprocessing:
        fm["preprocessing"] = manifest.preprocessing
    if manifest.lineage.sources:
        fm["lineage"]["sources"] = dict(sorted(manifest.lineage.sources.items()))
    if dataset:
        clean = {k: v for k, v in sorted(dataset.items()) if v is not None}
        fm["dataset"] = clean
        if clean.get("source"):
            fm["datasets"] = [str(clean.get("path") or clean["source"])]
    return fm


def _build_summary(b: Build) -> dict[str, Any]:
    out: dict[str, Any] = {
        "file": b.file.path, "sha256": b.file.sha256, "size_bytes": b.file.size,
        "format": b.format, "precision": b.precision, "opset": b.opset,
        "execution_providers": list(b.execution_providers),
    }
    if b.requires:
        out["requires"] = dict(sorted(b.requires.items()))
    if b.provider_options:
        out["provider_options"] = {k: dict(sorted(v.items())) for k, v in sorted(b.provider_options.items())}
    if b.runtime:
        out["runtime"] = b.runtime
    if b.portable is not None:
        out["portable"] = b.portable
    if b.verified is not None:
        out["verified"] = b.verified
    if b.unverified_reason:
        out["unverified_reason"] = b.unverified_reason
    if b.measured_on:
        out["measured_on"] = dict(sorted(b.measured_on.items()))
    if b.quantization:
        out["quantization"] = dict(sorted(b.quantization.items()))
    return out


def parse_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """Split a card into (front matter as data, Markdown body); InvalidInput if it has none."""
    from zoo import yamlio

    lines = text.split("\n")
    if not lines or lines[0].strip() != FRONT_MATTER_DELIMITER:
        raise InvalidInput("model card has no YAML front matter", hint="the card must start with a '---' line")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == FRONT_MATTER_DELIMITER)
    except StopIteration:
        raise InvalidInput("model card front matter is not closed", hint="add a '---' line after it") from None
    data = yamlio.load_text("\n".join(lines[1:end]), "model card", "its front matter",
                            hint="fix the YAML between the '---' lines") or {}
    if not isinstance(data, dict):
        raise InvalidInput("model card front matter is not a mapping")
    return data, "\n".join(lines[end + 1:])


# ---------------------------------------------------------------------------------------------
# sections


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def _dataset_line(dataset: Mapping[str, Any]) -> str:
    source = dataset.get("source", "?")
    bits = [f"`{source}`" + (f" ({dataset['path']})" if dataset.get("path") else "")]
    if dataset.get("image_size"):
        bits.append(f"{dataset['image_size']}x{dataset['image_size']}, {dataset.get('channels', 1)} channel(s)")
    if dataset.get("val_fraction") is not None:
        bits.append(f"held-out fraction {dataset['val_fraction']}, split seed {dataset.get('split_seed', 0)}")
    return "; ".join(bits)


def _builds_section(m: Manifest) -> list[str]:
    shown = [(k, title) for k, title in _TABLE_METRICS if any(k in b.metrics for b in m.builds.values())]
    header = ["Build", "File", "Format", "Precision", "Opset", "Size", "Runtime", "Execution providers", "Requires",
              "Verified"]
    header += [title for _, title in shown]
    rows = []
    for name, b in m.builds.items():
        rows.append([f"`{name}`", f"`{b.file.path}`", b.format, describe_quantization(b.precision, b.quantization),
                     _fmt(b.opset), _size(b.file.size),
                     f"`{b.runtime}`" if b.runtime else "-", ", ".join(b.execution_providers),
                     ", ".join(_requirement(k, v) for k, v in sorted(b.requires.items())) or "-",
                     _fmt(b.verified) + (" (portable)" if b.portable else "")]
                    + [_fmt(b.metrics.get(k)) for k, _ in shown])
    out = ["## Builds", ""] + _table(header, rows)
    portable = [f"`{n}`" for n, b in m.builds.items() if b.portable]
    if portable:
        out += [f"Portable ONNX (standard domains only, `onnx.checker` full check, test vectors reproduced by "
                f"`onnx.reference` and onnxruntime): {', '.join(portable)}.", ""]
    unverified = [(n, b) for n, b in m.builds.items() if b.verified is False]
    if unverified:  # a label is a claim: say which builds were never run where they are meant to run
        out += ["**Not verified** on the runtime or device they are made for (`zoo pull` picks them only by name):", ""]
        out += [f"- `{n}`: {b.unverified_reason or 'no reason recorded'}" for n, b in unverified] + [""]
    timed = {n: b.measured_on for n, b in m.builds.items() if b.measured_on}
    if timed:
        out += ["Latency and throughput measured on:", ""]
        out += [f"- `{n}`: {describe_measured_on(w)}" for n, w in timed.items()] + [""]
    return out


def _requirement(key: str, value: str) -> str:
    # version constraints read naturally glued to the name: onnxruntime>=1.31
    return f"{key}{value}" if value[:1] in "<>=!~" else f"{key}={value}"


def _ports_section(m: Manifest) -> list[str]:
    out = ["## Inputs and outputs", ""]
    signatures: dict[str, list[str]] = {}
    for name, b in m.builds.items():
        key = repr([(p.name, p.dtype, p.shape) for p in b.inputs + b.outputs]) + repr(len(b.inputs))
        signatures.setdefault(key, []).append(name)
    for names in signatures.values():
        b = m.builds[names[0]]
        if len(signatures) > 1:
            out += [f"Builds {', '.join(f'`{n}`' for n in names)}:", ""]
        rows = [[role, f"`{p.name}`", p.dtype, "[" + ", ".join(_fmt(d) if d is not None else "?" for d in p.shape) + "]"]
                for role, ports in (("input", b.inputs), ("output", b.outputs)) for p in ports]
        out += _table(["Role", "Name", "Type", "Shape"], rows)
    return out


def _preprocessing_section(m: Manifest) -> list[str]:
    """What a user must do to an input before feeding the model, from the manifest's record."""
    if not m.preprocessing:
        return []
    import json

    record = {k: v for k, v in m.preprocessing.items() if k != "schema_version"}
    out = ["## Preprocessing", "",
           "Apply these steps to every input (the recipe's data transforms; training, calibration and "
           "verification used exactly these):", ""]
    for key in sorted(record):
        value = record[key]
        shown = json.dumps(value, sort_keys=True, ensure_ascii=False) if isinstance(value, (dict, list)) else _fmt(value)
        out.append(f"- **{key}:** `{shown}`" if isinstance(value, (dict, list)) else f"- **{key}:** {shown}")
    files = [f.path for f in m.files if f.path.endswith("tokenizer.json")]
    if files:
        out += ["", f"The tokenizer ships with the version: `{files[0]}` (Hugging Face `tokenizers` format)."]
    return out + [""]


def _metrics_section(m: Manifest) -> list[str]:
    keys = sorted({k for b in m.builds.values() for k in b.metrics})
    if not keys:
        return ["## Metrics", "", "No metrics were recorded for this release.", ""]
    rows = [[f"`{k}`"] + [_fmt(b.metrics.get(k)) for b in m.builds.values()] for k in keys]
    return ["## Metrics", ""] + _table(["Metric"] + [f"`{n}`" for n in m.builds], rows)


def _verification_section(v: Mapping[str, Any]) -> list[str]:
    out = ["## Verification", ""]
    if v.get("reference"):
        out.append(f"Reference build: `{v['reference']}`.")
    if v.get("threads") is not None:
        out.append(f"Measured with {v['threads']} thread(s).")
    if out[-1] != "":
        out.append("")
    gates = v.get("gates") or []
    if gates:
        out += ["Quality gates:", ""]
        for gate in gates:
            if isinstance(gate, Mapping):
                out.append("- " + ", ".join(f"{k}: {_fmt(gate[k])}" for k in sorted(gate)))
            else:
                out.append(f"- {_fmt(gate)}")
        out.append("")
    return out


def _conversions_section(conversions: Mapping[str, Mapping[str, Any]]) -> list[str]:
    out = ["## Conversions", ""]
    for name in conversions:
        c = conversions[name]
        line = f"- `{name}`: {c.get('kind')} conversion of stage `{c.get('from')}`"
        if c.get("kind") == "fp16":
            line += " (float16 weights and compute, float32 inputs and outputs)"
        if c.get("kind") == "tensorrt":
            line += (f" ({c.get('precision')} engine built by onnxruntime's TensorrtExecutionProvider on the GPU "
                     "where it first runs, cached by the provider options below; the file is the source model)")
        if c.get("optimization_style"):
            line += f", ORT optimization style {c['optimization_style']}"
        if c.get("parity_max_abs") is not None:
            line += (f"; parity on {c.get('parity_on') or 'the CPU'}: max |diff| {_fmt(c['parity_max_abs'])} "
                     f"(atol {_fmt(c.get('parity_atol'))}, rtol {_fmt(c.get('parity_rtol'))}, "
                     f"{c.get('parity_samples')} samples)")
        if c.get("files"):
            line += "; files: " + ", ".join(f"`{f}`" for f in c["files"])
        out.append(line + ".")
        if c.get("provider_options"):
            options = ", ".join(f"`{k}={v}`" for k, v in sorted(c["provider_options"].items()))
            out.append(f"  Create the TensorRT provider with {options} (`zoo.load` does).")
        if c.get("optimization_style") == "Runtime":
            replay = c.get("runtime_optimizations_replay")
            if replay == "ok":
                out.append("  The saved optimizations can be replayed with the session option "
                           "`session.enable_saved_runtime_optimizations=1` (checked at build time).")
            elif replay:
                out.append("  Load it without `session.enable_saved_runtime_optimizations`: replaying the saved "
                           f"optimizations was checked at build time and {replay.replace('|', '/')}.")
    return out + [""]


def _pull_section(m: Manifest) -> list[str]:
    out = ["## How to pull", "", "```sh"]
    out += [f"zoo pull {m.ref} --build {name}" for name in m.builds]
    out += ["```", ""]
    first_name, first = next(iter(m.builds.items()))
    feeds = ", ".join(f'"{p.name}": ...' for p in first.inputs)
    out += [f"Then, for example with the `{first_name}` build:", "", "```python", "import onnxruntime as ort",
            "", f'session = ort.InferenceSession("{first.file.path.rsplit("/", 1)[-1]}", '
            f'providers={list(first.execution_providers)!r})',
            f"outputs = session.run(None, {{{feeds}}})", "```", ""]
    out += ["Each build ships test vectors in the ONNX Model Zoo layout "
            "(`test_data_set_0/input_0.pb`, `output_0.pb`): feed the inputs and compare the outputs "
            "to check an installation.", ""]
    return out


def _lineage_section(m: Manifest) -> list[str]:
    lin = m.lineage
    out = ["## Lineage", ""]
    if lin.recipe:
        out.append("Recipe: " + ", ".join(f"{k} `{v}`" for k, v in sorted(lin.recipe.items())) + ".")
        out.append("")
    if lin.stages:
        out += _table(["Stage", "Cache key"], [[f"`{k}`", f"`{v}`"] for k, v in sorted(lin.stages.items())])
    if lin.sources:
        out += _table(["Source", "Digest"], [[f"`{k}`", f"`{v}`"] for k, v in sorted(lin.sources.items())])
    if lin.tools:
        out.append("Tools: " + ", ".join(f"{k} {v}" for k, v in sorted(lin.tools.items())) + ".")
        out.append("")
    return out
