"""What a site shows, gathered from a zoo (`zoo.site.sources.ZooSource`) into one JSON document:
``site.json`` (schema_version 2), which the pages are rendered from and which the site ships.

Besides the document, collecting returns the small files each version page links to (its card,
its version-level files such as zoo.lock and the provenance statement, its test vectors, its bill
of materials), never its model files: `zoo pull` is how to get a build, and each build carries its
exact command.
"""

from __future__ import annotations

import math

import posixpath
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zoo.manifest import describe_quantization

if TYPE_CHECKING:
    from zoo.registry.manifest import FileRef, Manifest
    from zoo.site.sources import ZooSource

# 1: models → versions → builds, with the lineage graph and the site paths of the copied files;
# 2: each build's `provider_options` (manifest schema 3; {} for builds that need none);
# 3: each version's `speed` axis (latency, or a text-generation version's decode tokens/s) and each
#    build's `speed` figure and `generation` figures (issue #35); each build's `quantization` (manifest
#    schema 4; null when not recorded) and `precision_detail` (its precision with how it was quantized:
#    'int4 (weight-only rtn, 4 bits, block 32, ...)')
# 4: each version's `bom`: its bill of materials (zoo.registry.bom.summary: spec version, components by
#    type, datasets, sources, parents, tools) with the site path of its copy, `href`; null without one
SITE_SCHEMA_VERSION = 4
SITE_FILE = "site.json"

# The build metrics a site plots are fields of the zoo's published format (the registry's index
# reads the same names): verify records the latency, and the task's quality metric; for a
# text-generation build its perplexity against its decode speed (zoo.manifest.GENERATION_METRICS).
LATENCY_METRIC = "latency_p50_ms"
QUALITY_METRICS = {"regression": ("mae", "lower"), "generation": ("perplexity", "lower")}  # task kind -> (metric, which way is better)
LATENCY_AXIS = (LATENCY_METRIC, "lower", "latency p50 (ms)")
SPEED_AXES = {"generation": ("throughput_tokens_per_s", "higher", "decode tokens/s")}  # task kind -> (metric, better, label)
TASK_NAME = r"[a-z][a-z0-9]*(-[a-z0-9]+)*"  # lowercase words joined by '-', as recipes spell a task
DEFAULT_QUALITY = ("accuracy", "higher")

# Files a page links to are copied only when small, and only of types a browser shows or saves but
# never runs: a version's files are untrusted, and an .html or .svg one would run on the site's origin.
COPY_LIMIT = 16 * 1024 * 1024
COPY_SUFFIXES = {"", ".md", ".txt", ".json", ".jsonl", ".lock", ".yaml", ".yml", ".toml", ".pb", ".npy", ".npz",
                 ".csv", ".tsv", ".config", ".png", ".jpg", ".jpeg", ".gif", ".webp"}


@dataclass
class Collected:
    """`doc`: the site.json document; `files`: site path -> bytes of each copied file."""

    doc: dict
    files: dict[str, bytes] = field(default_factory=dict)


def version_page(name: str, version: str) -> str:
    """The site path of a version's page."""
    return f"models/{name}/{version}/index.html"


def version_folder(name: str, version: str) -> str:
    return f"models/{name}/{version}"


def quality_metric(task: str) -> tuple[str, str]:
    """(metric, "higher"|"lower") plotted against latency for a manifest's `task` (mae for regressors).

    A published task name's family is its last word (``tabular-regression``), the convention verify
    names its metrics by; the site reads it here rather than from the recipe's `task:` section (a
    kind's schema, which zoo/ does not import), and any other name gets the default."""
    return QUALITY_METRICS.get(_task_kind(task), DEFAULT_QUALITY)


def speed_axis(task: str) -> tuple[str, str, str]:
    """(metric, "higher"|"lower", axis label) of the speed a manifest's `task` is plotted against:
    the latency, or a text-generation build's decode tokens/s."""
    return SPEED_AXES.get(_task_kind(task), LATENCY_AXIS)


def _task_kind(task: str) -> str:
    return task.rpartition("-")[2] if re.fullmatch(TASK_NAME, task) else "generic"


def pull_command(name: str, version: str, build: str, remote: str | None) -> str:
    """The exact `zoo pull` for one build (with `--remote` when the site shows a remote zoo)."""
    return f"zoo pull {name}@{version} --build {build}" + (f" --remote {remote}" if remote else "")


def copy_refusal(ref: "FileRef") -> str | None:
    """Why the site does not copy `ref` (too large, or a type a browser could run), or None."""
    suffix = posixpath.splitext(ref.path)[1].lower()
    if suffix not in COPY_SUFFIXES:
        return f"not copied: {suffix} files are not served by the site"
    if ref.size > COPY_LIMIT:
        return f"not copied: larger than {COPY_LIMIT // (1024 * 1024)} MB"
    return None


def collect(source: "ZooSource") -> Collected:
    """Every model and version of `source` as the site.json document, with the files to copy."""
    from zoo.registry.refs import version_key

    by_model: dict[str, list] = {}
    for info in source.versions():
        by_model.setdefault(info.name, []).append(info)
    out = Collected(doc={})
    models = []
    for name in sorted(by_model):
        infos = sorted(by_model[name], key=lambda i: version_key(i.version), reverse=True)
        versions = [_version(source.manifest(name, i.version), sorted(i.tags), source, out.files) for i in infos]
        latest = next((v for v in versions if "latest" in v["tags"]), versions[0])
        models.append({
            "name": name, "latest": latest["version"], "task": latest["task"], "license": latest["license"],
            "description": latest["description"],
            "tags": sorted({t for v in versions for t in v["tags"]}),
            "best": _best(latest),
            "page": latest["page"],
            "versions": versions,
        })
    out.doc = {"schema_version": SITE_SCHEMA_VERSION, "generator": _generator(),
               "source": {"kind": "remote" if source.remote else "local", "remote": source.remote},
               "models": models}
    return out


