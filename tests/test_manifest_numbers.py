"""Numbers in a remote's manifest are a stranger's: a latency of 1e308, a 400-digit integer, NaN or
an infinity, wherever in the manifest, is refused where the manifest is read -- one line naming the
remote, the version and the field, exit 2 -- by `zoo search --remote`, `show --remote`, `pull` and
`site build --remote`, and nothing is pulled or written. A folder remote, and one served over plain
HTTP by a real server on 127.0.0.1 (the manifest rewritten behind it).

The CLI's formatting helpers, the web catalog's figures and `zoo pull`'s ranking take the extreme
values a manifest may hold (and ones it may not) without crashing.
"""

from __future__ import annotations

import json
import math

import pytest

from cli_helpers import zoo
from zoo import formatting
from zoo.registry import api
from zoo.registry.manifest import MAX_FIGURE, MAX_INT
from zoo.registry.store import LocalZoo
from registry_servers import make_staging

MARK = "__HOSTILE_NUMBER__"
HUGE_INT = "9" * 400

# (where in the manifest, the JSON literal put there, the field the error names, what it says)
HOSTILE = [
    ("latency", "1e308", "builds.cpu-fp32.metrics.latency_p50_ms", "out of bounds"),
    ("latency", HUGE_INT, "builds.cpu-fp32.metrics.latency_p50_ms", "400 digits"),
    ("latency", "-1e400", "builds.cpu-fp32.metrics.latency_p50_ms", "-inf"),
    ("accuracy", "NaN", "builds.cpu-int8.metrics.accuracy", "nan"),
    ("accuracy", "Infinity", "builds.cpu-int8.metrics.accuracy", "inf"),
    ("size", HUGE_INT, "builds.cpu-fp32.file.size", "less than or equal"),
    ("shape", HUGE_INT, "builds.cpu-fp32.inputs.0.shape.0", "400 digits"),
    ("opset", str(MAX_INT + 1), "builds.cpu-fp32.opset", "out of bounds"),
    ("threads", HUGE_INT, "builds.cpu-fp32.measured_on.threads", "400 digits"),
    ("extra", "1e308", "extra", "out of bounds"),
    ("preprocessing", HUGE_INT, "preprocessing", "400 digits"),
]


def _plant(manifest: dict, where: str) -> None:
    """Put MARK (a string, replaced by the raw JSON literal afterwards) at `where`."""
    fp32, int8 = manifest["builds"]["cpu-fp32"], manifest["builds"]["cpu-int8"]
    if where == "latency":
        fp32["metrics"]["latency_p50_ms"] = MARK
    elif where == "accuracy":
        int8["metrics"]["accuracy"] = MARK
    elif where == "size":
        fp32["file"]["size"] = MARK
    elif where == "shape":
        fp32["inputs"][0]["shape"][0] = MARK
    elif where == "opset":
        fp32["opset"] = MARK
    elif where == "threads":
        fp32["measured_on"] = {"threads": MARK}
    elif where == "extra":
        manifest["extra"] = {"deploy": {"measured": [{"figures": {"p99": MARK}}]}}
    elif where == "preprocessing":
        manifest["preprocessing"] = {"image": {"size": [MARK, 224]}}


@pytest.fixture
def remote(backend, tmp_path):
    """tiny@1.1.0 (two builds) published on `backend` as remote ``origin``, and a fresh local zoo (the
    CLI's ZOO_HOME) with the same remote; returns (the manifest file behind the remote, the zoo)."""
    publisher = LocalZoo(tmp_path / "publisher")
    publisher.publish(make_staging(tmp_path / "s110", version="1.1.0", builds={
        "cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.9}},
        "cpu-int8": {"precision": "int8", "metrics": {"latency_p50_ms": 1.0, "accuracy": 0.88}}}))
    backend.add_to(publisher, url=backend.write_url)
    api.push("tiny@1.1.0", "origin", zoo=publisher)
    consumer = LocalZoo()  # conftest's ZOO_HOME: the one the `zoo` processes use
    backend.add_to(consumer)
    return backend.root / "models" / "tiny" / "versions" / "1.1.0.json", consumer


def _rewrite(path, where: str, literal: str) -> None:
    manifest = json.loads(path.read_text())
    _plant(manifest, where)
    text = json.dumps(manifest, indent=1).replace(json.dumps(MARK), literal)
    assert literal in text
    path.chmod(0o644)
    path.write_text(text)


