"""docs/api.md, and `zoo.api` against the commands it stands for.

The page's ```python blocks run in order in one namespace, as one session from a clone's root (a
temp folder holding recipes/lenet-digits.yaml, with its own ZOO_HOME and ZOO_CACHE_DIR): a failing
example fails the module, its traceback naming the page's line. Then, in that session's state,
each function's result is compared with what its command prints with `--json` for the same
arguments (`python -m zoo` in a subprocess), each section's signature with the code, and each
error's exit code with the command's.

One lenet run for the module (about 10 s); the tests run in file order and share its zoo.
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import zoo.api as zoo
from cli_helpers import zoo as zoo_cli
from conftest import REPO
from zoo.errors import IntegrityError, InvalidInput, NotFound, ZooError
from zoo.registry import api as registry
from zoo.registry.store import LocalZoo
from registry_servers import make_staging

DOC = REPO / "docs" / "api.md"
RECIPE = "recipes/lenet-digits.yaml"
REF = "lenet-digits@1.0.0"
# the functions the page documents, each with a section: `## \`zoo.NAME\``
FUNCTIONS = ("plan", "run", "status", "list_models", "list_versions", "show", "search", "pull", "load_session", "generate",
             "push", "release")


def _fenced(text: str, language: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```language block of `text`."""
    return [(text.count("\n", 0, m.start(1)) + 1, m.group(1))
            for m in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)]


def _sections(text: str) -> dict[str, str]:
    """Each `## \\`zoo.NAME\\`` section's text, by NAME."""
    parts = re.split(r"^## `zoo\.(\w+)`\n", text, flags=re.M)
    return {parts[i]: parts[i + 1].split("\n## ", 1)[0] for i in range(1, len(parts), 2)}


def _signature(name: str) -> str:
    """zoo.NAME(...) -> R as the code declares it (the annotations as written: `from __future__ import annotations`)."""
    sig = inspect.signature(getattr(zoo, name))
    parts, keyword_only = [], False
    for p in sig.parameters.values():
        if p.kind == p.KEYWORD_ONLY and not keyword_only:
            parts.append("*")
            keyword_only = True
        text = p.name + (f": {p.annotation}" if p.annotation is not p.empty else "")
        parts.append(text + (f" = {p.default!r}" if p.default is not p.empty else ""))
    return f"zoo.{name}({', '.join(parts)}) -> {sig.return_annotation}"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """The page's examples, run; what they left (lenet built and published, remotes `team` and `prod`)."""
    base = tmp_path_factory.mktemp("api-docs")
    (base / "recipes").mkdir()
    shutil.copy(REPO / RECIPE, base / RECIPE)
    env = {"ZOO_HOME": str(base / "home"), "ZOO_CACHE_DIR": str(base / "cache"),
           "ZOO_CODE_MEMO": str(base / "code.sqlite"), "ZOO_CONFIG_DIR": str(base / "config")}
    namespace: dict = {"__name__": "api_docs"}
    text = DOC.read_text()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.chdir(base)
        for line, code in _fenced(text, "python"):
            # padded so that a traceback names the line of docs/api.md
            exec(compile("\n" * (line - 1) + code, str(DOC), "exec"), namespace)
    return {"base": base, "env": env, "ns": namespace}


@pytest.fixture
def here(session, monkeypatch):
    """This test in the session's folder and zoo (after conftest's per-test temp paths)."""
    for k, v in session["env"].items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(session["base"])
    return session


def _cli(session, *args, env: dict | None = None):
    return zoo_cli(*args, cwd=session["base"], env={**session["env"], **(env or {})})


def _cli_json(session, *args, env: dict | None = None):
    """The command's --json output less the `schema_version` the CLI adds to each object it prints
    (zoo.cli.jsonout.versioned: the CLI's own shape version; the API returns the data itself). A
    manifest keeps its own schema_version (3), which the API returns too."""
    r = _cli(session, *args, "--json", env=env)
    assert r.code == 0, r.text
    return _unversioned(json.loads(r.out))


