"""What a built-in stage's key holds (issue #33): the kind's own package and the zoo modules that
compute its bytes (`zoo.stage.KEYED_ZOO_MODULES`), never zoo's plumbing (engine, registry,
downloader, CLI, file layer, errors: the kind interface, for which `zoo.stage.KIND_EPOCH` stands);
and the versions of the tools this recipe's stages use, not those of every framework zoo supports.
A copy of the tree with comments in the plumbing: tests/test_import_closure.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from zoo.engine import import_closure, keys, kind_loader, planner
from zoo.engine.cache import Cache
from zoo.engine.recipe import load
from zoo.stage import KEYED_ZOO_MODULES

# zoo's plumbing: a module of these packages (or these modules) in a key would rerun every
# pipeline on every upgrade of zoo that touched it
INFRASTRUCTURE = ("zoo.engine", "zoo.registry", "zoo.cli", "zoo.release", "zoo.site", "zoo.api", "zoo.download",
                  "zoo.files", "zoo.errors", "zoo.pathsafety", "zoo.paths", "zoo.stage", "zoo.yamlio", "zoo.host",
                  "zoo.sources", "zoo.catalog", "zoo.dvcrepo", "zoo.entry", "zoo.cpuid")


def _infrastructure(module: str) -> bool:
    return module == "zoo" or any(module == p or module.startswith(p + ".") for p in INFRASTRUCTURE)


@pytest.mark.parametrize("kind", sorted(kind_loader.builtin_names()))
def test_no_infrastructure_module_enters_a_builtin_kinds_key(kind):
    closure = keys.module_files(kind)
    assert closure, kind
    leaked = sorted(m for m in closure if _infrastructure(m))
    assert leaked == [], f"{kind}'s key would hold zoo's plumbing: {leaked}"
    assert all(m.startswith("zoo_stages") or m in KEYED_ZOO_MODULES for m in closure), sorted(closure)


def test_the_keyed_zoo_modules_compute_and_reach_no_plumbing():
    """A keyed zoo module is code a kind runs for its bytes: it may import the interface's errors,
    nothing of the engine, the registry or the CLI (its own closure stays in the keyed set)."""
    for name in KEYED_ZOO_MODULES:
        assert not _infrastructure(name), name
        path = REPO / (name.replace(".", "/") + ".py")
        imported = {n for _, n, _ in import_closure.parse_statements(path.read_bytes(), str(path))}
        reached = sorted(n for n in imported if n.startswith("zoo.") and n not in ("zoo.errors", *KEYED_ZOO_MODULES))
        assert reached == [], f"{name} imports {reached}"


def _keys(recipe: Path, tmp_path: Path) -> dict[str, str]:
    dag = planner.build(load(recipe))
    hashes = Cache(tmp_path / "c").ensure().hashes
    inputs = {nid: {up: {"out": "0" * 64} for up in node.needs} for nid, node in dag.nodes.items()}
    return {nid: keys.key_of(keys.key_parts(dag.recipe, node, inputs[nid], hashes, {}))
            for nid, node in dag.nodes.items()}


def test_another_version_of_a_framework_the_model_does_not_use_changes_no_key(tmp_path, monkeypatch):
    """lenet-digits is a torch network: transformers, jax2onnx, LightGBM... are not its tools."""
    before = _keys(REPO / "recipes" / "lenet-digits.yaml", tmp_path)
    bert = _keys(REPO / "recipes" / "bert-tiny-text.yaml", tmp_path)
    real = keys.tool_version
    unused = {"transformers", "jax2onnx", "jax", "keras", "lightgbm", "xgboost", "scikit-learn", "skl2onnx",
              "onnxmltools", "tokenizers"}  # (lenet-digits ships OpenVINO builds: openvino is its deploy's tool)
    monkeypatch.setattr(keys, "tool_version", lambda dist: "99.0.0" if dist in unused else real(dist))
    assert _keys(REPO / "recipes" / "lenet-digits.yaml", tmp_path) == before
    # the recipe whose network transformers builds does get new keys for train and export
    moved = _keys(REPO / "recipes" / "bert-tiny-text.yaml", tmp_path)
    assert moved["train"] != bert["train"] and moved["export"] != bert["export"]
    # and a tool lenet does use moves its train and export keys
    monkeypatch.setattr(keys, "tool_version", lambda dist: "99.0.0" if dist == "torch" else real(dist))
    torch_moved = _keys(REPO / "recipes" / "lenet-digits.yaml", tmp_path)
    assert torch_moved["train"] != before["train"] and torch_moved["export"] != before["export"]
    assert torch_moved["verify"] == before["verify"]  # verify runs onnxruntime, not torch
