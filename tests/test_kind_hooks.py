"""What a kind tells the engine after a run (zoo/stage.py): effects, report tables, gates, and what a
release needs. The kinds here are plug-ins (tests/plugins: `inspector` is gate-like with its own
metric format, `shipper` publish-like: it declares its release folder, and the engine publishes it
as `published`), registered through an entry point as a third party's would be: the engine must do
for them what it does for verify and deploy."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import zoo
from cli_helpers import SHIPPED, write_recipe, zoo as zoo_cli
from conftest import REPO
from zoo.errors import GateFailed, IntegrityError, InvalidInput
from zoo.registry import api as registry
from zoo.registry.store import LocalZoo

def test_the_run_summary_prints_a_plugin_kinds_tables_and_effects_and_the_fast_path_keeps_them(tmp_path):
    recipe = write_recipe(tmp_path, SHIPPED)
    cli = zoo_cli("run", recipe)
    assert cli.code == 0, cli.text
    lines = cli.out.splitlines()
    # the inspector's table (its recipe gate only, not its implicit check), then the shipper's, then its effect
    at = lines.index("checks (check):")
    assert lines[at + 1].split() == ["check", "measured", "verdict"]
    assert lines[at + 2].split() == ["chars", ">=", "3", "7", "ok"]
    assert "utf-8" not in cli.out
    at = lines.index("contents of shipped@0.1.0:")
    assert lines[at + 2].split()[0] == "builds/data/model.ort" and lines[at + 3].split()[0] == "NOTICE.txt"
    assert lines[-2:] == ["published shipped@0.1.0", f"updated {recipe.with_suffix('.lock')}"]
    zoo_home = LocalZoo()
    assert zoo_home.get("shipped", "0.1.0") is not None

    # nothing changed: the no-op fast path answers, with the effect (it still holds) and no tables
    again = zoo_cli("run", recipe)
    assert again.code == 0 and again.out.splitlines()[-2:] == ["shipped@0.1.0: 0 ran, 3 cached (0.0s of stage time)",
                                                               "published shipped@0.1.0"], again.text
    # the effect's evidence is gone (the version was removed from the zoo): the fast path must not
    # claim it; the full path's engine publishes the cached release again and says so
    assert zoo_cli("rm", "shipped@0.1.0").code == 0 and zoo_home.get("shipped", "0.1.0") is None
    third = zoo_cli("run", recipe)
    assert third.code == 0 and third.out.splitlines()[-1] == "published shipped@0.1.0", third.text
    assert zoo_home.get("shipped", "0.1.0") is not None
    # --json lists each stage's effects (what and on what; the evidence is this machine's paths)
    fourth = zoo_cli("run", recipe, "--json")
    assert fourth.code == 0, fourth.text
    stages = {s["id"]: s for s in json.loads(fourth.out)["stages"]}
    assert stages["ship"]["state"] == "cached" and stages["ship"]["effects"] == [{"kind": "published", "ref": "shipped@0.1.0"}]
    assert stages["check"]["effects"] == [] and "shipped" not in json.dumps(stages["ship"]["metrics"])


def test_effects_are_reported_for_this_run_and_never_cached(tmp_path):
    recipe = write_recipe(tmp_path, SHIPPED)
    first = zoo.run(recipe)
    ship = {s.id: s for s in first.stages}["ship"]
    assert [str(e) for e in ship.effects] == ["published shipped@0.1.0"]
    zoo_home = LocalZoo()
    assert zoo_home.manifest_path("shipped", "0.1.0") in {Path(p) for p in ship.effects[0].evidence}
    entry = zoo.engine.cache.Cache(first.cache_dir).lookup(ship.key)
    assert "effects" not in entry.metrics and not any("shipped@" in str(v) for v in entry.metrics.values())
    # `zoo repro` rebuilds without side effects: no effect, nothing to report
    rebuilt = zoo.run(recipe, force=True, record=False)
    assert all(s.effects == [] for s in rebuilt.stages)


def _release(recipe: Path, remote: str, **kwargs):
    from zoo.release.ship import release

    return release(recipe, version="0.1.0", to=remote, **kwargs)


def test_a_release_of_plugin_kinds_checks_their_gates_and_carries_their_files(tmp_path):
    recipe = write_recipe(tmp_path, SHIPPED)
    registry.remote_add("site", str(tmp_path / "site"))
    assert zoo.run(recipe).ok  # the lockfile a release runs under
    result = _release(recipe, "site")
    assert result.created and result.executed == [] and result.notes == []
    assert result.gates == [
        {"stage": "check", "gate": "chars >= 3", "value": 7, "passed": True, "implicit": False},
        {"stage": "check", "gate": "text is utf-8", "value": 1, "passed": True, "implicit": True}]
    notice = LocalZoo().get("shipped", "0.1.0").files[0]
    assert result.files == {"NOTICE.txt": notice.sha256}
    assert registry.show("shipped@0.1.0", remote="site")["files"][0]["path"] == "NOTICE.txt"


def _variant(tmp_path: Path, name: str, text: str) -> Path:
    """SHIPPED edited, as recipe (and model) `name`: each variant publishes a version of its own."""
    return write_recipe(tmp_path, text.replace("name: shipped", f"name: {name}"), f"{name}.yaml")


def test_a_release_refuses_what_a_plugin_kind_reports_as_failed(tmp_path):
    registry.remote_add("site", str(tmp_path / "site"))
    # an advisory gate that failed: the stage passed, the release does not
    advisory = _variant(tmp_path, "advisory", SHIPPED.replace("minimum: 3}", "minimum: 100, enforce: false}"))
    with pytest.raises(GateFailed, match=r"stage check: gates failed: chars >= 100; nothing was released"):
        _release(advisory, "site", allow_stale_lock=True)
    # the publishing kind's own check of the published version
    lying = _variant(tmp_path, "lying", SHIPPED.replace("kind: shipper,", "kind: shipper, config: {false_notice: true},"))
    with pytest.raises(IntegrityError, match="does not match what stage ship built: NOTICE.txt does not list"):
        _release(lying, "site", allow_stale_lock=True)
    assert registry.list_versions(remote="site") == []
    # no gate-checking stage: released, with a note saying so
    ungated = _variant(tmp_path, "ungated", SHIPPED.replace("  check: {kind: inspector, config: {minimum: 3}}\n", "")
                       .replace("needs: [check]", "needs: [a]"))
    result = _release(ungated, "site", allow_stale_lock=True)
    assert result.created and result.gates == []
    assert result.notes == ["no stage of the recipe checks quality gates: no gate checked this release"]


def test_a_release_needs_exactly_one_publishing_stage(tmp_path):
    registry.remote_add("site", str(tmp_path / "site"))
    none = write_recipe(tmp_path, SHIPPED.replace("kind: shipper,", "kind: shipper, config: {publish: false},"), "none.yaml")
    with pytest.raises(InvalidInput, match="has no stage that publishes the version"):
        _release(none, "site")
    two = write_recipe(tmp_path, SHIPPED + "  again: {kind: shipper, needs: [check]}\n", "two.yaml")
    with pytest.raises(InvalidInput, match=r"several stages that publish the version \(ship, again\)"):
        _release(two, "site")


def _engine_modules() -> list[Path]:
    """Every module of zoo/ but the registry (engine, CLI, release): none may know a kind by name.

    The registry reads a manifest's build metrics (latency, accuracy) by name: they are fields of
    the zoo's published format, which any kind that publishes writes, not one kind's metrics."""
    return sorted(p for p in (REPO / "zoo").rglob("*.py") if "registry" not in p.relative_to(REPO / "zoo").parts)


@pytest.mark.parametrize("module", _engine_modules(), ids=lambda p: p.name)
def test_the_engine_imports_no_kind_and_reads_no_metric_by_name(module):
    """What the engine needs of a kind goes through zoo/stage.py's hooks, never its code or metric names."""
    tree = ast.parse(module.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert not (node.module or "").startswith("zoo_stages"), f"{module.name}:{node.lineno} imports a kind"
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("zoo_stages") for a in node.names), f"{module.name}:{node.lineno}"
        # metrics["gates"], s.metrics.get("published"): a kind's metric read by name
        target = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target = node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and node.args and isinstance(node.args[0], ast.Constant)):
            target = node.func.value
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        assert name != "metrics", f"{module.name}:{node.lineno} reads a metric by name"
