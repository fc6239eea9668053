"""`zoo site` without a browser: the layered layout, the SVG plots and lineage graph, the model card's
escaping, the site.json document, building from a local or remote zoo, publishing next to a remote
zoo (a folder and moto S3), and `zoo site serve` stopped by Ctrl-C. (tests/test_site.py drives the
pages in Chromium.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from cli_helpers import zoo as zoo_cli
from zoo.errors import ExitCode, InvalidInput
from zoo.registry import api
from zoo.registry.manifest import FileRef
from zoo.registry.store import LocalZoo
from registry_servers import free_port, make_staging, wait_port
from zoo.site import layout, plots
from zoo.site.build import build_site
from zoo.site.card import render_card
from zoo.site.data import SITE_SCHEMA_VERSION, copy_refusal, quality_metric
from zoo.site.lineage import lineage_svg, stage_graph
from zoo.site.publish import publish_site

SVG = "{http://www.w3.org/2000/svg}"


# ---- layout ---------------------------------------------------------------------------------

def test_layers_are_longest_paths_and_long_edges_pass_through_placeholders():
    laid = layout.layered(["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"), ("a", "d")])
    real = [[n for n in layer if not layout.is_placeholder(n)] for layer in laid.layers]
    assert real == [["a"], ["b", "c"], ["d"]]
    assert len(laid.layers[1]) == 3 and sum(layout.is_placeholder(n) for n in laid.layers[1]) == 1
    long_edge = next(c for c in laid.chains if (c[0], c[-1]) == ("a", "d"))
    assert len(long_edge) == 3 and layout.is_placeholder(long_edge[1])
    assert laid.dropped == []


def test_ordering_removes_a_crossing_the_input_order_has():
    laid = layout.layered(["x", "y", "p", "q"], [("x", "q"), ("y", "p")])
    assert laid.layers == [["x", "y"], ["q", "p"]]  # each under its parent: no crossing


def test_a_cycle_is_drawn_without_the_edge_that_closes_it():
    laid = layout.layered(["a", "b"], [("a", "b"), ("b", "a"), ("a", "a"), ("a", "ghost")])
    assert laid.layers == [["a"], ["b"]] and laid.dropped == [("b", "a")]


# ---- plots ----------------------------------------------------------------------------------

def test_linear_ticks_are_round_and_log_ticks_are_decades():
    linear = plots.Axis(0.9147, 0.952, 0, 100)
    assert [label for _, label in plots.ticks(linear)] == ["0.92", "0.93", "0.94", "0.95"]
    log = plots.Axis(0.012, 1.3, 0, 100, log=True)
    # decades alone would give two ticks (0.1, 1): 2x and 5x are added
    assert [label for _, label in plots.ticks(log)] == ["0.02", "0.05", "0.1", "0.2", "0.5", "1"]
    assert [label for _, label in plots.ticks(plots.Axis(0.0009, 2000, 0, 100, log=True))] == [
        "0.001", "0.01", "0.1", "1", "10", "100", "1e+03"]


def _points(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)  # well-formed XML, or the browser would not draw it
    return [g for g in root.iter(f"{SVG}g") if g.get("class") == "point"]


def test_every_point_is_drawn_once_also_without_latency_or_metric():
    pts = [plots.Point(0.02, 0.93, 1000, "#000", "a", {"build": "a"}, label="a"),
           plots.Point(None, 0.91, 500, "#000", "b", {"build": "b"}, label="b"),
           plots.Point(0.5, None, 500, "#000", "c", {"build": "c"}, label="c"),
           plots.Point(None, None, None, "#000", "d <&> \"e\"", {"build": "d"}, label="d")]
    svg = plots.scatter(pts, x_label="latency p50 (ms)", y_label="accuracy", css_class="builds-plot",
                        description="test", no_y="no accuracy")
    drawn = _points(svg)
    assert [g.get("data-build") for g in drawn] == ["a", "b", "c", "d"]
    assert drawn[3].find(f"{SVG}title").text == 'd <&> "e"'
    notes = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text") if t.get("class") == "strip-note"]
    assert notes == ["no latency", "no accuracy"]
    assert "latency p50 (ms) (log scale)" in svg  # 0.02 and 0.5 ms: more than 8x apart
    for g in drawn:
        c = g.find(f"{SVG}circle")
        assert 0 < float(c.get("cx")) < plots.WIDTH and 0 < float(c.get("cy")) < plots.HEIGHT
    # the largest model gets the largest marker
    radii = {g.get("data-build"): float(g.find(f"{SVG}circle").get("r")) for g in drawn}
    assert radii["a"] == plots.R_MAX and radii["b"] < radii["a"] and radii["d"] == plots.R_MIN


def test_labels_never_overlap():
    # six builds in one crowd (and one far away, so the crowd is a dot on the axis)
    pts = [plots.Point(0.08 + i * 1e-4, 0.93, 1000, "#000", str(i), {"build": str(i)}, label=f"build-{i}")
           for i in range(6)] + [plots.Point(1.0, 0.5, 1000, "#000", "far", {"build": "far"}, label="far")]
    svg = plots.scatter(pts, x_label="x", y_label="y", css_class="c", description="d")
    boxes = []
    for t in ET.fromstring(svg).iter(f"{SVG}text"):
        if t.get("class") == "point-label":
            x, y, w = float(t.get("x")), float(t.get("y")), len(t.text) * 6.4
            left = {"start": x, "end": x - w, "middle": x - w / 2}[t.get("text-anchor")]
            boxes.append((left, y - 10, left + w, y + 2))
    assert len(boxes) >= 4
    assert not any(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
                   for i, a in enumerate(boxes) for b in boxes[i + 1:])


# ---- lineage --------------------------------------------------------------------------------

def _lock(keys: dict[str, str], other_platform: bool = True) -> bytes:
    records = {"train": {"key": keys["train"], "kind": "train", "inputs": {}, "tools": {"torch": "2.13"}},
               "export": {"key": keys["export"], "kind": "export", "inputs": {"train": {"checkpoint": "x"}},
                          "tools": {"onnx": "1.23"}},
               "verify": {"key": keys["verify"], "kind": "verify", "inputs": {"export": {}, "train": {}}}}
    stale = {"train": {"key": "other", "inputs": {}}, "export": {"key": "other", "inputs": {}},
             "verify": {"key": "other", "inputs": {}}}
    platforms = {"aaa-first": stale, "x86-64-avx2": records} if other_platform else {"x86-64-avx2": records}
    return yaml.safe_dump({"schema_version": 3, "platforms": platforms}).encode()


def test_the_lineage_comes_from_the_lock_records_that_built_the_version():
    keys = {"train": "1" * 64, "export": "2" * 64, "verify": "3" * 64}
    provenance = json.dumps({"predicate": {"buildDefinition": {"internalParameters": {"stages": {
        "train": {"key": keys["train"], "kind": "train", "kind_version": "7"}}}}}}).encode()
    graph = stage_graph({"stages": {"export": keys["export"], "verify": keys["verify"]}}, _lock(keys), provenance)
    assert [s["id"] for s in graph["stages"]] == ["export", "train", "verify"]
    assert graph["edges"] == [["export", "verify"], ["train", "export"], ["train", "verify"]]
    by_id = {s["id"]: s for s in graph["stages"]}
    assert by_id["train"]["kind_version"] == "7" and by_id["export"]["tools"] == {"onnx": "1.23"}
    assert graph["read_from"] == ["manifest", "provenance", "zoo.lock"]
    root = ET.fromstring(lineage_svg(graph))
    stages = {g.get("data-stage"): g.find(f"{SVG}title").text for g in root.iter(f"{SVG}g")}
    assert set(stages) == {"train", "export", "verify"} and f"record {keys['export']}" in stages["export"]
    assert {(p.get("data-from"), p.get("data-to")) for p in root.iter(f"{SVG}path") if p.get("class") == "edge"} == {
        ("train", "export"), ("export", "verify"), ("train", "verify")}


def test_a_schema_4_lock_is_matched_by_its_records_digests():
    """Lockfiles of schema 4 hold no keys: the manifest and the statement name each stage's record
    digest (zoo.engine.lockfile.record_identity), and the set of records whose digests they name is
    the one read, not another platform class's."""
    from zoo.engine.lockfile import StageLock

    def rec(kind, text, inputs, tools):
        return StageLock(kind=kind, kind_version="1", config={"text": text}, config_digest="c" * 64, matrix={},
                         inputs=inputs, tools=tools, outputs={"out": "o" * 64}, shared={}).to_json()

    built = {"train": rec("train", "a", {}, {"torch": "2.13"}),
             "export": rec("export", "b", {"train": {"checkpoint": "x"}}, {"onnx": "1.23"})}
    other = {sid: {**r, "config": {"text": "elsewhere"}} for sid, r in built.items()}
    lock = yaml.safe_dump({"schema_version": 4, "platforms": {"aaa-first": other, "x86-64-avx2": built}}).encode()
    named = {sid: StageLock.read(r).identity() for sid, r in built.items()}
    provenance = json.dumps({"predicate": {"buildDefinition": {"internalParameters": {"stages": {
        sid: {"record": digest, "kind": sid} for sid, digest in named.items()}}}}}).encode()
    graph = stage_graph({"stages": named}, lock, provenance)
    by_id = {s["id"]: s for s in graph["stages"]}
    assert by_id["train"]["tools"] == {"torch": "2.13"} and by_id["export"]["record"] == named["export"]
    assert graph["edges"] == [["train", "export"]]