def _unversioned(obj):
    """`obj` without the CLI shapes' `schema_version` (zoo.cli.jsonout.SCHEMA_VERSION) in its objects;
    a run/plan/status result and a release result carry it in their `to_json()` too."""
    from zoo.cli.jsonout import SCHEMA_VERSION

    if isinstance(obj, list):
        return [_unversioned(x) for x in obj]
    if isinstance(obj, dict) and obj.get("schema_version") == SCHEMA_VERSION:
        return {k: v for k, v in obj.items() if k != "schema_version"}
    return obj


# --- the page ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUNCTIONS)
def test_each_function_has_a_section_with_its_signature_a_command_and_an_example(name):
    section = _sections(DOC.read_text()).get(name)
    assert section is not None, f"docs/api.md has no section ## `zoo.{name}`"
    signatures = _fenced(section, "text")
    assert signatures and signatures[0][1].strip() == _signature(name)
    assert re.search(r"^Command: `zoo ", section, re.M), "the section names its command"
    assert "Errors" in section or name == "status"
    assert _fenced(section, "python"), "the section has an example"
    assert getattr(zoo, name).__doc__


def test_the_examples_run_as_one_session(session):
    ns = session["ns"]
    assert ns["result"].ok and ns["pushed"]["created"] and ns["released"]["created"]
    assert isinstance(ns["session"], ort.InferenceSession)


