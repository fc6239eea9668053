"""The engine end to end with test kinds: caching, explanations, failures, parallelism, locks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import zoo
from cli_helpers import RecordingExecutor, table_rows, write_recipe, zoo as zoo_cli
from zoo.engine import lockfile
from zoo.engine.cache import Cache

CHAIN = """\
schema_version: 1
name: chain
version: 0.1.0
stages:
  a:
    kind: writer
    config: {text: "x", repeat: 3}
  b:
    kind: concat
  c:
    kind: concat
    config: {sep: "|"}
  side:
    kind: writer
    needs: []
    config: {text: "side"}
"""


def states(result) -> dict[str, str]:
    return {s.id: s.state for s in result.stages}


def test_run_twice_second_run_executes_nothing(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    first = RecordingExecutor()
    result = zoo.run(recipe, executor=first)
    assert result.ok
    assert sorted(first.submitted) == ["a", "b", "c", "side"]
    assert set(states(result).values()) == {"done"}

    second = RecordingExecutor()
    result = zoo.run(recipe, executor=second)
    assert second.submitted == []  # the executor was never called
    assert set(states(result).values()) == {"cached"}
    assert result.executed == []


def test_outputs_flow_through_the_dag(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    result = zoo.run(recipe)
    cache = Cache(result.cache_dir)
    c = next(s for s in result.stages if s.id == "c")
    entry = cache.lookup(c.key)
    text = cache.output_paths(entry)["data"].read_text()
    assert text == "xxx"  # c concatenates b which concatenates a
    # outputs are hardlinks to cache objects, not copies
    path = cache.output_paths(entry)["data"]
    assert os.stat(path).st_ino == os.stat(cache.object_path(entry.outputs["data"]["digest"])).st_ino


def test_changing_one_config_value_reruns_it_and_dependents_only(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    zoo.run(recipe)
    recipe.write_text(CHAIN.replace('text: "x", repeat: 3', 'text: "z", repeat: 3'))

    status = zoo.status(recipe)
    by_id = {s.id: s for s in status.stages}
    assert by_id["side"].state == "cached"
    assert by_id["a"].state == "will run"
    assert "config changed" in str(by_id["a"].reasons[0]) and "text: x → z" in str(by_id["a"].reasons[0])
    assert "upstream reran" in str(by_id["b"].reasons[0])

    executor = RecordingExecutor()
    result = zoo.run(recipe, executor=executor)
    assert executor.submitted == ["a", "b", "c"]
    by_id = {s.id: s for s in result.stages}
    assert any("input changed" in str(r) for r in by_id["b"].reasons)

    cli = zoo_cli("status", recipe, "--why")
    assert cli.code == 0 and "Everything is up to date" in cli.out


def test_status_why_from_the_cli_names_the_changed_field(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    zoo.run(recipe)
    recipe.write_text(CHAIN.replace("repeat: 3", "repeat: 4"))
    cli = zoo_cli("status", recipe, "--why")
    assert cli.code == 0
    rows = {r[0]: r[1:] for r in table_rows(cli.out)}
    assert rows["stage"] == ["state", "why"]
    assert rows["a"][0] == "will run" and "config changed: repeat: 3 → 4" in rows["a"][1]
    assert rows["b"][0] == "will run" and "upstream reran" in rows["b"][1]
    assert rows["side"] == ["up to date", ""]


def test_identical_upstream_output_keeps_dependents_cached(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    zoo.run(recipe)
    # same output ("xxx") from a different config: a reruns, b and c are hits by content
    recipe.write_text(CHAIN.replace('text: "x", repeat: 3', 'text: "xxx", repeat: 1'))
    executor = RecordingExecutor()
    result = zoo.run(recipe, executor=executor)
    assert executor.submitted == ["a"]
    assert states(result)["b"] == "cached" and states(result)["c"] == "cached"


def test_force_reruns_named_stage(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    zoo.run(recipe)
    executor = RecordingExecutor()
    result = zoo.run(recipe, executor=executor, force=["side"])
    assert executor.submitted == ["side"]
    assert str(next(s for s in result.stages if s.id == "side").reasons[0]) == "forced"


def test_code_change_in_user_file_reruns(tmp_path):
    script = tmp_path / "prepare.txt"
    script.write_text("v1")
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: code
version: 0.1.0
stages:
  s:
    kind: script
    config: {file: prepare.txt}
""")
    zoo.run(recipe)
    script.write_text("v2")
    report = zoo.plan(recipe).stages[0]
    assert report.state == "will run"
    assert "code changed: prepare.txt" in str(report.reasons[0])
    result = zoo.run(recipe)
    assert states(result) == {"s": "done"}


