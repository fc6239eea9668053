"""The lineage of a version: the stages that built it (the digests of their lock records, kinds and
tool versions) and the edges between them, read from the version's own files, and its drawing as SVG.

Stages and record digests come from the manifest's ``lineage.stages``, the provenance statement's stages
(``predicate.buildDefinition.internalParameters.stages``) and the lock records; the edges from
each lock record's ``inputs`` (the upstream stages it read). The stage that published the version
(deploy) is in no lock record (the release's zoo.lock is written before it ends): it comes from
the statement's ``internalParameters.publisher``, with edges from its direct inputs. The lockfile holds one set of records
per platform class: the set whose records match the manifest's is the one that built this version.
Versions published before lockfile schema 4 name cache keys instead (``key``): read the same way.
Every one of these files is untrusted input: anything malformed is left out, never raised.
"""

from __future__ import annotations

import json

from zoo.site.layout import layered
from zoo.site.svg import element, esc, text_width

NODE_W, NODE_H = 176, 44
GAP_X, GAP_Y = 56, 18
MARGIN = 12
MAX_ID_CHARS = 24


def stage_graph(lineage: dict, lock_bytes: bytes | None, provenance_bytes: bytes | None) -> dict:
    """{"stages": [{"id", "record", "kind", "kind_version", "tools"}], "edges": [[from, to]], "read_from": [...]}
    for a manifest's `lineage` (its ``model_dump``) and the bytes of its zoo.lock / provenance statement."""
    stages: dict[str, dict] = {}

    def stage(sid) -> dict:
        return stages.setdefault(str(sid), {"id": str(sid), "record": "", "kind": "", "kind_version": "", "tools": {}})

    read_from = []
    for sid, digest in (lineage.get("stages") or {}).items():
        stage(sid)["record"] = str(digest)
    if lineage.get("stages"):
        read_from.append("manifest")
    provenance = _provenance_stages(provenance_bytes)
    for sid, record in provenance.items():
        s = stage(sid)
        s["record"] = s["record"] or _named(record)
        s["kind"] = str(record.get("kind") or "")
        s["kind_version"] = str(record.get("kind_version") or "")
    if provenance:
        read_from.append("provenance")
    edges = []
    publisher = _publisher(provenance_bytes)
    if publisher:
        s = stage(publisher["stage"])
        s.update(record=publisher["record"], kind=publisher["kind"], kind_version=publisher["kind_version"])
        edges.extend((upstream, s["id"]) for upstream in publisher["inputs"])
    records = _lock_records(lock_bytes, {sid: s["record"] for sid, s in stages.items() if s["record"]})
    for sid, record in records.items():
        s = stage(sid)
        s["record"] = s["record"] or _identity(record)
        s["kind"] = s["kind"] or str(record.get("kind") or "")
        s["kind_version"] = s["kind_version"] or str(record.get("kind_version") or "")
        tools = record.get("tools")
        if isinstance(tools, dict):
            s["tools"] = {str(k): str(v) for k, v in sorted(tools.items())}
        inputs = record.get("inputs")
        if isinstance(inputs, dict):
            edges.extend((str(upstream), sid) for upstream in inputs)
    if records:
        read_from.append("zoo.lock")
    edges = sorted({(u, v) for u, v in edges if u in stages and v in stages and u != v})
    ordered = sorted(stages.values(), key=lambda s: s["id"])
    return {"stages": ordered, "edges": [list(e) for e in edges], "read_from": read_from}


def _publisher(data: bytes | None) -> dict | None:
    """The statement's publishing stage, its fields as strings; None when absent or malformed."""
    try:
        found = json.loads(data)["predicate"]["buildDefinition"]["internalParameters"]["publisher"]
    except (TypeError, ValueError, KeyError):
        return None
    if not isinstance(found, dict) or not found.get("stage"):
        return None
    inputs = found.get("inputs")
    return {"stage": str(found["stage"]), "record": _named(found), "kind": str(found.get("kind") or ""),
            "kind_version": str(found.get("kind_version") or ""),
            "inputs": [str(i) for i in inputs] if isinstance(inputs, list) else []}


def _named(found: dict) -> str:
    """The record digest a statement names for a stage (``key`` in versions before lockfile schema 4)."""
    return str(found.get("record") or found.get("key") or "")


def _identity(record: dict) -> str:
    """The digest of a lock record (`zoo.engine.lockfile.record_identity`), or the key an older
    lockfile recorded; "" for a record that cannot be digested (untrusted input: never raised)."""
    if record.get("key"):
        return str(record["key"])
    from zoo.engine.lockfile import record_identity

    try:
        return record_identity(record)
    except (TypeError, ValueError, RecursionError):
        return ""


def _provenance_stages(data: bytes | None) -> dict:
    try:
        stages = json.loads(data)["predicate"]["buildDefinition"]["internalParameters"]["stages"]
    except (TypeError, ValueError, KeyError):
        return {}
    return {k: v for k, v in stages.items() if isinstance(v, dict)} if isinstance(stages, dict) else {}