def test_import_zoo_api_is_cheap():
    """`import zoo.api` imports no torch, onnx, onnxruntime or openvino (load_session does, when called)."""
    code = ("import sys, zoo.api\n"
            "print([m for m in ('torch', 'onnx', 'onnxruntime', 'openvino', 'rich', 'typer') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


# --- each function equals its command ---------------------------------------------------------

@pytest.mark.parametrize("name", ["plan", "status", "run"])
def test_plan_status_and_a_cached_run_equal_their_commands(here, name):
    assert _unversioned(getattr(zoo, name)(RECIPE).to_json()) == _cli_json(here, name, RECIPE)


@pytest.mark.parametrize("remote", [None, "team"])
def test_list_models_and_list_versions_equal_zoo_list(here, remote):
    where = ["--remote", remote] if remote else []
    assert zoo.list_models(remote=remote) == _cli_json(here, "list", *where)
    assert zoo.list_versions("lenet-digits", remote=remote) == _cli_json(here, "list", "lenet-digits", *where)
    assert zoo.list_versions(remote=remote) == _cli_json(here, "list", "--versions", *where)
    assert [m["name"] for m in zoo.list_models(remote=remote)] == ["lenet-digits"]


@pytest.mark.parametrize("ref, remote", [(REF, None), ("lenet-digits", None), ("lenet-digits@stable", "team"),
                                         ("lenet-digits@prod", "prod")])
def test_show_equals_zoo_show(here, ref, remote):
    data = zoo.show(ref, remote=remote)
    assert data == _cli_json(here, "show", ref, *(["--remote", remote] if remote else []))
    assert data["version"] == "1.0.0" and data["source"] == (remote or "local")
    assert json.loads(json.dumps(data)) == data  # plain JSON data, as printed


SEARCHES = [
    ({}, []),
    ({"text": "digits"}, ["digits"]),
    ({"text": "nothing like it"}, ["nothing like it"]),
    ({"min_accuracy": 0.9, "max_latency": 1000.0}, ["--min-accuracy", "0.9", "--max-latency", "1000.0"]),
    ({"task": "image-classification", "all_versions": True}, ["--task", "image-classification", "--all-versions"]),
    ({"tag": "stable"}, ["--tag", "stable"]),
]


@pytest.mark.parametrize("kwargs, args", SEARCHES, ids=lambda x: repr(x))
@pytest.mark.parametrize("remote", [None, "team"])
def test_search_equals_zoo_search(here, kwargs, args, remote):
    rows = zoo.search(**kwargs, remote=remote)
    assert rows == _cli_json(here, "search", *args, *(["--remote", remote] if remote else []))
    if remote and "tag" not in kwargs:  # the remote holds what the local zoo holds
        assert rows == zoo.search(**kwargs)


def test_search_finds_the_tagged_version_on_the_remote_only(here):
    """The push tagged `stable` on the remote: the remote's search finds it; the local zoo has no such tag."""
    assert {r["build"] for r in zoo.search(tag="stable", remote="team")} == set(zoo.show(REF)["builds"])
    assert zoo.search(tag="stable") == []


TINY_SEARCHES = [{}, {"all_versions": True}, {"text": "TINY"}, {"text": "other", "all_versions": True},
                 {"task": "classification"}, {"tag": "prod"}, {"tag": "prod", "all_versions": True},
                 {"max_latency": 1.5, "all_versions": True}, {"min_accuracy": 0.85, "all_versions": True},
                 {"min_accuracy": 0.99}]


def test_a_remote_search_gives_the_rows_of_a_local_zoo_holding_the_same_versions(tmp_path):
    """Several models and versions (1.10.0 sorts after 1.2.0), tags and metrics; every version pushed."""
    z = LocalZoo()
    published = [("tiny", "1.2.0", "regression", {"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.9}}}),
                 ("tiny", "1.10.0", "regression", {"cpu-fp32": {"metrics": {"latency_p50_ms": 1.0, "accuracy": 0.8}},
                                                   "cpu-int8": {"metrics": {"latency_p50_ms": 0.5}}}),
                 ("tiny", "1.0.0", "regression", {"cpu-fp32": {"metrics": {"accuracy": 0.95}}}),
                 ("other", "0.1.0", "classification", {"cpu-fp32": {"metrics": {"latency_p50_ms": 1.2,
                                                                                 "accuracy": 0.99}}})]
    registry.remote_add("team", str(tmp_path / "remote"))
    for name, version, task, builds in published:
        z.publish(make_staging(tmp_path / f"{name}-{version}", name, version, builds=builds, task=task,
                               description=f"the {name} model"))
    for name, version, *_ in published:
        zoo.push(f"{name}@{version}", "team", tags=["prod"] if version == "1.2.0" else ())
    registry.tag("tiny@1.2.0", "prod")
    for kwargs in TINY_SEARCHES:
        assert zoo.search(**kwargs, remote="team") == zoo.search(**kwargs), kwargs
    assert [(r["version"], r["build"]) for r in zoo.search("tiny")] == [("1.10.0", "cpu-fp32"), ("1.10.0", "cpu-int8")]
    assert {r["version"] for r in zoo.search(tag="prod", all_versions=True, remote="team")} == {"1.2.0"}


@pytest.mark.parametrize("build", ["cpu-int8", None])
def test_pull_from_the_local_zoo_equals_zoo_pull(here, build):
    chosen = ["--build", build] if build else []
    assert zoo.pull(REF, build) == _cli_json(here, "pull", REF, *chosen)
    dest = here["base"] / "placed"
    assert zoo.pull(REF, build, to=dest) == _cli_json(here, "pull", REF, *chosen, "--to", dest)


def test_pull_from_a_remote_into_a_fresh_zoo_equals_zoo_pull(here, tmp_path):
    """Two fresh zoos with the same remote: the API pulls into one, the command into the other."""
    results = []
    for side in ("api", "cli"):
        home = tmp_path / side
        registry.remote_add("team", str(here["base"] / "team-zoo"), zoo=LocalZoo(home))
        if side == "api":
            results.append(zoo.pull("lenet-digits@stable", "cpu-fp32", remote="team", zoo=LocalZoo(home)))
        else:
            results.append(_cli_json(here, "pull", "lenet-digits@stable", "--build", "cpu-fp32", "--remote", "team",
                                     env={"ZOO_HOME": str(home)}))
        results[-1]["path"] = str(Path(results[-1]["path"]).relative_to(home))
    assert results[0] == results[1]
    assert results[0]["source"] == "team" and results[0]["downloaded_files"] >= 1
    assert results[0]["fetched_from"] == ["team"]


def test_push_equals_zoo_push(here, tmp_path):
    # to fresh remotes: both publish; the results differ only in the remote's name
    registry.remote_add("fresh-api", str(tmp_path / "fresh-api"))
    registry.remote_add("fresh-cli", str(tmp_path / "fresh-cli"))
    pushed = zoo.push(REF, "fresh-api", tags=["stable"])
    assert pushed["created"] and pushed["uploaded"] > 0
    assert pushed == {**_cli_json(here, "push", REF, "--to", "fresh-cli", "--tag", "stable"), "remote": "fresh-api"}
    # again: both find the same bytes there
    assert zoo.push(REF, "team") == _cli_json(here, "push", REF, "--to", "team")


def test_release_equals_zoo_release(here, tmp_path):
    # to fresh remotes: both publish what the cache holds; the results differ only in the remote's name
    registry.remote_add("rel-api", str(tmp_path / "rel-api"))
    registry.remote_add("rel-cli", str(tmp_path / "rel-cli"))
    released = _unversioned(zoo.release(RECIPE, version="1.0.0", to="rel-api"))
    assert released["created"] and not released["noop"]
    assert released == {**_cli_json(here, "release", RECIPE, "--version", "1.0.0", "--to", "rel-cli"),
                        "remote": "rel-api"}
    # again to `prod`: nothing to do, said the same way
    again = _unversioned(zoo.release(RECIPE, version="1.0.0", to="prod", tags=["prod"]))
    assert again["noop"]
    assert again == _cli_json(here, "release", RECIPE, "--version", "1.0.0", "--to", "prod", "--tag", "prod")


# --- load_session -----------------------------------------------------------------------------

@pytest.mark.parametrize("build", ["cpu-fp32", "cpu-int8", "mobile"])
def test_load_session_runs_the_build_zoo_pull_places(here, build):
    """The session computes what a session on the path `zoo pull --build B` prints computes."""
    path = _cli_json(here, "pull", REF, "--build", build)["path"]
    images = np.random.default_rng(0).random((3, 1, 16, 16), dtype=np.float32)
    session = zoo.load_session(REF, build)
    by_hand = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    assert [o.name for o in session.get_outputs()] == [o.name for o in by_hand.get_outputs()]
    for ours, theirs in zip(session.run(None, {name: images}), by_hand.run(None, {name: images})):
        assert np.array_equal(ours, theirs)


def test_load_session_refuses_an_openvino_build(here):
    for build in ("openvino-fp32", "openvino-int8"):
        with pytest.raises(InvalidInput, match="OpenVINO build") as e:
            zoo.load_session(REF, build)
        assert "cpu-fp32" in e.value.hint and "openvino-fp32" not in e.value.hint.split("(")[1].split(")")[0]


def _tiny_zoo(tmp_path) -> LocalZoo:
    """A tiny version whose OpenVINO-labelled build is the fastest: `zoo pull` picks it, load_session
    does not. Each build's model multiplies by its own factor, so its outputs say which one ran."""
    z = LocalZoo()
    ov = {"format": "openvino", "runtime": "openvino>=2026.4", "execution_providers": ["CPU"],
          "metrics": {"latency_p50_ms": 0.5}}
    z.publish(make_staging(tmp_path / "staging", builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0}},
                                                         "cpu-int8": {"metrics": {"latency_p50_ms": 1.0}},
                                                         "openvino-fp32": ov}))
    return z