def test_the_stage_that_published_the_version_ends_the_lineage():
    """deploy has no record in the release's zoo.lock (written before it ends): the statement's
    publisher names it, its key and its direct inputs."""
    keys = {"train": "1" * 64, "export": "2" * 64, "verify": "3" * 64}
    provenance = json.dumps({"predicate": {"buildDefinition": {"internalParameters": {
        "stages": {sid: {"key": key, "kind": sid} for sid, key in keys.items()},
        "publisher": {"stage": "deploy", "kind": "deploy", "kind_version": "9", "key": "4" * 64,
                      "inputs": ["export", "verify"]}}}}}).encode()
    graph = stage_graph({"stages": keys}, _lock(keys), provenance)
    deploy = next(s for s in graph["stages"] if s["id"] == "deploy")
    assert (deploy["record"], deploy["kind"], deploy["kind_version"]) == ("4" * 64, "deploy", "9")
    assert ["export", "deploy"] in graph["edges"] and ["verify", "deploy"] in graph["edges"]
    assert not any(e[0] == "deploy" for e in graph["edges"])  # nothing comes after it


@pytest.mark.parametrize("lock, provenance", [(b"{not yaml: [", b"not json"), (b"- a list", b"[]"),
                                              (b"platforms: 3", b'{"predicate": 1}'), (None, None),
                                              (None, b'{"predicate": {"buildDefinition": {"internalParameters": '
                                                     b'{"publisher": ["not", "a", "dict"]}}}}')])