def _generator() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"zoo-onnx {version('zoo-onnx')}"
    except PackageNotFoundError:
        return "zoo-onnx"


def _version(m: "Manifest", tags: list[str], source: "ZooSource", files: dict[str, bytes]) -> dict:
    from zoo.site.lineage import stage_graph

    folder = version_folder(m.name, m.version)
    metric, better = quality_metric(m.task)
    speed, speed_better, speed_label = speed_axis(m.task)
    read: dict[str, bytes | None] = {}  # manifest path -> bytes (None: not in the zoo)
    listed: list[dict] = []

    def take(ref: "FileRef", role: str) -> dict:
        refusal = copy_refusal(ref)
        data = None
        if refusal is None:
            data = read[ref.path] if ref.path in read else source.read(m, ref)
            read[ref.path] = data
            refusal = None if data is not None else "not copied: the zoo does not hold this file"
        href = f"{folder}/files/{ref.path}" if data is not None else None
        if href:
            files[href] = data
        entry = {"path": ref.path, "role": role, "sha256": ref.sha256, "size": ref.size, "href": href,
                 "note": refusal or ""}
        listed.append(entry)
        return entry

    card = take(m.card, "model card") if m.card else None
    for ref in m.files:
        take(ref, _role(ref.path))
    builds = []
    for b in m.builds.values():
        vectors = [take(ref, f"test vector of {b.name}") for ref in b.test_vectors]
        builds.append(_build(m, b, metric, speed, vectors, source.remote))
    bom = _bom(m, source, files, folder)
    lock = next((read.get(f.path) for f in m.files if f.path.endswith(".lock")), None)
    provenance = next((read.get(f.path) for f in m.files if f.path.endswith(".intoto.json")), None)
    lineage = m.lineage.model_dump(mode="json")
    return {
        "name": m.name, "version": m.version, "created": m.created, "task": m.task, "license": m.license,
        "description": m.description, "tags": tags, "page": version_page(m.name, m.version),
        "quality": {"metric": metric, "better": better},
        "speed": {"metric": speed, "better": speed_better, "label": speed_label},
        "builds": builds,
        "card": card["href"] if card else None,
        "files": listed,
        "bom": bom,
        "lineage": {"recipe": lineage["recipe"], "sources": lineage["sources"], "tools": lineage["tools"],
                    **stage_graph(lineage, lock, provenance)},
    }


def _bom(m: "Manifest", source: "ZooSource", files: dict[str, bytes], folder: str) -> dict | None:
    """The version's bill of materials as site.json says it (summary and `href`), its bytes copied beside
    the version's files (JSON: shown or saved by a browser, never run); None when it carries none."""
    from zoo.registry.attachments import BOM
    from zoo.registry.bom import summary

    data = source.attachment(m, BOM)
    if data is None:
        return None
    href = None
    if len(data) <= COPY_LIMIT:
        href = f"{folder}/attachments/{BOM}"  # not under files/: a manifest may name a file bom.cdx.json
        files[href] = data
    return {**summary(data), "path": BOM, "href": href}


def _role(path: str) -> str:
    if path.endswith(".lock"):
        return "lockfile (the lock record of every stage)"
    if path.endswith(".intoto.json"):
        return "provenance (in-toto statement, SLSA provenance v1)"
    return "version file"


def _number(value) -> float | None:
    """A figure the plots can place: a finite float (NaN, infinities and ints past a float are none)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _build(m: "Manifest", b, metric: str, speed: str, vectors: list[dict], remote: str | None) -> dict:
    from zoo.registry.manifest import generation_figures

    figures = b.metrics
    return {
        "name": b.name, "format": b.format, "precision": b.precision, "runtime": b.runtime, "portable": b.portable,
        "quantization": dict(sorted(b.quantization.items())) if b.quantization else None,
        "precision_detail": describe_quantization(b.precision, b.quantization),
        "verified": b.verified, "unverified_reason": b.unverified_reason, "measured_on": dict(b.measured_on),
        "execution_providers": list(b.execution_providers), "requires": dict(b.requires),
        "provider_options": {k: dict(v) for k, v in sorted(b.provider_options.items())},
        "file": b.file.path, "sha256": b.file.sha256, "size": b.model_size(),
        "latency_p50_ms": _number(figures.get(LATENCY_METRIC)),
        "quality": _number(figures.get(metric)),
        "speed": _number(figures.get(speed)),
        "generation": {k: _number(v) for k, v in generation_figures(figures).items() if _number(v) is not None},
        "metrics": {k: v for k, v in sorted(figures.items())},
        "test_vectors": [{"path": v["path"], "href": v["href"]} for v in vectors],
        "pull": pull_command(m.name, m.version, b.name, remote),
    }


def _best(version: dict) -> dict | None:
    """The best figure of the version's metric among its builds ({"metric", "value", "build"}), or None."""
    metric, better = version["quality"]["metric"], version["quality"]["better"]
    scored = [(b["quality"], b["name"]) for b in version["builds"] if b["quality"] is not None]
    if not scored:
        return None
    value, build = (max if better == "higher" else min)(scored, key=lambda s: s[0])
    return {"metric": metric, "better": better, "value": value, "build": build}