def test_tool_version_change_is_explained(tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path, CHAIN)
    zoo.run(recipe)
    from zoo.engine import keys

    real = keys.tool_versions
    monkeypatch.setattr(keys, "tool_versions", lambda dists: {**real(dists), "zoo-onnx": "9.9.9"})
    report = {s.id: s for s in zoo.plan(recipe).stages}["a"]
    assert "tool version changed: zoo-onnx" in str(report.reasons[0])


def test_cache_policies(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: policies
version: 0.1.0
stages:
  always:
    kind: writer
    cache: recompute
  never:
    kind: writer
    needs: []
    cache: disable
  normal:
    kind: writer
    needs: []
""")
    zoo.run(recipe)
    executor = RecordingExecutor()
    result = zoo.run(recipe, executor=executor)
    assert sorted(executor.submitted) == ["always", "never"]
    assert states(result)["normal"] == "cached"


def test_matrix_expansion_and_fan_in(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: matrix
version: 0.1.0
stages:
  make:
    kind: writer
    matrix: {build: [fp32, int8]}
    config: {text: "${matrix.build}"}
  check:
    kind: concat
    matrix: {build: [fp32, int8]}
  publish:
    kind: concat
    config: {sep: ","}
""")
    dag = zoo.api.load(recipe)
    assert dag.order() == ["make[fp32]", "make[int8]", "check[fp32]", "check[int8]", "publish"]
    assert dag.nodes["check[int8]"].needs == ["make[int8]"]  # same axis value: matched
    assert dag.nodes["publish"].needs == ["check[fp32]", "check[int8]"]  # fan-in
    result = zoo.run(recipe)
    cache = Cache(result.cache_dir)
    publish = next(s for s in result.stages if s.id == "publish")
    assert cache.output_paths(cache.lookup(publish.key))["data"].read_text() == "fp32,int8"


def test_failure_stops_dependents_and_keeps_completed(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: failing
version: 0.1.0
stages:
  good:
    kind: writer
  bad:
    kind: failing
    config: {message: "disk on fire"}
  after:
    kind: concat
""")
    result = zoo.run(recipe)
    assert states(result) == {"good": "done", "bad": "failed", "after": "skipped"}
    assert result.exit_code() == 1
    assert "disk on fire" in result.failed[0].error.message
    # completed results are kept
    assert zoo.plan(recipe).stages[0].state == "cached"

    cli = zoo_cli("run", recipe)
    assert cli.code == 1
    assert "stage bad failed: disk on fire" in cli.err
    assert "about to fail" in cli.err  # the log tail
    assert f"retry with: zoo run {recipe} bad --force" in cli.err


def test_a_first_run_where_nothing_completes_writes_no_lockfile(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: failing
version: 0.1.0
stages:
  bad: {kind: failing, config: {message: "unreachable"}}
""")
    assert zoo.run(recipe).exit_code() == 1
    assert not (tmp_path / "recipe.lock").exists()
    (tmp_path / "recipe.yaml").write_text((tmp_path / "recipe.yaml").read_text().replace(
        "stages:\n", "stages:\n  good: {kind: writer}\n"))
    assert zoo.run(recipe).exit_code() == 1
    assert "good:" in (tmp_path / "recipe.lock").read_text()  # something completed: pinned


def test_gate_failure_prints_the_table(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: gates
version: 0.1.0
stages:
  bad:
    kind: failing
    config: {message: "accuracy gate failed", gate: true}
""")
    cli = zoo_cli("run", recipe)
    assert cli.code == 1
    assert "accuracy 0.5 >= 0.9 FAIL" in cli.err


def test_json_summary(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    cli = zoo_cli("run", recipe, "--json")
    assert cli.code == 0, cli.err
    data = json.loads(cli.out)
    assert data["schema_version"] == 1 and data["ok"] is True
    assert {s["id"]: s["state"] for s in data["stages"]} == {"a": "done", "b": "done", "c": "done", "side": "done"}
    cli = zoo_cli("run", recipe, "--json")
    assert {s["state"] for s in json.loads(cli.out)["stages"]} == {"cached"}


def test_plain_progress_lines_when_not_a_tty(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    cli = zoo_cli("run", recipe)
    assert "[zoo] a: running (new" in cli.out
    assert "[zoo] c: done in" in cli.out
    cli = zoo_cli("run", recipe)
    assert "[zoo] a: cached" in cli.out


def test_parallel_jobs_overlap(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: parallel
version: 0.1.0
stages:
  one:
    kind: sleeper
    config: {seconds: 1.5, marker: one.pid}
  two:
    kind: sleeper
    needs: []
    config: {seconds: 1.5, marker: two.pid}
""")
    result = zoo.run(recipe, jobs=2)
    assert result.ok
    # each ran in its own process at the same time: both markers name different live workers
    pids = {(tmp_path / "one.pid").read_text(), (tmp_path / "two.pid").read_text()}
    assert len(pids) == 2
    one, two = (next(s for s in result.stages if s.id == n) for n in ("one", "two"))
    assert one.started < two.started + two.duration_s and two.started < one.started + one.duration_s