def _run_all(tmp_path) -> dict:
    """The four commands' results (run side by side: each only reads the remote and fails at its manifest)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(zoo, *args) for name, args in _commands(tmp_path).items()}
        return {name: f.result() for name, f in futures.items()}


def _commands(tmp_path):
    return {"search": ["search", "tiny", "--remote", "origin"],
            "show": ["show", "tiny@1.1.0", "--remote", "origin"],
            "pull": ["pull", "tiny@1.1.0", "--remote", "origin"],
            "site": ["site", "build", "--remote", "origin", "--out", str(tmp_path / "site")]}


def _hostile_cases():
    """Every hostile number on a folder remote; the first two also on the HTTP one (a real server)."""
    for i, (where, literal, field, says) in enumerate(HOSTILE):
        shown = literal if len(literal) < 12 else f"{len(literal)}-digits"
        for kind in ("folder", "http") if i < 2 else ("folder",):
            yield pytest.param(kind, where, literal, field, says, id=f"{where}={shown}-{kind}")


@pytest.mark.parametrize("backend, where, literal, field, says", list(_hostile_cases()), indirect=["backend"])
def test_a_hostile_number_in_a_remote_manifest_is_refused_by_every_command(remote, tmp_path, where, literal,
                                                                            field, says):
    path, consumer = remote
    assert zoo("show", "tiny@1.1.0", "--remote", "origin").code == 0  # the remote as published reads
    _rewrite(path, where, literal)
    for name, result in _run_all(tmp_path).items():
        assert result.code == 2, (name, result.text)
        assert "Traceback" not in result.err, (name, result.err)
        [line] = [ln for ln in result.err.splitlines() if ln.startswith("error:")]
        assert "remote origin" in line and "tiny@1.1.0" in line and field in line and says in line, (name, line)
    assert consumer.get("tiny", "1.1.0") is None  # nothing pulled
    assert not (tmp_path / "site").exists()  # no site written


@pytest.mark.parametrize("backend", ["folder", "http"], indirect=True)
@pytest.mark.parametrize("literal, says", [("9" * 5000, "an integer of more than 4300 digits"),
                                           ("[" * 100_000 + "]" * 100_000, "nested too deep")],
                         ids=["5000-digits", "nested-100000-deep"])
def test_a_remote_manifest_json_cannot_parse_is_one_line_naming_its_file(remote, tmp_path, literal, says):
    """Past what json.loads takes (Python's 4300-digit limit for an int, its recursion limit): the
    remote's file is refused as unreadable (a storage error, exit 3), no traceback."""
    path, consumer = remote
    _rewrite(path, "extra", literal)
    for name, result in _run_all(tmp_path).items():
        assert result.code == 3, (name, result.text)
        assert "Traceback" not in result.err, (name, result.err)
        [line] = [ln for ln in result.err.splitlines() if ln.startswith("error:")]
        assert "remote origin" in line and "models/tiny/versions/1.1.0.json" in line and says in line, (name, line)
    assert consumer.get("tiny", "1.1.0") is None and not (tmp_path / "site").exists()


@pytest.mark.parametrize("backend", ["folder"], indirect=True)
def test_the_largest_numbers_a_manifest_may_hold_go_through_every_command(remote, tmp_path):
    path, _ = remote
    manifest = json.loads(path.read_text())
    manifest["builds"]["cpu-fp32"]["metrics"] = {"latency_p50_ms": MAX_FIGURE, "accuracy": -MAX_FIGURE,
                                                  "count": MAX_INT}
    manifest["builds"]["cpu-int8"]["metrics"] = {"latency_p50_ms": 5e-324, "accuracy": MAX_INT, "note": "x" * 500}
    path.chmod(0o644)
    path.write_text(json.dumps(manifest))
    for name, result in _run_all(tmp_path).items():
        assert result.code == 0, (name, result.text)


@pytest.mark.parametrize("value", [None, 0, -1, 1.5, 1e308, -1e308, math.inf, -math.inf, math.nan, 10**400, -10**400,
                                   10**5000, "1e999", "x" * 5000, "fast", 2**53, 5e-324, True],
                         ids=lambda v: type(v).__name__ + (repr(v) if len(repr(v) if not isinstance(v, int) or
                                                                       abs(v) < 10**20 else "x" * 30) < 20 else "-long"))
def test_the_formatting_helpers_take_any_value_without_crashing(value):
    for helper in (formatting.ms, formatting.metric, formatting.size):
        text = helper(value)
        assert isinstance(text, str) and 0 < len(text) <= 40, (helper.__name__, text)