def _lock_records(data: bytes | None, named: dict[str, str]) -> dict[str, dict]:
    """The lock's stage records for the platform class whose records match `named` (stage id ->
    record digest) best (schema 3-4), or its only set (schema 1-2)."""
    if data is None:
        return {}
    from zoo import yamlio

    try:
        lock = yamlio.safe_load(data)  # a remote's file: read within the limits of any YAML zoo reads
    except yamlio.YAMLError:
        return {}
    if not isinstance(lock, dict):
        return {}
    sets = lock.get("platforms") if isinstance(lock.get("platforms"), dict) else {"": lock.get("stages")}
    candidates = [(name, records) for name, records in sorted(sets.items(), key=lambda kv: str(kv[0]))
                  if isinstance(records, dict)]
    if not candidates:
        return {}

    def matches(records: dict) -> int:
        return sum(isinstance(r, dict) and named.get(sid) == _identity(r) for sid, r in records.items())

    best = max(candidates, key=lambda c: matches(c[1]))[1]  # max keeps the first of equals
    return {str(sid): r for sid, r in best.items() if isinstance(r, dict)}


def lineage_svg(graph: dict) -> str:
    """The stage DAG drawn left to right; hovering a stage shows its record digest and tool versions."""
    stages = {s["id"]: s for s in graph["stages"]}
    layout = layered(list(stages), [tuple(e) for e in graph["edges"]])
    tallest = max((len(layer) for layer in layout.layers), default=0)
    height = MARGIN * 2 + tallest * NODE_H + max(tallest - 1, 0) * GAP_Y
    width = MARGIN * 2 + len(layout.layers) * NODE_W + max(len(layout.layers) - 1, 0) * GAP_X
    centre: dict[str, tuple[float, float]] = {}
    for i, layer in enumerate(layout.layers):
        top = MARGIN + (tallest - len(layer)) * (NODE_H + GAP_Y) / 2
        for k, node in enumerate(layer):
            centre[node] = (MARGIN + i * (NODE_W + GAP_X) + NODE_W / 2, top + k * (NODE_H + GAP_Y) + NODE_H / 2)
    parts = ['<defs><marker id="lineage-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
             'markerHeight="7" orient="auto-start-reverse"><path d="M0 0L10 5L0 10z" class="arrow-head"/></marker></defs>']
    for chain in layout.chains:
        parts.append(_edge([centre[n] for n in chain], chain))
    for sid, s in stages.items():
        parts.append(_node(s, *centre[sid]))
    return element("svg", "".join(parts), xmlns="http://www.w3.org/2000/svg", viewBox=f"0 0 {width} {height}",
                   width=str(width), height=str(height), class_="lineage", role="img",
                   aria_label=f"the {len(stages)} stages that built this version and their dependencies")


def _edge(points: list[tuple[float, float]], chain: list[str]) -> str:
    """A smooth path from the right side of the first stage to the left side of the last one,
    straight across the places the edge holds in the layers between: it bends only in the gaps
    between layers, where no stage is drawn, so it never crosses a stage's box."""
    (x0, y0), (x1, y1) = points[0], points[-1]
    through = [p for x, y in points[1:-1] for p in ((x - NODE_W / 2, y), (x + NODE_W / 2, y))]
    route = [(x0 + NODE_W / 2, y0), *through, (x1 - NODE_W / 2, y1)]
    d = f"M{route[0][0]:.1f} {route[0][1]:.1f}"
    for (ax, ay), (bx, by) in zip(route, route[1:]):
        bend = (bx - ax) / 2
        d += f"C{ax + bend:.1f} {ay:.1f} {bx - bend:.1f} {by:.1f} {bx:.1f} {by:.1f}"
    return element("path", d=d, class_="edge", marker_end="url(#lineage-arrow)",
                   data_from=chain[0], data_to=chain[-1])


def _node(s: dict, cx: float, cy: float) -> str:
    sid = s["id"]
    shown = sid if len(sid) <= MAX_ID_CHARS else sid[:MAX_ID_CHARS - 1] + "…"
    kind = s["kind"] if s["kind"] and s["kind"] != sid else ""
    tip = [sid + (f" (kind {s['kind']}" + (f" v{s['kind_version']}" if s["kind_version"] else "") + ")"
                  if s["kind"] else "")]
    tip.append(f"record {s['record']}" if s["record"] else "record not known")
    if s["tools"]:
        tip.append("tools: " + ", ".join(f"{k} {v}" for k, v in s["tools"].items()))
    x, y = cx - NODE_W / 2, cy - NODE_H / 2
    line1 = shown + (f" · {kind}" if kind and text_width(shown + kind) < NODE_W - 16 else "")
    line2 = f"record {s['record'][:12]}" if s["record"] else "record not known"
    body = (element("title", esc("\n".join(tip)))
            + element("rect", x=x, y=y, width=float(NODE_W), height=float(NODE_H), rx="6", class_="stage-box")
            + element("text", esc(line1), x=cx, y=cy - 4, class_="stage-name", text_anchor="middle")
            + element("text", esc(line2), x=cx, y=cy + 12, class_="stage-key", text_anchor="middle"))
    return element("g", body, class_="stage", data_stage=sid)