def test_frozen_fails_with_a_diff(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    cli = zoo_cli("run", recipe, "--frozen")
    assert cli.code == 1
    assert "not in the lockfile" in cli.err
    assert zoo_cli("run", recipe).code == 0
    assert zoo_cli("run", recipe, "--frozen").code == 0
    recipe.write_text(CHAIN.replace("repeat: 3", "repeat: 5"))
    cli = zoo_cli("run", recipe, "--frozen")
    assert cli.code == 1
    assert "a: would run (config changed: repeat: 3 → 5)" in cli.err
    assert "executor" not in cli.err
    assert zoo.plan(recipe).stages[0].state == "will run"  # nothing ran


def test_gc_frees_unreferenced_objects(tmp_path):
    recipe = write_recipe(tmp_path, CHAIN)
    zoo.run(recipe)
    recipe.write_text(CHAIN.replace('text: "x"', 'text: "y"'))
    zoo.run(recipe)
    # keep only what the current lock uses: the old a/b/c outputs are freed
    cli = zoo_cli("gc", "--keep", recipe)
    assert cli.code == 0, cli.err
    assert "freed" in cli.out and "3 entries" in cli.out
    assert states(zoo.run(recipe)) == {k: "cached" for k in ("a", "b", "c", "side")}


def test_kill_9_during_a_stage_leaves_no_entry_and_rerun_completes(tmp_path):
    marker = tmp_path / "started.pid"
    recipe = write_recipe(tmp_path, f"""\
schema_version: 1
name: killed
version: 0.1.0
stages:
  first:
    kind: writer
  slow:
    kind: sleeper
    config: {{seconds: 30, marker: {marker}}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "zoo", "run", str(recipe)], env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert time.monotonic() < deadline, "the slow stage never started"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the zoo process and its worker, mid-stage
    proc.wait()
    cache = Cache(Path(os.environ["ZOO_CACHE_DIR"]))
    entries = {e.stage for e in cache.iter_entries()}
    assert entries == {"first"}  # no entry for the interrupted stage
    assert list(cache.tmp.iterdir())  # its half-written workspace is garbage in tmp/

    recipe.write_text(recipe.read_text().replace("seconds: 30", "seconds: 0.1"))
    result = zoo.run(recipe)
    assert states(result) == {"first": "cached", "slow": "done"}
    out = Cache(result.cache_dir).output_paths(Cache(result.cache_dir).lookup(result.stages[1].key))["data"]
    assert out.read_text() == "partial complete"


def test_two_concurrent_runs_on_one_cache(tmp_path):
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: concurrent
version: 0.1.0
stages:
  slow:
    kind: sleeper
    config: {seconds: 2}
  after:
    kind: concat
""")
    procs = [subprocess.Popen([sys.executable, "-m", "zoo", "run", str(recipe), "--json"], env=dict(os.environ),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    runs = [json.loads(out) for out, _ in outs]
    slow_states = sorted(next(s["state"] for s in r["stages"] if s["id"] == "slow") for r in runs)
    assert slow_states == ["cached", "done"]  # computed once, found by the other run
    waiting = next(r for r in runs if next(s for s in r["stages"] if s["id"] == "slow")["state"] == "cached")
    assert "computed by a concurrent run" in " ".join(next(s for s in waiting["stages"] if s["id"] == "slow")["reasons"])
    assert len({r["stages"][1]["outputs"]["data"] for r in runs}) == 1


def test_help_and_plan_import_no_heavy_modules(tmp_path):
    """`--help`, `validate`, `plan` and a cached `run` succeed (exit 0, their usual output) without
    importing torch, onnx, onnxruntime, a cloud store's driver (gcsfs, adlfs) or cyclonedx (the BOM's)."""
    recipe = write_recipe(tmp_path, CHAIN)
    zoo.run(recipe)
    code = (
        "import sys, runpy\n"
        "sys.argv = ['zoo'] + sys.argv[1:]\n"
        "status = 0\n"
        "try:\n    runpy.run_module('zoo', run_name='__main__')\n"
        "except SystemExit as e:\n    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)\n"
        "heavy = [m for m in ('torch', 'onnx', 'onnxruntime', 'gcsfs', 'adlfs', 'cyclonedx') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
        "sys.exit(status)\n"
    )
    expected = {
        "--help": ["Usage:", "validate", "plan", "run"],
        "validate": [f"{recipe}: ok — chain@0.1.0, 4 stages: a, side, b, c"],
        "plan": ["a [writer]: cached", "b [concat] ← a: cached", "c [concat] ← b: cached", "side [writer]: cached"],
        "run": ["chain@0.1.0: 0 ran, 4 cached"],
    }
    for args in (["--help"], ["validate", str(recipe)], ["plan", str(recipe)], ["run", str(recipe)]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=dict(os.environ))
        assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
        for line in expected[args[0]]:
            assert line in proc.stdout, (args, line, proc.stdout)
        assert "HEAVY []" in proc.stderr, (args, proc.stderr)


def _entry_probe(recipe) -> subprocess.CompletedProcess:
    code = ("import sys\nsys.argv = ['zoo', 'run', sys.argv[1]]\nfrom zoo.entry import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('FULL' if 'typer' in sys.modules else 'FAST', file=sys.stderr)\n")
    return subprocess.run([sys.executable, "-c", code, str(recipe)], capture_output=True, text=True, env=dict(os.environ))


def test_noop_fast_path_only_when_nothing_changed(tmp_path):
    script = tmp_path / "prepare.txt"
    script.write_text("v1")
    recipe = write_recipe(tmp_path, """\
schema_version: 1
name: fast
version: 0.1.0
stages:
  s:
    kind: script
    config: {file: prepare.txt}
  t:
    kind: concat
""")
    first = _entry_probe(recipe)
    assert "FULL" in first.stderr and "s: done" in first.stdout
    second = _entry_probe(recipe)
    assert "FAST" in second.stderr, second.stderr
    assert "fast@0.1.0: 0 ran, 2 cached" in second.stdout
    script.write_text("v2")  # user code changed: the stamp no longer holds
    third = _entry_probe(recipe)
    assert "FULL" in third.stderr and "s: done" in third.stdout
    # a deleted cache object also disables the fast path
    cache = Cache(Path(os.environ["ZOO_CACHE_DIR"]))
    assert "FAST" in _entry_probe(recipe).stderr
    for obj in cache.objects.glob("*/*"):
        obj.unlink()
    fourth = _entry_probe(recipe)
    assert "FULL" in fourth.stderr and "s: done" in fourth.stdout


def test_recipe_identity_and_lineage_enter_only_declaring_kinds(tmp_path):
    text = """\
schema_version: 1
name: ident
version: 0.1.0
stages:
  a: {kind: writer}
  b: {kind: concat}
  s: {kind: stamp}
"""
    recipe = write_recipe(tmp_path, text)
    first = zoo.run(recipe)
    cache = Cache(first.cache_dir)
    s = next(x for x in first.stages if x.id == "s")
    stamp = json.loads(cache.output_paths(cache.lookup(s.key))["data"].read_text())
    records_by_id = {x.id: x.record for x in first.stages}
    assert stamp["version"] == "0.1.0"
    # the ancestors' lock records, each the one whose digest the stage's key holds (no key, no code)
    assert {k: lockfile.record_identity(v) for k, v in stamp["lineage"].items()} == {
        "a": records_by_id["a"], "b": records_by_id["b"]}
    assert not any("key" in v or "code" in v for v in stamp["lineage"].values())
    assert stamp["lineage"]["b"]["inputs"] == {"a": {"data": stamp["lineage"]["a"]["outputs"]["data"]}}

    recipe.write_text(text.replace("version: 0.1.0", "version: 0.2.0"))
    plan = {x.id: x for x in zoo.plan(recipe).stages}
    assert plan["a"].state == "cached" and plan["b"].state == "cached"  # a version bump retrains nothing
    assert plan["s"].state == "will run" and "recipe changed: version: 0.1.0 → 0.2.0" in str(plan["s"].reasons[0])

    recipe.write_text(text.replace('a: {kind: writer}', 'a: {kind: writer, config: {text: "other"}}'))
    executor = RecordingExecutor()
    zoo.run(recipe, executor=executor)
    assert executor.submitted == ["a", "b", "s"]


def test_a_cached_stage_redoes_its_effects_outside_the_cache(tmp_path, monkeypatch):
    from zoo.engine import kind_loader
    from zoo.errors import Conflict

    calls = []

    def on_cached(self, outputs, config, context):
        calls.append((context.stage_id, sorted(outputs), outputs["data"].is_file(), context.publish))
        if (tmp_path / "refuse").exists():
            raise Conflict("the effect is refused", hint="remove the refusal")
        context.metrics["effect"] = "redone"

    monkeypatch.setattr(kind_loader.get("writer"), "on_cached", on_cached)
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: c\nversion: 0.1.0\nstages:\n  a: {kind: writer}\n")
    first = zoo.run(recipe)
    assert states(first) == {"a": "done"} and calls == []  # a stage that runs does its effects in run()
    executor = RecordingExecutor()
    second = zoo.run(recipe, executor=executor)
    assert states(second) == {"a": "cached"} and executor.submitted == []
    assert calls == [("a", ["data"], True, True)]
    assert second.stages[0].metrics["effect"] == "redone"
    assert "effect" not in Cache(second.cache_dir).lookup(second.stages[0].key).metrics  # reported, not cached
    # zoo repro rebuilds without side effects: never called
    zoo.run(recipe, record=False)
    assert len(calls) == 1
    # a refused effect fails the stage with the kind's error, so the run does not claim it
    (tmp_path / "refuse").write_text("")
    third = zoo.run(recipe)
    assert states(third) == {"a": "failed"} and not third.ok
    assert third.stages[0].error.type == "Conflict" and third.stages[0].error.hint == "remove the refusal"


class OtherMachineExecutor:
    """Runs each stage in this process as a worker whose onnx is another version than the planner's."""

    def submit(self, task):
        from concurrent.futures import Future

        from zoo.engine import keys, worker

        real = keys.tool_version
        keys.tool_version = lambda dist: "0.0-other" if dist == "onnx" else real(dist)
        future = Future()
        try:
            future.set_result(worker.execute(task))
        finally:
            keys.tool_version = real
        return future

    def shutdown(self):
        pass


def test_outputs_of_a_worker_with_other_tool_versions_are_not_cached(tmp_path, monkeypatch):
    from zoo.engine import kind_loader

    monkeypatch.setattr(kind_loader.get("writer"), "tools", ("onnx",))
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: c\nversion: 0.1.0\nstages:\n  a: {kind: writer}\n")
    result = zoo.run(recipe, executor=OtherMachineExecutor())
    assert states(result) == {"a": "failed"}
    error = result.stages[0].error
    assert error.type == "WorkerMismatch" and "onnx is 0.0-other" in error.message, error
    assert "constraints.txt" in error.hint
    assert not list(Cache(result.cache_dir).root.glob("entries/**/*.json"))  # nothing cached under the key
    # the same worker code with the planner's versions agrees, and caches
    assert states(zoo.run(recipe)) == {"a": "done"}
    assert list(Cache(result.cache_dir).root.glob("entries/**/*.json"))


def test_environment_mismatch_names_each_difference():
    from zoo.engine.worker import environment_mismatch

    parts = {"tools": {"onnx": "1.23.0", "zoo-onnx": "0.1.0"}, "code": {"kind:m": "aa", "file:data.csv": "bb"}}
    assert environment_mismatch(parts, None) == ""
    assert environment_mismatch(parts, {"tools": dict(parts["tools"]), "code": {"kind:m": "aa"}}) == ""
    seen = {"tools": {"onnx": "1.22.0", "zoo-onnx": "0.1.0"}, "code": {"kind:m": "cc"}}
    assert environment_mismatch(parts, seen) == "onnx is 1.22.0 (here: 1.23.0); the code of m differs"


def test_worker_sees_the_config_the_recipe_gave(tmp_path):
    # validators that look at which options were given must not see filled-in defaults
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: p\nversion: 0.1.0\nstages:\n"
                                    "  a: {kind: picky, config: {mode: b}}\n")
    result = zoo.run(recipe)
    assert result.ok, result.stages[0].error
    bad = write_recipe(tmp_path, "schema_version: 1\nname: p\nversion: 0.1.0\nstages:\n"
                                 "  a: {kind: picky, config: {mode: b, option: 2}}\n", name="bad.yaml")
    cli = zoo_cli("validate", bad)
    assert cli.code == 2 and "option does not apply to mode: b" in cli.err
