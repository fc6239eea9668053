"""Provenance: ONNX ``metadata_props`` stamps, the release lockfile, the in-toto statement.

Three records say where an artifact came from, all built from the same data and all
byte-deterministic (sorted keys, no timestamps, no host paths):

- ``metadata_props`` stamped into every ONNX file a stage writes. Intermediate artifacts
  (export, optimize, quantize) carry only what their cache key determines::

      zoo.kind         the stage kind            zoo.sources      JSON {upstream.output: blake3:<hex>,
      zoo.stage_record the digest of its lock record                weights|onnx: sha256:<hex>}
      zoo.license      the recipe's license
      zoo.attribution  JSON list of third-party sources (license, attribution, uri, sha256), when any

  The stage id is *not* stamped: it is not part of the cache key, so two stages with the
  same key would share bytes that name only one of them. Release builds (deploy) carry the
  full set: ``zoo.recipe`` (name@version), ``zoo.recipe_digest``, ``zoo.build``, plus the
  keys above (``zoo.stage_record`` is then deploy's).

  Nothing stamped may come from outside the stage's record (zoo/engine/lockfile.py): not the
  cache key (it also holds the kind's code), not zoo's version. A rerun for a code change that
  moves no byte then writes the same file, and the lockfile holds.
- ``zoo.lock``: the lock records of every stage that built the release (zoo/engine/lockfile.py's
  format), i.e. exactly what `zoo repro` needs to rebuild it.
- ``provenance.intoto.json``: an in-toto Statement v1 with a SLSA provenance v1 predicate:
  subjects are the release's build files (sha256), materials are the stages' outputs, the
  dataset split and third-party sources; the builder is zoo, with no version (neither zoo's version
  nor the kind epoch is in any lock record: a statement naming them would change with an upgrade
  that moves no other byte).

License propagation: each stamping stage reads ``zoo.attribution`` from its upstream ONNX
models and adds its own third-party sources (export's ``weights:`` / ``onnx:``), so the
attribution of a source reaches every derived build. The bytes of the upstream models are in
the stage's key, so what is propagated is determined by the key too.

Only the standard library is imported at module level; ``onnx`` is imported to stamp.

This module is not part of any cache key (only a kind's own module is hashed): a change to
what it writes changes the output bytes of export, optimize, quantize and deploy, so bump
those kinds' ``version`` with it, or `zoo repro --check` will report the difference.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from zoo.errors import InvalidInput

PREFIX = "zoo."
LOCK_FILE = "zoo.lock"
STATEMENT_FILE = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "urn:zoo-onnx:buildtype:recipe:v1"

# Well-known publishers of pretrained weights: the license and credit a `weights:` source from
# them carries unless the recipe says otherwise (`weights: {license: ..., attribution: ...}`).
KNOWN_SOURCES: tuple[tuple[str, dict[str, str]], ...] = (
    ("https://download.pytorch.org/models/",
     {"license": "BSD-3-Clause", "attribution": "torchvision pretrained weights, (c) PyTorch contributors"}),
)


def canonical(obj: Any) -> str:
    """Compact JSON with sorted keys: the form of every JSON-valued metadata prop."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# reading and writing metadata_props


def read_metadata(path: Path) -> dict[str, str]:
    """The ``metadata_props`` of an ONNX file, read from the protobuf wire format.

    Only the top-level message is walked and every other field is skipped by its length, so
    weights are never parsed and nothing is imported. InvalidInput if the file is not protobuf.
    """
    from zoo_stages.lib.onnx import onnx_fields

    return dict(onnx_fields.read_header(Path(path)).metadata)


def stamp(model: Any, props: Mapping[str, str]) -> Any:
    """Replace the ``zoo.*`` entries of an onnx ModelProto's metadata_props with `props` (in place).

    Entries of other tools are kept in their order; ours follow, sorted by key, so the same
    props always give the same bytes.
    """
    entries = stamped_entries([(p.key, p.value) for p in model.metadata_props], props)
    del model.metadata_props[:]
    for key, value in entries:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return model


def stamped_entries(existing: Iterable[tuple[str, str]], props: Mapping[str, str]) -> list[tuple[str, str]]:
    """`existing` metadata entries with the ``zoo.*`` ones replaced by `props` (see `stamp`)."""
    bad = [k for k in props if not k.startswith(PREFIX)]
    if bad:
        raise ValueError(f"provenance props must start with {PREFIX!r}: {bad}")
    kept = [(k, v) for k, v in existing if not k.startswith(PREFIX)]
    return kept + sorted((k, str(v)) for k, v in props.items())