def test_malformed_lineage_files_are_left_out(lock, provenance):
    graph = stage_graph({"stages": {"a": "k"}}, lock, provenance)
    assert [s["id"] for s in graph["stages"]] == ["a"] and graph["edges"] == []
    ET.fromstring(lineage_svg(graph))


# ---- model card -----------------------------------------------------------------------------

def test_a_card_is_rendered_without_its_raw_html_or_links_out_of_the_site():
    card = ("---\nlicense: mit\n---\n# Heading\n\n<script>alert(1)</script>\n\n"
            "[out](https://example.com) [in](zoo.lock) [code](javascript:alert(1)) <https://auto.example>\n\n"
            "![pic](https://example.com/p.png) ![local](plot.png)\n")
    html = render_card(card, lambda url: f"files/{url}" if url in ("zoo.lock", "plot.png") else None)
    assert html.startswith("<h1>Heading</h1>") and "license: mit" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script" not in html
    assert '<a href="files/zoo.lock">in</a>' in html and html.count("<a ") == 1
    assert "out (https://example.com)" in html and "https://auto.example" in html
    assert "[pic: https://example.com/p.png]" in html and '<img src="files/plot.png" alt="local" />' in html


# ---- what the site holds ----------------------------------------------------------------------

def test_the_plotted_metric_follows_the_task():
    assert quality_metric("tabular-regression") == ("mae", "lower")
    assert quality_metric("image-classification") == ("accuracy", "higher")
    assert quality_metric("") == quality_metric("Not A Task!") == ("accuracy", "higher")


