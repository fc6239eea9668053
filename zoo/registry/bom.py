"""A version's bill of materials: a CycloneDX 1.6 ML-BOM derived from the version's own files.

What it lists, and where each part comes from:

- the model (``metadata.component``, type ``machine-learning-model``, with a ``modelCard``: task,
  ports, datasets, every build's recorded metrics) and its license: the manifest;
- each build (a ``machine-learning-model`` component, SHA-256 of its model file; its external data
  and test vectors nested as ``file`` components) and the version-level files (zoo.lock, the
  provenance statement): the manifest;
- the dataset split the stages trained and evaluated on (``data``, its BLAKE3 digest): the provenance
  statement's ``data:split`` material; the files the stages read (a CSV, an imported ONNX file, user
  code), with the BLAKE3 digests the lock records pin: zoo.lock's ``files``;
- third-party sources (pretrained weights, an imported ONNX model) with SHA-256, URI and license:
  the statement's ``source:*`` materials (else the manifest's ``lineage.sources``, without licenses);
- parent models (``model.from: zoo:NAME@VERSION``, a ``source:zoo:…`` material): components with
  their build's SHA-256, and the model's ``pedigree.ancestors``;
- the tools each stage used, with their versions (``library`` components with a ``pkg:pypi`` purl):
  zoo.lock's records, and the manifest's ``lineage.tools``.

It is derived data, not a stage's output: deploy's bytes (which every shipped lockfile pins) do not
change, and a version published before the BOM existed gets one from the same files. The registry
makes it once a version is committed and stores it as an attachment beside the manifest.

Determinism: the BOM is a function of the version's content (`zoo.registry.codec.content_key`: what
makes two publishes "the same version"), so two machines that publish the same version make the same
bytes, and pushing it from either is still a no-op. Left out with what the content key leaves out:
the publish time (no ``metadata.timestamp``, which CycloneDX makes optional), the timing metrics and
the model card that shows them. The serial number is a UUID of the content key, bom-refs are names
(never random), and the JSON is written with sorted keys.

zoo.lock and the statement may be a stranger's (a pulled version): each is read within a size bound
(YAML through `zoo.yamlio`'s limits), and every value is checked before use: a missing, malformed or
oversized part is left out, never raised. Nothing in them is a path zoo opens.

cyclonedx-python-lib builds and serialises the document. Its model lacks two CycloneDX 1.5 fields,
``component.modelCard`` and ``component.data`` (marked TODO in its source): those are added to its
JSON output, and the suite validates the result against the CycloneDX 1.6 JSON schema.
cyclonedx is imported inside the functions: `zoo --help` and a cached run never import it.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from zoo.registry.manifest import NAME_RE, VERSION_RE, Manifest

BOM_SCHEMA_VERSION = 1  # zoo's own: what this module puts where (a property of the BOM); CycloneDX's is specVersion
MAX_INPUT_BYTES = 4 * 1024 * 1024  # zoo.lock or a statement larger than this is left out (zoo writes tens of KB)
MAX_TEXT = 256  # a string from zoo.lock or the statement longer than this is left out
MAX_ITEMS = 2000  # records, materials, files or tools read from one file; more are left out
HEX64 = re.compile(r"^[0-9a-f]{64}$")
# a distribution's name as PEP 508 spells one; anything else from a lock is not a tool name
DIST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?$")
PARENT = re.compile(r"^zoo:([a-z0-9][a-z0-9._-]*)@([^#\s]+)(?:#([a-z0-9][a-z0-9._-]*))?$")
NAMESPACE = uuid.UUID("6f1d1d4e-2c7a-5b36-9a52-7a6f6f2d626f")  # zoo's namespace for the BOM's serial numbers


@dataclass
class Parts:
    """What the BOM is built from, read and checked (`read_parts`)."""

    datasets: list[dict] = field(default_factory=list)  # {name, blake3, license, properties}
    files_read: dict[str, str] = field(default_factory=dict)  # lock `files` label -> blake3 hex
    sources: list[dict] = field(default_factory=list)  # {name, uri, sha256, license, attribution}
    parents: list[dict] = field(default_factory=list)  # {name, version, build, sha256, license}
    tools: dict[tuple[str, str], set[str]] = field(default_factory=dict)  # (distribution, version) -> stage ids


def _text(value: Any, limit: int = MAX_TEXT) -> str | None:
    """`value` when it is a short, printable string (no control characters, which `zoo show` would print)."""
    if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable():
        return None
    return value


def _hex(value: Any) -> str | None:
    return value if isinstance(value, str) and HEX64.match(value) else None


def _statement(data: bytes | None) -> dict:
    """The statement's buildDefinition as a dict ({} when absent, too large or not JSON of that shape)."""
    if not data or len(data) > MAX_INPUT_BYTES:
        return {}
    try:
        stmt = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return {}
    predicate = stmt.get("predicate") if isinstance(stmt, dict) else None
    definition = predicate.get("buildDefinition") if isinstance(predicate, dict) else None
    return definition if isinstance(definition, dict) else {}