def stamp_file(path: Path, props: Mapping[str, str], *,
               opset_import: Iterable[tuple[str, int]] | None = None) -> Path:
    """Stamp the ONNX file at `path` with `props` (and optionally new opset imports).

    Only the small top-level fields are rewritten (`zoo_stages.lib.onnx.onnx_fields`): the graph and
    its weights are neither parsed nor copied, unless the file has other hard links, in which
    case it is rewritten to a new inode and renamed. External data is left untouched.
    """
    from zoo_stages.lib.onnx import onnx_fields

    path = Path(path)
    header = onnx_fields.read_header(path)
    return onnx_fields.rewrite(path, metadata=stamped_entries(header.metadata, props),
                            opset_import=list(opset_import) if opset_import is not None else None)


# ---------------------------------------------------------------------------------------------
# what a stage stamps


def input_digests(inputs: Iterable[Any]) -> dict[str, str]:
    """``{"<upstream stage>.<output>": "blake3:<hex>"}``: the digests that enter the stage's key.

    Computed with the engine's own `zoo.engine.hashing.digest_path`, so they equal the lockfile's
    ``inputs`` (a stamp never names an upstream *key*: a key may change while the bytes, and
    so this stage's key, do not).
    """
    from zoo.engine.hashing import ALGORITHM, digest_path

    out: dict[str, str] = {}
    for up in inputs:
        for name, path in sorted(up.outputs.items()):
            out[f"{up.stage_id}.{name}"] = f"{ALGORITHM}:{digest_path(Path(path))}"
    return dict(sorted(out.items()))


def model_attribution(path: Path) -> list[dict[str, str]]:
    """The third-party sources recorded in an ONNX file's ``zoo.attribution`` ([] if none)."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("*.onnx"))
        if len(found) != 1:
            return []
        path = found[0]
    if path.suffix != ".onnx" or not path.is_file():
        return []
    raw = read_metadata(path).get(PREFIX + "attribution")
    if not raw:
        return []
    try:
        items = json.loads(raw)
    except ValueError:
        raise InvalidInput(f"{path.name}: metadata zoo.attribution is not valid JSON",
                           hint="re-run the stage that wrote this model") from None
    return [dict(i) for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def upstream_attribution(inputs: Iterable[Any]) -> list[dict[str, str]]:
    """Every third-party source recorded in the upstream stages' ONNX models."""
    return merge_attribution(*(model_attribution(Path(p)) for up in inputs for p in up.outputs.values()))


def source_attribution(source: str, *, url: str | None = None, path: str | None = None,
                       sha256: str | None = None, license: str | None = None,
                       attribution: str | None = None) -> dict[str, str]:
    """The attribution record of a third-party file (e.g. export's ``weights:``).

    License and credit come from the recipe when given, else from `KNOWN_SOURCES` by URL.
    A local path is recorded by file name only: its bytes are pinned by the sha256, and the
    folder it sits in differs between machines.
    """
    record: dict[str, str] = {"source": source}
    if url:
        record["uri"] = url
        for prefix, known in KNOWN_SOURCES:
            if url.startswith(prefix):
                record.update(known)
    elif path:
        record["uri"] = f"file:{Path(path).name}"
    if sha256:
        record["sha256"] = sha256
    if license:
        record["license"] = license
    if attribution:
        record["attribution"] = attribution
    return record


def merge_attribution(*groups: Iterable[Mapping[str, str]]) -> list[dict[str, str]]:
    """Distinct attribution records, in a fixed order."""
    seen = {canonical(dict(r)): dict(r) for group in groups for r in group}
    return [seen[k] for k in sorted(seen)]


def license_text(license: str, attribution: Iterable[Mapping[str, str]]) -> str:
    """One line: the recipe's license, then each source's license and credit."""
    parts = [license or "unspecified"]
    for r in attribution:
        credit = r.get("attribution") or r.get("uri") or r.get("source", "")
        parts.append(f"{r.get('source', 'source')}: {r.get('license', 'license unknown')} ({credit})")
    return "; ".join(parts)


def artifact_props(kind: str, record: str, license: str, sources: Mapping[str, str],
                   attribution: Iterable[Mapping[str, str]] = ()) -> dict[str, str]:
    """The stamp of an intermediate ONNX artifact (export, optimize, quantize outputs)."""
    props = {
        PREFIX + "kind": kind,
        PREFIX + "stage_record": record,
        PREFIX + "sources": canonical(dict(sources)),
        PREFIX + "license": license or "unspecified",
    }
    attribution = list(attribution)
    if attribution:
        props[PREFIX + "attribution"] = canonical(attribution)
    return props


def release_props(recipe: Any, record: str, build: str, sources: Mapping[str, str],
                  attribution: Iterable[Mapping[str, str]] = ()) -> dict[str, str]:
    """The stamp of a shipped build (deploy): recipe identity, build name, sources, license."""
    props = artifact_props("deploy", record, recipe.license, sources, attribution)
    props.update({
        PREFIX + "recipe": f"{recipe.name}@{recipe.version}",
        PREFIX + "recipe_digest": recipe.digest,
        PREFIX + "build": build,
    })
    return props