def test_only_small_files_of_types_a_browser_never_runs_are_copied():
    ref = lambda path, size=10: FileRef(path=path, sha256="0" * 64, size=size)  # noqa: E731
    assert copy_refusal(ref("zoo.lock")) is None and copy_refusal(ref("builds/a/test_data_set_0/input_0.pb")) is None
    for active in ("page.html", "x.HTM", "drawing.svg", "run.js"):
        assert "not served" in copy_refusal(ref(active))
    assert "larger than" in copy_refusal(ref("big.npz", size=1 << 30))


@pytest.fixture
def small_zoo(tmp_path) -> LocalZoo:
    """Two models: a regressor in two versions (mae), a classifier (accuracy) with a build never timed."""
    zoo = LocalZoo(tmp_path / "zoo")
    for version, mae in (("1.0.0", 0.5), ("2.0.0", 0.4)):
        zoo.publish(make_staging(tmp_path / f"r{version}", name="reg", version=version, task="tabular-regression",
                                 builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 1.0, "mae": mae}},
                                         "cpu-int8": {"precision": "int8", "metrics": {"latency_p50_ms": 0.6,
                                                                                       "mae": mae + 0.1}}}))
    zoo.publish(make_staging(tmp_path / "c", name="cls", version="0.1.0", task="image-classification",
                             card="# cls\n\n[the card itself](README.md)\n",
                             builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.9}},
                                     "gpu": {"metrics": {"accuracy": 0.91}, "verified": False,
                                             "unverified_reason": "no GPU here",
                                             "execution_providers": ["TensorrtExecutionProvider"],
                                             "provider_options": {"TensorrtExecutionProvider":
                                                                  {"trt_fp16_enable": "True"}}}}))
    return zoo


def test_site_json_holds_what_the_pages_show(small_zoo, tmp_path):
    result = build_site(tmp_path / "site", zoo=small_zoo)
    assert (result["models"], result["versions"], result["builds"]) == (2, 3, 6)
    doc = json.loads((tmp_path / "site" / "site.json").read_text())
    assert doc["schema_version"] == SITE_SCHEMA_VERSION and doc["source"] == {"kind": "local", "remote": None}
    models = {m["name"]: m for m in doc["models"]}
    reg = models["reg"]
    assert reg["latest"] == "2.0.0" and [v["version"] for v in reg["versions"]] == ["2.0.0", "1.0.0"]
    assert reg["best"] == {"metric": "mae", "better": "lower", "value": 0.4, "build": "cpu-fp32"}  # the lowest mae
    assert models["cls"]["best"]["build"] == "gpu" and models["cls"]["best"]["value"] == 0.91
    cls = models["cls"]["versions"][0]
    gpu = next(b for b in cls["builds"] if b["name"] == "gpu")
    assert gpu["latency_p50_ms"] is None and gpu["verified"] is False and gpu["pull"] == "zoo pull cls@0.1.0 --build gpu"
    assert gpu["provider_options"] == {"TensorrtExecutionProvider": {"trt_fp16_enable": "True"}}
    for m in doc["models"]:
        for v in m["versions"]:
            assert (tmp_path / "site" / v["page"]).is_file()
            assert (tmp_path / "site" / v["card"]).read_bytes() == small_zoo.blobs.path(
                small_zoo.resolve(f"{m['name']}@{v['version']}").card.sha256).read_bytes()
    page = (tmp_path / "site" / cls["page"]).read_text()
    assert '<a href="files/README.md">the card itself</a>' in page
    assert '<span class="muted options">TensorrtExecutionProvider: trt_fp16_enable=True</span>' in page
    assert page.count('class="point"') == 2 and "versions-plot" not in page  # one version: its builds, once
    reg_page = (tmp_path / "site" / reg["versions"][0]["page"]).read_text()
    assert reg_page.count('class="point"') == 2 + 4 and "Across versions" in reg_page  # two versions: both plots