def _lock_records(data: bytes | None) -> list[tuple[str, dict]]:
    """(stage id, record) of every record of a zoo.lock of any schema ([] when absent or unreadable)."""
    if not data or len(data) > MAX_INPUT_BYTES:
        return []
    from zoo import yamlio

    try:
        lock = yamlio.safe_load(data)
    except (yamlio.YAMLError, UnicodeDecodeError, RecursionError):
        return []
    if not isinstance(lock, dict):
        return []
    sets = lock.get("platforms") if isinstance(lock.get("platforms"), dict) else {"": lock.get("stages")}
    out = []
    for _, records in sorted(sets.items(), key=lambda kv: str(kv[0])):
        if isinstance(records, dict):
            out += [(sid, r) for sid, r in sorted(records.items(), key=lambda kv: str(kv[0]))
                    if _text(sid) and isinstance(r, dict)]
    return out[:MAX_ITEMS]


def read_parts(manifest: Manifest, read: Callable[[str], bytes | None]) -> Parts:
    """The datasets, files, sources, parents and tools of a version, from its manifest, zoo.lock and statement."""
    parts = Parts()

    def file_bytes(suffix: str) -> bytes | None:
        ref = next((f for f in manifest.files if f.path.endswith(suffix)), None)
        if ref is None or ref.size > MAX_INPUT_BYTES:
            return None
        data = read(ref.path)
        # only the bytes the manifest names: its digest (the serial number's input) then covers them
        if not isinstance(data, bytes) or len(data) > MAX_INPUT_BYTES or hashlib.sha256(data).hexdigest() != ref.sha256:
            return None
        return data

    definition = _statement(file_bytes(".intoto.json"))
    materials = definition.get("resolvedDependencies")
    for dep in (materials if isinstance(materials, list) else [])[:MAX_ITEMS]:
        if not isinstance(dep, dict) or not _text(dep.get("name")):
            continue
        digest = dep.get("digest") if isinstance(dep.get("digest"), dict) else {}
        notes = dep.get("annotations") if isinstance(dep.get("annotations"), dict) else {}
        name = dep["name"]
        if name == "data:split" and not parts.datasets:  # one split per version (a bom-ref must be unique)
            # no data section records a license today; one the statement states is the dataset's license
            parts.datasets.append({"name": _text(notes.get("source")) or "split", "blake3": _hex(digest.get("blake3")),
                                   "license": _text(notes.get("license")),
                                   "properties": {str(k): v for k, v in sorted(notes.items())
                                                  if _text(k, 64) and _text(v) and k not in ("source", "license")}})
        elif name.startswith("source:"):
            _add_source(parts, name.removeprefix("source:"), _text(dep.get("uri")), _hex(digest.get("sha256")),
                        _text(notes.get("license")), _text(notes.get("attribution")))
    if not materials:  # no statement: the sources the manifest names, without their licenses
        for source, digest in sorted(manifest.lineage.sources.items()):
            algo, _, value = digest.partition(":")
            if algo == "sha256" and _hex(value):
                _add_source(parts, source, None, value, None, None)
    for sid, record in _lock_records(file_bytes(".lock")):
        tools = record.get("tools")
        for dist, version in (tools.items() if isinstance(tools, dict) else []):
            if isinstance(dist, str) and DIST_NAME.match(dist) and _text(version, 64):
                parts.tools.setdefault((dist, version), set()).add(sid)
        files = record.get("files")
        for label, digest in (files.items() if isinstance(files, dict) else []):
            # zoo's own places (a parent's pinned build: `zoo-home:`, `cache:`) are the parents below
            if _text(label) and not re.match(r"^[a-z-]+:", label) and _hex(digest) and len(parts.files_read) < MAX_ITEMS:
                parts.files_read[label] = digest
    for dist, version in manifest.lineage.tools.items():
        if DIST_NAME.match(dist) and _text(version, 64):
            parts.tools.setdefault((dist, version), set())
    return parts