def test_load_session_never_picks_an_openvino_build_by_default(tmp_path):
    _tiny_zoo(tmp_path)
    assert zoo.pull("tiny")["build"] == "openvino-fp32"  # zoo pull's choice here: OpenVINO is installed
    session = zoo.load_session("tiny")
    x = np.ones((4,), dtype=np.float32)
    expected = ort.InferenceSession(zoo.pull("tiny", "cpu-int8")["path"]).run(None, {"x": x})
    assert np.array_equal(session.run(None, {"x": x})[0], expected[0])  # the fastest onnxruntime build
    assert session.get_providers() == ["CPUExecutionProvider"]


def test_load_session_providers_and_options(tmp_path):
    _tiny_zoo(tmp_path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = zoo.load_session("tiny", "cpu-fp32", ["CPUExecutionProvider"], session_options=options)
    assert session.get_session_options().intra_op_num_threads == 1
    # onnxruntime alone would print a warning and run on CPU: refused instead
    with pytest.raises(InvalidInput, match="onnxruntime offers no NoSuchExecutionProvider here") as e:
        zoo.load_session("tiny", "cpu-fp32", ["NoSuchExecutionProvider", "CPUExecutionProvider"])
    assert "CPUExecutionProvider" in e.value.hint


def test_load_session_refuses_a_model_onnxruntime_cannot_load(tmp_path):
    """A well-formed ONNX file with an operator no runtime has: InvalidInput, as zoo's own sessions."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("NoSuchOperator", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    staging = make_staging(tmp_path / "staging")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              staging / "builds/cpu-fp32/model.onnx")
    from zoo.registry.manifest import Manifest
    from zoo.registry.staging import file_ref, write_manifest

    manifest = Manifest.model_validate_json((staging / "zoo-manifest.json").read_text())
    build = manifest.builds["cpu-fp32"].model_copy(update={"file": file_ref(staging, "builds/cpu-fp32/model.onnx")})
    write_manifest(staging, manifest.model_copy(update={"builds": {"cpu-fp32": build}}))
    LocalZoo().publish(staging)
    with pytest.raises(InvalidInput, match="onnxruntime cannot load tiny@1.0.0 build cpu-fp32"):
        zoo.load_session("tiny")


def test_load_session_checks_every_byte_before_onnxruntime_reads_it(tmp_path):
    """A remote blob whose bytes went bad: IntegrityError (exit 4, as `zoo pull`), nothing adopted."""
    z = _tiny_zoo(tmp_path)
    registry.remote_add("team", str(tmp_path / "remote"))
    zoo.push("tiny@1.0.0", "team")
    sha = z.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    blob = tmp_path / "remote/blobs/sha256" / sha[:2] / sha
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    other = LocalZoo(tmp_path / "other")
    registry.remote_add("team", str(tmp_path / "remote"), zoo=other)
    with pytest.raises(IntegrityError, match="checksum mismatch"):
        zoo.load_session("tiny@1.0.0", "cpu-fp32", remote="team", zoo=other)
    assert other.list() == []
    cli = zoo_cli("pull", "tiny@1.0.0", "--build", "cpu-fp32", "--remote", "team", env={"ZOO_HOME": str(other.root)})
    assert cli.code == IntegrityError.exit_code, cli.text


# --- errors: the class whose exit code the command exits with --------------------------------

ERRORS = [
    (lambda: zoo.show("lenet-digits@9.9.9"), ["show", "lenet-digits@9.9.9"], NotFound),
    (lambda: zoo.pull(REF, "no-such-build"), ["pull", REF, "--build", "no-such-build"], NotFound),
    (lambda: zoo.pull("Not A Name"), ["pull", "Not A Name"], InvalidInput),
    (lambda: zoo.search(remote="nowhere"), ["search", "--remote", "nowhere"], ZooError),
    (lambda: zoo.push("lenet-digits", "team"), ["push", "lenet-digits", "--to", "team"], InvalidInput),
    (lambda: zoo.push(REF, "team", tags=["latest"]), ["push", REF, "--to", "team", "--tag", "latest"], InvalidInput),
    (lambda: zoo.release(RECIPE, version="2.0.0", to="prod"), ["release", RECIPE, "--version", "2.0.0", "--to", "prod"],
     InvalidInput),
]


@pytest.mark.parametrize("call, args, error", ERRORS, ids=[" ".join(a) for _, a, _ in ERRORS])
def test_errors_are_the_classes_whose_exit_code_the_command_exits_with(here, call, args, error):
    with pytest.raises(error) as raised:
        call()
    cli = _cli(here, *args, "--json")
    assert cli.code == raised.value.exit_code != 0, cli.text
    assert json.loads(cli.out)["error"]["message"] == raised.value.message and cli.err == ""