def test_a_version_says_when_it_was_published_to_the_second_in_utc(small_zoo, tmp_path):
    import re

    build_site(tmp_path / "site", zoo=small_zoo)
    doc = json.loads((tmp_path / "site" / "site.json").read_text())
    cls = next(m for m in doc["models"] if m["name"] == "cls")["versions"][0]
    page = (tmp_path / "site" / cls["page"]).read_text()
    [shown] = re.findall(r"<dt>Published</dt><dd>([^<]*)</dd>", page)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown), shown
    assert shown.removesuffix(" UTC") == cls["created"].replace("T", " ")[:19]  # site.json keeps it whole


def test_the_quality_axis_does_not_magnify_a_small_difference():
    """0.930 and 0.933 (0.3 points of accuracy) stay close: the axis spans at least a tenth of the
    values, inside [0, 1]; a real gap is drawn as one."""
    def y_of(values):
        pts = [plots.Point(1.0 + i, v, 1000, "#000", str(i), {"build": str(i)}) for i, v in enumerate(values)]
        svg = plots.scatter(pts, x_label="x", y_label="accuracy", css_class="c", description="d")
        return [float(g.find(f"{SVG}circle").get("cy")) for g in _points(svg)]

    height = plots.HEIGHT - plots.TOP - plots.BOTTOM
    close = y_of([0.930, 0.933])
    assert 0 < close[0] - close[1] < 0.05 * height  # drawn apart, but by a few pixels
    far = y_of([0.5, 0.9])
    assert far[0] - far[1] > 0.6 * height
    axis = plots._y_axis([0.99, 1.0], 300, 0)
    assert axis.hi == 1.0 and axis.hi - axis.lo >= 0.1 * 1.0  # a fraction's axis stops at 1


def test_build_refuses_a_folder_that_is_not_a_site_and_replaces_an_old_site(small_zoo, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    with pytest.raises(InvalidInput, match="holds no site"):
        build_site(busy, zoo=small_zoo)
    assert (busy / "notes.txt").read_text() == "mine"
    out = tmp_path / "site"
    build_site(out, zoo=small_zoo)
    old_page = out / "models" / "reg" / "1.0.0" / "index.html"
    assert old_page.is_file()
    api.rm("reg@1.0.0", zoo=small_zoo)
    build_site(out, zoo=small_zoo)
    assert not old_page.exists() and (out / "models" / "reg" / "2.0.0" / "index.html").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "c", "r1.0.0", "r2.0.0", "site", "zoo"]  # no leftovers


remote_kinds = pytest.mark.parametrize("backend", ["folder", "s3"], indirect=True)


@remote_kinds
def test_a_site_of_a_remote_zoo_pulls_from_that_remote(backend, publisher, consumer, tmp_path):
    api.push("tiny@1.0.0", "origin", zoo=publisher)
    api.push("tiny@1.1.0", "origin", zoo=publisher)
    result = build_site(tmp_path / "site", remote="origin", zoo=consumer)
    assert result["source"] == "remote origin" and result["versions"] == 2
    doc = json.loads((tmp_path / "site" / "site.json").read_text())
    assert doc["source"] == {"kind": "remote", "remote": "origin"}
    v110 = doc["models"][0]["versions"][0]
    assert [b["pull"] for b in v110["builds"]] == ["zoo pull tiny@1.1.0 --build cpu-fp32 --remote origin",
                                                   "zoo pull tiny@1.1.0 --build cpu-int8 --remote origin"]
    manifest = publisher.resolve("tiny@1.1.0")
    assert (tmp_path / "site" / v110["card"]).read_bytes() == publisher.blobs.path(manifest.card.sha256).read_bytes()
    # its bill of materials, read from the remote (an attachment: zoo.registry.attachments)
    assert (tmp_path / "site" / v110["bom"]["href"]).read_bytes() == publisher.attachments("tiny", "1.1.0")["bom.cdx.json"]
    # nothing was pulled into the consumer's zoo, and the files read went into a scratch folder now gone
    assert consumer.list() == [] and not any(p.is_file() for p in consumer.blobs.root.rglob("*"))
    assert list(consumer.tmp_dir().iterdir()) == []