def _add_source(parts: Parts, source: str, uri: str | None, sha256: str | None, license: str | None,
                attribution: str | None) -> None:
    """A third-party source: a parent model when it names one (``zoo:NAME@VERSION[#BUILD]``), else upstream files."""
    parent = PARENT.match(uri or "") or PARENT.match(source)
    if source.startswith("zoo:") and not (parent and re.fullmatch(NAME_RE, parent[1]) and re.fullmatch(VERSION_RE, parent[2])):
        return  # claims to be a zoo model but names none
    if parent:
        if all((p["name"], p["version"]) != (parent[1], parent[2]) for p in parts.parents):
            parts.parents.append({"name": parent[1], "version": parent[2], "build": parent[3], "sha256": sha256,
                                  "license": license})
        return
    if all(s["name"] != source for s in parts.sources):
        parts.sources.append({"name": source, "uri": uri, "sha256": sha256, "license": license,
                              "attribution": attribution})


def build_bom(manifest: Manifest, read: Callable[[str], bytes | None]) -> bytes:
    """The CycloneDX 1.6 JSON of `manifest`'s version; `read(path)` gives the bytes of one of its
    version-level files (zoo.lock, the provenance statement), None when the zoo lacks it."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.component import Component, ComponentType, Pedigree
    from cyclonedx.model.tool import ToolRepository
    from cyclonedx.output import make_outputter
    from cyclonedx.schema import OutputFormat, SchemaVersion

    from zoo.registry.codec import content_key

    key = content_key(manifest)  # holds the sha256 of every file read: the serial number covers them
    manifest = Manifest.model_validate_json(key)  # without the publish time, the timings and the card
    parts = read_parts(manifest, read)

    def props(values: dict[str, Any]) -> list:
        return [Property(name=f"zoo:{k}", value=str(v)) for k, v in sorted(values.items()) if v not in (None, "", [])]

    def sha256(hexdigest: str | None) -> list:
        return [HashType(alg=HashAlgorithm.SHA_256, content=hexdigest)] if hexdigest else []

    def file_component(ref, prefix: str) -> Component:
        return Component(type=ComponentType.FILE, name=ref.path, bom_ref=f"{prefix}file:{ref.path}",
                         hashes=sha256(ref.sha256), properties=props({"size": ref.size}))

    model_ref = f"model:{manifest.ref}"
    model = Component(type=ComponentType.MACHINE_LEARNING_MODEL, name=manifest.name, version=manifest.version,
                      bom_ref=model_ref, description=manifest.description or None,
                      licenses=_licenses(manifest.license),
                      properties=props({"task": manifest.task, "recipe.digest": manifest.lineage.recipe.get("digest"),
                                        **{f"stage.{sid}": digest for sid, digest in manifest.lineage.stages.items()}}))
    components = []
    for b in sorted(manifest.builds.values(), key=lambda b: b.name):
        prefix = f"build:{b.name}/"
        components.append(Component(
            type=ComponentType.MACHINE_LEARNING_MODEL, name=b.name, group=manifest.name, version=manifest.version,
            bom_ref=f"build:{b.name}", description=f"{b.precision} {b.format} build of {manifest.ref}",
            hashes=sha256(b.file.sha256),
            properties=props({"build.file": b.file.path, "build.size": b.model_size(), "build.format": b.format,
                              "build.precision": b.precision, "build.runtime": b.runtime, "build.opset": b.opset,
                              "build.verified": b.verified, "build.portable": b.portable,
                              "build.execution_providers": ", ".join(b.execution_providers)}),
            components=[file_component(f, prefix) for f in {f.path: f for f in [*b.extra_files, *b.test_vectors]}.values()]))
    for ref in {f.path: f for f in manifest.files}.values():  # a path listed twice is one file (one bom-ref)
        components.append(file_component(ref, ""))
    for d in parts.datasets:
        components.append(Component(
            type=ComponentType.DATA, name=d["name"], bom_ref=f"data:{d['name']}",
            description="the dataset split the stages trained and evaluated on",
            hashes=[HashType(alg=HashAlgorithm.BLAKE3, content=d["blake3"])] if d["blake3"] else [],
            licenses=_licenses(d["license"]), properties=props({f"data.{k}": v for k, v in d["properties"].items()})))
    for label, digest in sorted(parts.files_read.items()):
        components.append(Component(type=ComponentType.FILE, name=label, bom_ref=f"read:{label}",
                                    description="a file the stages read, as the lock records pin it",
                                    hashes=[HashType(alg=HashAlgorithm.BLAKE3, content=digest)]))
    for s in parts.sources:
        components.append(Component(
            type=ComponentType.MACHINE_LEARNING_MODEL, name=s["name"], bom_ref=f"source:{s['name']}",
            description="a third-party source the stages read (pretrained weights, an imported model)",
            hashes=sha256(s["sha256"]), licenses=_licenses(s["license"]), copyright=s["attribution"],
            external_references=_references(s["uri"]), properties=props({"uri": s["uri"]})))
    ancestors = []
    for p in parts.parents:
        fields = dict(type=ComponentType.MACHINE_LEARNING_MODEL, name=p["name"], version=p["version"],
                      hashes=sha256(p["sha256"]), licenses=_licenses(p["license"]),
                      properties=props({"ref": f"{p['name']}@{p['version']}", "parent.build": p["build"]}))
        components.append(Component(bom_ref=f"parent:{p['name']}@{p['version']}", **fields))
        ancestors.append(Component(bom_ref=f"ancestor:{p['name']}@{p['version']}", **fields))
    if ancestors:
        model.pedigree = Pedigree(ancestors=ancestors)
    for (dist, version), stages in sorted(parts.tools.items()):
        components.append(Component(
            type=ComponentType.LIBRARY, name=dist, version=version, bom_ref=f"tool:{dist}@{version}",
            purl=_purl(dist, version), properties=props({"stages": ", ".join(sorted(stages))})))

    serial = uuid.uuid5(NAMESPACE, f"zoo-bom:{BOM_SCHEMA_VERSION}:{hashlib.sha256(key).hexdigest()}")
    bom = Bom(serial_number=serial, metadata=BomMetaData(
        component=model,
        tools=ToolRepository(components=[Component(type=ComponentType.APPLICATION, name="zoo-onnx",
                                                   bom_ref="tool:zoo-onnx")]),
        properties=[Property(name="zoo:bom_schema_version", value=str(BOM_SCHEMA_VERSION)),
                    Property(name="zoo:ref", value=manifest.ref)]))
    for c in components:
        bom.components.add(c)
    bom.register_dependency(model, components)
    # every bom-ref above is a name, unique: cyclonedx would replace a duplicate by a random one
    document = json.loads(make_outputter(bom, OutputFormat.JSON, SchemaVersion.V1_6).output_as_string())
    del document["metadata"]["timestamp"]  # the publish time is not the version's content (above)
    _model_card(document["metadata"]["component"], manifest, parts)
    for c in document.get("components", []):
        if c.get("type") == "data":
            c["data"] = [{"type": "dataset", "name": c["name"]}]
    return (json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def _licenses(value: str | None) -> list:
    """An SPDX id or expression as such (validated by cyclonedx's SPDX list and license-expression),
    any other text as a license name; none for an unknown license."""
    if not value or value.strip().lower() in ("unspecified", "unknown", "none", "noassertion"):
        return []
    from cyclonedx.contrib.license.factories import LicenseFactory

    return [LicenseFactory().make_from_string(value)]


def _purl(dist: str, version: str):
    from packageurl import PackageURL

    # PyPI's normalised name (PEP 503), the form purl-spec requires for pkg:pypi
    return PackageURL(type="pypi", name=re.sub(r"[-_.]+", "-", dist).lower(), version=version)


def _references(uri: str | None) -> list:
    if not uri or not re.match(r"^(https?|hf)://", uri):
        return []
    from cyclonedx.model import ExternalReference, ExternalReferenceType, XsUri

    return [ExternalReference(type=ExternalReferenceType.DISTRIBUTION, url=XsUri(uri))]


def _model_card(component: dict, manifest: Manifest, parts: Parts) -> None:
    """The CycloneDX modelCard of the model (cyclonedx-python-lib has no model for it): task, ports,
    datasets, and every build's recorded metrics, each sliced by build."""
    parameters: dict[str, Any] = {}
    if manifest.task:
        parameters["task"] = manifest.task
    if parts.datasets:
        parameters["datasets"] = [{"ref": f"data:{d['name']}"} for d in parts.datasets]
    first = min(manifest.builds.values(), key=lambda b: b.name, default=None)
    if first is not None:
        for key, ports in (("inputs", first.inputs), ("outputs", first.outputs)):
            if ports:
                parameters[key] = [{"format": f"{p.name}: {p.dtype} [{', '.join(map(str, p.shape))}]"} for p in ports]
    metrics = []
    for b in sorted(manifest.builds.values(), key=lambda b: b.name):
        for name, value in sorted(b.metrics.items()):
            if value is not None and not isinstance(value, bool):
                metrics.append({"type": name, "value": str(value), "slice": b.name})
    card: dict[str, Any] = {"bom-ref": f"model-card:{manifest.ref}"}
    if parameters:
        card["modelParameters"] = parameters
    if metrics:
        card["quantitativeAnalysis"] = {"performanceMetrics": metrics}
    component["modelCard"] = card


def summary(data: bytes) -> dict:
    """What `zoo show` and the catalog say of a BOM's bytes: spec version, serial number, components by
    type, datasets and the files the stages read (digest), sources and parents (digest, license), tools
    (version); the bytes may be a
    stranger's (read back from a remote), so every value is checked and anything malformed left out."""
    out: dict[str, Any] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "spec_version": None,
                           "serial_number": None, "components": {}, "datasets": [], "files_read": [], "sources": [],
                           "parents": [], "tools": []}
    try:
        doc = json.loads(data) if len(data) <= MAX_INPUT_BYTES else None
    except (ValueError, RecursionError):
        doc = None
    if not isinstance(doc, dict):
        return out
    out["spec_version"] = _text(doc.get("specVersion"), 16)
    out["serial_number"] = _text(doc.get("serialNumber"), 64)
    components = doc.get("components") if isinstance(doc.get("components"), list) else []
    for c in components[:MAX_ITEMS * 4]:
        if not isinstance(c, dict) or not _text(c.get("type"), 64) or not _text(c.get("name")):
            continue
        out["components"][c["type"]] = out["components"].get(c["type"], 0) + 1
        ref = str(c.get("bom-ref") or "")
        entry = {"name": c["name"], "version": _text(c.get("version"), 64), "sha256": _hash(c, "SHA-256"),
                 "blake3": _hash(c, "BLAKE3"), "license": _license(c)}
        if c["type"] == "data":
            out["datasets"].append(entry)
        elif ref.startswith("read:"):
            out["files_read"].append(entry)
        elif ref.startswith("source:"):
            out["sources"].append(entry)
        elif ref.startswith("parent:"):
            out["parents"].append(entry)
        elif c["type"] == "library" and ref.startswith("tool:"):
            out["tools"].append({"name": c["name"], "version": entry["version"]})
    out["components"] = dict(sorted(out["components"].items()))
    return out


def _hash(component: dict, algorithm: str) -> str | None:
    hashes = component.get("hashes")
    for h in hashes if isinstance(hashes, list) else []:
        if isinstance(h, dict) and h.get("alg") == algorithm and _text(h.get("content"), 128):
            return h["content"]
    return None


def _license(component: dict) -> str | None:
    licenses = component.get("licenses")
    for entry in licenses if isinstance(licenses, list) else []:
        if not isinstance(entry, dict):
            continue
        if _text(entry.get("expression")):
            return entry["expression"]
        inner = entry.get("license") if isinstance(entry.get("license"), dict) else {}
        found = _text(inner.get("id")) or _text(inner.get("name"))
        if found:
            return found
    return None