# ---------------------------------------------------------------------------------------------
# the release's lockfile and statement


def lock_yaml(recipe: Any, lineage: Mapping[str, Mapping[str, Any]]) -> str:
    """The lockfile of a release: the lock records of every stage that built it.

    Filed under `zoo.host.UNKNOWN_PLATFORM`: the release's bytes depend on its key alone, and a key
    does not say which platform class built the ancestors (the recipe's lockfile does), so a
    machine using it as a lockfile compares bytes or checks equivalence, never takes it for its own."""
    from zoo.engine.lockfile import Lock, StageLock
    from zoo.host import UNKNOWN_PLATFORM

    try:
        stages = {sid: StageLock.read(dict(record)) for sid, record in lineage.items()}
    except TypeError as e:
        raise InvalidInput(f"a lineage record is not a lock record: {e}",
                           hint="the engine passes lock records in context.lineage") from None
    return Lock(recipe={"name": recipe.name, "version": recipe.version, "digest": recipe.digest},
                platforms={UNKNOWN_PLATFORM: stages} if stages else {}).to_yaml()


def statement(*, subjects: Iterable[tuple[str, str]], recipe: Any, record: str, config: Mapping[str, Any],
              lineage: Mapping[str, Mapping[str, Any]], tools: Mapping[str, str],
              inputs: Mapping[str, str] | None = None, data: Mapping[str, Any] | None = None,
              attribution: Iterable[Mapping[str, str]] = (), lock_sha256: str | None = None,
              publisher: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An in-toto Statement v1 with a SLSA provenance v1 predicate for one release.

    `subjects`: (path inside the version, sha256) of every build file. `lineage`: ancestor
    stage id -> lock record; `inputs`: digests of direct inputs the lineage lacks (stages run
    outside the engine). `data`: {"digest", ...} of the dataset split. `lock_sha256`: the
    release's zoo.lock, recorded as a byproduct. `publisher`: the stage that made the release
    ({"stage", "kind", "record", "inputs": its direct upstream stage ids}): the zoo.lock cannot hold
    its record (written before it ends), and the lineage graph ends at it.
    """
    from zoo.engine.lockfile import record_identity

    attribution = merge_attribution(attribution)
    identities = {sid: record_identity(dict(r)) for sid, r in lineage.items()}
    dependencies: list[dict[str, Any]] = []
    for sid in sorted(lineage):
        ancestor = lineage[sid]
        for name, digest in sorted((ancestor.get("outputs") or {}).items()):
            dependencies.append({"name": f"stage:{sid}/{name}", "digest": _digest(digest),
                                 "annotations": {"kind": ancestor.get("kind"), "record": identities[sid]}})
    for label, digest in sorted((inputs or {}).items()):
        sid, _, name = label.partition(".")
        if sid not in lineage:
            dependencies.append({"name": f"stage:{sid}/{name}", "digest": _digest(digest)})
    if data and data.get("digest"):
        dependencies.append({"name": "data:split", "digest": _digest(data["digest"]),
                             "annotations": {k: v for k, v in sorted(data.items()) if k != "digest"}})
    for r in attribution:
        dep: dict[str, Any] = {"name": f"source:{r.get('source', 'source')}"}
        if r.get("uri"):
            dep["uri"] = r["uri"]
        if r.get("sha256"):
            dep["digest"] = {"sha256": r["sha256"]}
        notes = {k: r[k] for k in ("license", "attribution") if r.get(k)}
        if notes:
            dep["annotations"] = notes
        dependencies.append(dep)
    run_details: dict[str, Any] = {
        # no version: the bytes may hold only what the stage's record holds (the stages' kind
        # versions are in internalParameters.stages and the publisher)
        "builder": {"id": "urn:zoo-onnx:builder:zoo"},
        "metadata": {"invocationId": f"urn:zoo-onnx:stage-record:{record or 'unknown'}"},
    }
    if lock_sha256:
        run_details["byproducts"] = [{"name": LOCK_FILE, "digest": {"sha256": lock_sha256}}]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": path, "digest": {"sha256": sha}} for path, sha in sorted(subjects)],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "recipe": {"name": recipe.name, "version": recipe.version, "digest": recipe.digest,
                               "license": recipe.license or "unspecified"},
                    "deploy": dict(config),
                },
                "internalParameters": {
                    "tools": dict(sorted(tools.items())),
                    "stages": {sid: {"kind": r.get("kind"), "kind_version": r.get("kind_version"),
                                     "record": identities[sid]} for sid, r in sorted(lineage.items())},
                    **({"publisher": dict(publisher)} if publisher else {}),
                    "license": license_text(recipe.license, attribution),
                    "attribution": attribution,
                },
                "resolvedDependencies": dependencies,
            },
            "runDetails": run_details,
        },
    }


def _digest(value: str) -> dict[str, str]:
    """``{"blake3": hex}`` for the engine's digests ("blake3:<hex>" or a bare hex)."""
    algo, sep, hexdigest = str(value).partition(":")
    return {algo: hexdigest} if sep else {"blake3": str(value)}


def statement_bytes(stmt: Mapping[str, Any]) -> bytes:
    """The stored form of a statement: sorted keys, 2-space indent, trailing newline."""
    return (json.dumps(stmt, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def check_statement(stmt: Mapping[str, Any], files: Mapping[str, str]) -> list[str]:
    """Problems between a statement's subjects and {path: sha256} of a version's files ([] if none).

    Every subject must be one of the files with the same sha256; a version may hold more files
    (card, lockfile, the statement itself) than the statement names.
    """
    problems = []
    if stmt.get("_type") != STATEMENT_TYPE or stmt.get("predicateType") != PREDICATE_TYPE:
        problems.append("not an in-toto v1 statement with a SLSA provenance v1 predicate")
    subjects = stmt.get("subject") or []
    if not subjects:
        problems.append("the statement has no subjects")
    for s in subjects:
        name, sha = s.get("name"), (s.get("digest") or {}).get("sha256")
        if name not in files:
            problems.append(f"subject {name} is not a file of the version")
        elif files[name] != sha:
            problems.append(f"subject {name}: sha256 {str(sha)[:12]}… but the file is {files[name][:12]}…")
    return problems


def release_problems(data: bytes, build_files: Mapping[str, str]) -> list[str]:
    """Problems between a release's stored statement (`data`) and {path: sha256} of its build files.

    What `zoo release` checks through deploy (`Deploy.check_release`): the statement parses, every
    subject is a build file with its sha256, and every build file is a subject.
    """
    try:
        stmt = json.loads(data)
    except ValueError as e:
        return [f"{STATEMENT_FILE} is not valid JSON ({e})"]
    if not isinstance(stmt, dict):
        return [f"{STATEMENT_FILE} is not a JSON object"]
    problems = check_statement(stmt, build_files)
    subjects = {s.get("name") for s in stmt.get("subject") or [] if isinstance(s, dict)}
    problems += [f"build file {p} is not a subject of the statement" for p in sorted(set(build_files) - subjects)]
    return [f"{STATEMENT_FILE}: {p}" for p in problems]


def card_section(stmt: Mapping[str, Any]) -> str:
    """The model card's "Provenance" section, rendered from the statement itself."""
    definition = stmt["predicate"]["buildDefinition"]
    run = stmt["predicate"]["runDetails"]
    recipe = definition["externalParameters"]["recipe"]
    internal = definition["internalParameters"]
    lines = ["## Provenance", "",
             f"This version ships `{STATEMENT_FILE}` (an in-toto statement with SLSA provenance v1) and "
             f"`{LOCK_FILE}` (the lock record of every stage that built it). Each ONNX build carries the same "
             "facts in its `metadata_props` (`zoo.recipe`, `zoo.recipe_digest`, `zoo.stage_record`, `zoo.build`, "
             "`zoo.sources`, `zoo.license`).", "",
             f"- **Builder:** `{run['builder']['id']}`",
             f"- **Recipe:** {recipe['name']} {recipe['version']}, digest `{recipe['digest']}`",
             f"- **License:** {internal.get('license') or recipe.get('license')}"]
    for b in run.get("byproducts") or []:
        lines.append(f"- **Lockfile:** `{b['name']}`, sha256 `{b['digest'].get('sha256')}`")
    lines.append(f"- **Subjects:** {len(stmt.get('subject') or [])} build files, each with its sha256")
    lines.append("")
    deps = definition.get("resolvedDependencies") or []
    if deps:
        rows = ["| Material | Digest | Notes |", "|---|---|---|"]
        for d in deps:
            digest = ", ".join(f"{k}:`{v}`" for k, v in sorted((d.get("digest") or {}).items())) or "-"
            notes = dict(d.get("annotations") or {})
            if d.get("uri"):
                notes = {"uri": d["uri"], **notes}
            text = ", ".join(f"{k} {v}" for k, v in notes.items() if k != "record") or "-"
            rows.append(f"| `{d['name']}` | {digest} | {text.replace('|', '/')} |")
        lines += rows + [""]
    lines += [f"To rebuild it bit for bit, put `{LOCK_FILE}` next to the recipe as its lockfile and run "
              "`zoo repro RECIPE --check`.", ""]
    return "\n".join(lines)