@remote_kinds
def test_publish_uploads_the_site_next_to_the_zoo_and_drops_what_an_older_site_had(backend, publisher, tmp_path):
    from zoo.registry.config import RemotesConfig
    from zoo.storage.fsbackend import open_backend

    api.push("tiny@1.1.0", "origin", zoo=publisher)
    out = tmp_path / "site"
    build_site(out, zoo=publisher)
    local = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    first = publish_site(out, "origin", zoo=publisher)
    assert first["uploaded"] == len(local) and first["removed"] == 0 and first["url"].endswith("/site/index.html")
    config = RemotesConfig(publisher.root).get("origin")
    remote = open_backend(config.url, config.options)
    for rel in local:
        assert remote.read(remote.path("site", *rel.split("/"))) == (out / rel).read_bytes(), rel
    api.rm("tiny@1.0.0", zoo=publisher)
    build_site(out, zoo=publisher)
    again = publish_site(out, "origin", zoo=publisher)
    assert again["removed"] >= 2  # the old version's page and card
    assert remote.read(remote.path("site", "models", "tiny", "1.0.0", "index.html")) is None
    assert remote.read(remote.path("site", "models", "tiny", "1.1.0", "index.html")) is not None
    # the zoo beside it is untouched
    assert remote.read(remote.path("models", "tiny", "versions", "1.1.0.json")) is not None
    assert api.show("tiny@1.1.0", remote="origin", zoo=publisher)["version"] == "1.1.0"


def test_publish_refuses_a_hub_remote_and_a_folder_that_is_no_site(small_zoo, tmp_path):
    api.remote_add("hub", "hf://someone", zoo=small_zoo)
    out = tmp_path / "site"
    build_site(out, zoo=small_zoo)
    with pytest.raises(InvalidInput, match="Hugging Face"):
        publish_site(out, "hub", zoo=small_zoo)
    with pytest.raises(InvalidInput, match="holds no site"):
        publish_site(tmp_path / "zoo", "hub", zoo=small_zoo)


# ---- serve ----------------------------------------------------------------------------------

