"""`zoo show` and the web catalog show a text-generation version's generation figures (issue #35):
perplexity, its increase over the reference, greedy matched tokens, agreement and exact match,
prefill ms and decode tokens/s, under the names verify records them by in each build's metrics
(`zoo.manifest.GENERATION_METRICS`); the catalog plots perplexity (lower is better) against decode
tokens/s. The versions are published from staging folders whose
models are tiny stand-in ONNX files (tests/registry_servers.py): only the manifests are read."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from cli_helpers import zoo as zoo_cli
from registry_servers import make_staging
from zoo.registry.store import LocalZoo
from zoo.site.build import build_site

SVG = "{http://www.w3.org/2000/svg}"
FP32 = {"perplexity": 24.51234, "greedy_matched_tokens": 16.0, "greedy_agreement": 1.0, "greedy_exact_match": 1.0,
        "latency_prefill_ms": 3.125, "latency_p50_ms": 4.708, "throughput_tokens_per_s": 212.4}
INT4 = {"perplexity": 25.2, "perplexity_increase": 0.02807, "greedy_matched_tokens": 15.0, "greedy_agreement": 0.9375,
        "greedy_exact_match": 0.75, "latency_prefill_ms": 1.5, "latency_p50_ms": 1.527, "throughput_tokens_per_s": 655.0}


@pytest.fixture
def zoo(tmp_path):
    z = LocalZoo()
    z.publish(make_staging(tmp_path / "llm-1", "tiny-llm", "1.0.0", task="text-generation",
                           builds={"cpu-fp32": {"metrics": FP32}, "cpu-int4": {"metrics": INT4, "precision": "int4"},
                                   "cpu-int8": {"metrics": {"perplexity": 24.9}, "precision": "int8"}}))
    z.publish(make_staging(tmp_path / "llm-2", "tiny-llm", "0.9.0", task="text-generation",
                           builds={"cpu-fp32": {"metrics": {**FP32, "perplexity": 30.0, "throughput_tokens_per_s": 150.0}}}))
    z.publish(make_staging(tmp_path / "cls", "cls", "0.1.0", task="image-classification",
                           builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.9}}}))
    return z


def _rows(text: str, heading: str) -> dict[str, list[str]]:
    block = text.split(f"{heading}:\n", 1)[1].splitlines()
    return {line.split()[0]: line.split() for line in block[1:] if line[:1] not in ("", " ") and ":" not in line}


def test_show_lists_each_builds_generation_figures(zoo):
    r = zoo_cli("show", "tiny-llm@1.0.0", env={"COLUMNS": "80"})
    assert r.code == 0, r.text
    header = r.out.split("generation:\n", 1)[1].splitlines()[0].split()
    assert header == ["build", "perplexity", "ppl", "increase", "agreement", "exact", "match", "prefill", "ms",
                      "tokens/s"]
    rows = _rows(r.out, "generation")
    assert rows["cpu-fp32"] == ["cpu-fp32", "24.51", "-", "1.0000", "1.0000", "3.12", "212"]
    assert rows["cpu-int4"] == ["cpu-int4", "25.2", "0.0281", "0.9375", "0.7500", "1.50", "655"]
    assert rows["cpu-int8"] == ["cpu-int8", "24.9", "-", "-", "-", "-", "-"]
    assert "cpu-int4: matched 15" in r.out  # the column that gave way first at 80, listed under the table
    assert all(len(line) <= 80 for line in r.out.splitlines())


def test_a_narrow_show_keeps_perplexity_agreement_and_speed_and_lists_the_rest(zoo):
    r = zoo_cli("show", "tiny-llm@1.0.0", env={"COLUMNS": "50"})
    header = r.out.split("generation:\n", 1)[1].splitlines()[0].split()
    assert header == ["build", "perplexity", "agreement", "tokens/s"]
    assert "cpu-int4: ppl increase 0.0281; matched 15; exact" in r.out  # what gave way, under the table


def test_show_of_another_task_has_no_generation_table(zoo):
    r = zoo_cli("show", "cls")
    assert r.code == 0 and "generation:" not in r.out


def test_the_catalog_plots_perplexity_against_decode_tokens_per_s(zoo, tmp_path):
    build_site(tmp_path / "site", zoo=zoo)
    doc = json.loads((tmp_path / "site" / "site.json").read_text())
    llm = next(m for m in doc["models"] if m["name"] == "tiny-llm")
    assert llm["best"] == {"metric": "perplexity", "better": "lower", "value": 24.51234, "build": "cpu-fp32"}
    v = llm["versions"][0]
    assert v["quality"] == {"metric": "perplexity", "better": "lower"}
    assert v["speed"] == {"metric": "throughput_tokens_per_s", "better": "higher", "label": "decode tokens/s"}
    builds = {b["name"]: b for b in v["builds"]}
    assert builds["cpu-int4"]["speed"] == 655.0
    assert builds["cpu-int4"]["generation"] == {k: val for k, val in INT4.items() if k != "latency_p50_ms"}
    assert builds["cpu-int8"]["speed"] is None and builds["cpu-int8"]["generation"] == {"perplexity": 24.9}
    cls = next(m for m in doc["models"] if m["name"] == "cls")["versions"][0]
    assert cls["speed"]["metric"] == "latency_p50_ms" and cls["builds"][0]["generation"] == {}

    page = (tmp_path / "site" / v["page"]).read_text()
    assert "<h2>Perplexity against decode tokens/s</h2>" in page
    svg = re.search(r'<svg[^>]*class="plot builds-plot".*?</svg>', page, re.S).group(0)
    root = ET.fromstring(svg)
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "axis-label"]
    assert labels[0].startswith("decode tokens/s (higher is better)") and labels[1] == "perplexity (lower is better)"
    assert [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "strip-note"] == ["not timed"]
    points = {g.get("data-build"): g.find(f"{SVG}circle") for g in root.iter(f"{SVG}g") if g.get("class") == "point"}
    # the int4 build decodes faster: to the right; its perplexity is higher: above the fp32 build
    assert float(points["cpu-int4"].get("cx")) > float(points["cpu-fp32"].get("cx"))
    assert float(points["cpu-int4"].get("cy")) < float(points["cpu-fp32"].get("cy"))
    assert "greedy agreement 0.9375" in page and "decode tokens/s 655" in page  # the tooltip
    assert "Across versions" in page and page.count('class="point"') == 3 + 4


def test_the_builds_table_has_the_generation_columns_and_no_empty_p50(zoo, tmp_path):
    build_site(tmp_path / "site", zoo=zoo)
    page = (tmp_path / "site" / "models" / "tiny-llm" / "1.0.0" / "index.html").read_text()
    table = re.search(r'<table class="builds">.*?</table>', page, re.S).group(0)
    head = re.findall(r"<th>([^<]*)</th>", table)
    assert head == ["Build", "Runtime", "Verified", "Size", "p50 (ms)", "perplexity", "perplexity increase",
                    "greedy matched tokens", "greedy agreement", "greedy exact match", "prefill (ms)", "decode tokens/s",
                    "Measured on", "Test vectors"]
    int4 = re.search(r'<tr id="build-cpu-int4".*?</tr>', table, re.S).group(0)
    assert [c for c in re.findall(r"<td>([^<]*)</td>", int4)][-8:] == ["1.527", "25.2", "0.02807", "15", "0.9375",
                                                                        "0.75", "1.5", "655"]
    other = (tmp_path / "site" / "models" / "cls" / "0.1.0" / "index.html").read_text()
    assert "<th>p50 (ms)</th>" in other and "greedy agreement" not in other
    index = (tmp_path / "site" / "index.html").read_text()
    assert 'perplexity 24.51 <span class="muted">(cpu-fp32)</span>' in index


def test_a_generation_version_without_a_decode_step_latency_has_no_p50_column(tmp_path):
    zoo = LocalZoo()
    zoo.publish(make_staging(tmp_path / "s", "untimed-llm", "1.0.0", task="text-generation",
                             builds={"cpu-fp32": {"metrics": {"perplexity": 12.5}}}))
    build_site(tmp_path / "site", zoo=zoo)
    page = (tmp_path / "site" / "models" / "untimed-llm" / "1.0.0" / "index.html").read_text()
    assert "<th>p50 (ms)</th>" not in page and "<th>perplexity</th>" in page