def test_serve_serves_the_site_on_localhost_and_ctrl_c_stops_it(small_zoo, tmp_path):
    out = tmp_path / "site"
    build_site(out, zoo=small_zoo)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "site", "serve", str(out), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        wait_port(port, proc=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as r:
            assert r.status == 200 and b"Model zoo" in r.read()
            assert r.headers["X-Content-Type-Options"] == "nosniff"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/site.json") as r:
            assert json.loads(r.read())["schema_version"] == SITE_SCHEMA_VERSION
    finally:
        proc.send_signal(signal.SIGINT)
        out_text, err_text = proc.communicate(timeout=30)
    assert proc.returncode == 0, err_text
    assert out_text.splitlines() == [f"serving {out} at http://127.0.0.1:{port}/ (Ctrl-C stops)", "stopped"]


def test_serve_of_a_folder_without_a_site_is_not_found(tmp_path):
    cli = zoo_cli("site", "serve", tmp_path, "--port", "0")
    assert cli.code == ExitCode.INVALID and "holds no site" in cli.err


def test_zoo_help_imports_none_of_the_site(tmp_path):
    code = ("import sys, runpy\nsys.argv = ['zoo', '--help']\n"
            "try:\n    runpy.run_module('zoo', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('LOADED', sorted(m for m in sys.modules if m.startswith(('zoo.site', 'markdown_it', 'playwright', "
            "'http.server'))))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "LOADED []" in proc.stdout, proc.stdout + proc.stderr
    cli = zoo_cli("site", "--help")
    assert cli.code == 0 and all(c in cli.out for c in ("build", "serve", "publish"))


def test_build_cli_says_what_it_wrote(small_zoo, tmp_path):
    env = {"ZOO_HOME": str(small_zoo.root)}
    cli = zoo_cli("site", "build", "-o", tmp_path / "site", "--json", env=env)
    assert cli.code == 0, cli.text
    assert json.loads(cli.out)["versions"] == 3
    assert Path(json.loads(cli.out)["out"]) == tmp_path / "site"


def test_an_edge_that_skips_layers_bends_only_between_them():
    """Long edges (export → deploy past optimize and verify) run straight across the layers they
    pass and bend only in the gaps between, so none crosses a stage's box."""
    import re

    ids = ["train", "export", "optimize", "quantize", "verify", "deploy"]
    edges = [("train", "export"), ("export", "optimize"), ("export", "quantize"), ("optimize", "verify"),
             ("quantize", "verify"), ("export", "deploy"), ("optimize", "deploy"), ("quantize", "deploy"),
             ("verify", "deploy")]
    graph = {"stages": [{"id": i, "record": "k" * 64, "kind": i, "kind_version": "", "tools": {}} for i in ids],
             "edges": [list(e) for e in edges]}
    root = ET.fromstring(lineage_svg(graph))
    columns = {(float(r.get("x")), float(r.get("x")) + float(r.get("width"))) for r in root.iter(f"{SVG}rect")}
    bends = 0
    for path in (p for p in root.iter(f"{SVG}path") if p.get("class") == "edge"):
        numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", path.get("d"))]
        points = [tuple(numbers[:2])] + [tuple(numbers[i + 4:i + 6]) for i in range(2, len(numbers), 6)]
        for (ax, ay), (bx, by) in zip(points, points[1:]):
            if ay != by:  # a bend: wholly inside a gap between columns
                bends += 1
                assert not any(ax < right and bx > left for left, right in columns), (path.get("data-from"),
                                                                                     path.get("data-to"))
    assert bends  # the graph has bends to check


def test_a_weight_only_build_shows_its_precision_with_algorithm_bits_block_and_accuracy_level(tmp_path):
    """A build whose manifest records its quantization (schema 4) shows it in site.json and on its page;
    a build without one shows its bare precision."""
    zoo = LocalZoo(tmp_path / "zoo")
    record = {"method": "weight_only", "algorithm": "rtn", "bits": 4, "block_size": 32, "symmetric": False,
              "accuracy_level": "int8"}
    zoo.publish(make_staging(tmp_path / "q", name="llm", version="0.1.0", task="image-classification",
                             builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.9}},
                                     "cpu-int4-rtn-b32": {"precision": "int4", "quantization": record,
                                                          "metrics": {"latency_p50_ms": 1.0, "accuracy": 0.89}}}))
    build_site(tmp_path / "site", zoo=zoo)
    doc = json.loads((tmp_path / "site" / "site.json").read_text())
    version = doc["models"][0]["versions"][0]
    builds = {b["name"]: b for b in version["builds"]}
    assert builds["cpu-int4-rtn-b32"]["quantization"] == record
    assert builds["cpu-int4-rtn-b32"]["precision_detail"] == "int4 (weight-only rtn, 4 bits, block 32, asymmetric, int8 compute)"
    assert builds["cpu-fp32"]["quantization"] is None and builds["cpu-fp32"]["precision_detail"] == "fp32"
    page = (tmp_path / "site" / version["page"]).read_text()
    assert "onnx int4 (weight-only rtn, 4 bits, block 32, asymmetric, int8 compute)</span>" in page
    assert "onnx fp32</span>" in page
