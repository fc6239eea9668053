"""Lockfiles per platform class (zoo/host.py `platform_class`, zoo/engine/lockfile.py, zoo/engine/frozen.py,
zoo/release/repro.py): records are filed under the class of the machine that built the bytes; a
second class adds its records without touching the first's; a cache shared between classes
never files one class's bytes under another; `--frozen` and `zoo release` on an empty cache build
what they must and refuse only a result that differs, naming its digests; `zoo repro --check` on
a class without records judges numerical equivalence with another class's record and says so.

Two classes on one machine need a stand-in: `StandInMachine` runs each stage in this process
with `zoo.host.describe` patched to report a stand-in CPU (tests named `stand_in_cpu`), so the
worker's recorded host, the planner's "this platform" and the `kernels` test kind (whose floats
move with the class, as torch's and onnxruntime's do) all see that CPU. The real detection is
not patched anywhere else: the tests without `stand_in_cpu` in their name run on this machine's
real class through the real CLI.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import Future

import pytest
import yaml

import zoo
from cli_helpers import write_recipe, zoo as zoo_cli
from test_kind_hooks import SHIPPED  # a writer, an inspector with a gate, a shipper that publishes
from zoo import host
from zoo.engine import lockfile, pipeline
from zoo.errors import LockOutOfDate
from zoo.release import repro

AVX512 = {"machine": "x86_64", "cpu": "stand-in AVX-512 VNNI", "features": [
    "avx", "avx2", "avx512_vnni", "avx512bw", "avx512f", "avx512vl", "f16c", "fma", "sse4_1"]}
ARM = {"machine": "aarch64", "cpu": "stand-in Neoverse N1", "features": ["asimd", "asimddp"]}
A, B = "x86-64-avx512-vnni", "arm64-dotprod"

KERNELS = """\
schema_version: 1
name: kern
version: 0.1.0
stages:
  src: {kind: writer, config: {text: "seed"}}
  k: {kind: kernels, needs: [src]}
  side: {kind: writer, needs: [], config: {text: "side"}}
"""


class StandInMachine:
    """Executor that runs each stage in this process, as a worker on the stand-in CPU the test
    patched into `zoo.host.describe` would (the stage's recorded host is that CPU)."""

    def submit(self, task):
        from zoo.engine import worker

        future = Future()
        future.set_result(worker.execute(task))
        return future

    def shutdown(self):
        pass


@pytest.fixture
def machine(monkeypatch):
    """`machine(cpu)`: from now on this process is a machine with the stand-in `cpu`."""
    def become(cpu):
        monkeypatch.setattr(host, "describe", lambda: dict(cpu))
        monkeypatch.setattr(pipeline, "make_executor", lambda spec, jobs: StandInMachine())
        assert host.platform_class() == (A if cpu is AVX512 else B)
    return become


def _caches(tmp_path):
    return tmp_path / "cache-a", tmp_path / "cache-b"


def _platforms(lock_path):
    return yaml.safe_load(lock_path.read_text())["platforms"]


# --- the platform class -----------------------------------------------------------------------

@pytest.mark.parametrize("machine_name, features, expected", [
    ("x86_64", ["sse4_1", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "amx_int8"],
     "x86-64-amx"),
    ("x86_64", ["sse4_1", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"],
     "x86-64-avx512-vnni"),
    ("x86_64", ["sse4_1", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl"], "x86-64-avx512"),
    ("x86_64", ["sse4_1", "avx", "avx2", "fma", "avx512f"], "x86-64-avx2"),  # no BW/VL: not ATen's AVX-512
    ("x86_64", ["sse4_1", "avx", "avx2", "fma", "avx_vnni"], "x86-64-avx2-vnni"),
    ("x86_64", ["sse4_1", "avx", "avx2", "fma"], "x86-64-avx2"),
    ("AMD64", ["sse4_1", "avx", "avx2"], "x86-64"),  # AVX2 without FMA: baseline kernels
    ("x86_64", ["sse4_1"], "x86-64"),
    ("aarch64", ["asimd", "asimddp", "i8mm", "sve"], "arm64-sve"),
    ("arm64", ["asimd", "asimddp", "i8mm"], "arm64-i8mm"),
    ("aarch64", ["asimd", "asimddp"], "arm64-dotprod"),
    ("aarch64", ["asimd"], "arm64"),
    ("arm64", [], "arm64-unknown"),  # no /proc/cpuinfo (macOS): features unknown, not absent
    ("ppc64le", ["altivec"], "ppc64le"),
    ("", [], "unknown"),
])
def test_platform_class_is_the_kernel_tier_of_a_described_host(machine_name, features, expected):
    assert host.platform_class({"machine": machine_name, "cpu": "any name", "features": features}) == expected


def test_platform_class_of_this_host_is_that_of_its_description():
    # the real detection: this machine's class follows from its own describe() record
    assert host.platform_class() == host.platform_class(host.describe()) != host.UNKNOWN_PLATFORM
    assert host.platform_class({}) == host.UNKNOWN_PLATFORM  # an entry that records no host


# --- --frozen on an empty cache (this machine's real class, through the CLI) --------------------

DETERMINISTIC = """\
schema_version: 1
name: det
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "x", repeat: 3}}
  b: {kind: concat}
"""


def test_frozen_on_an_empty_cache_builds_everything_and_passes(tmp_path):
    recipe = write_recipe(tmp_path, DETERMINISTIC)
    assert zoo_cli("run", recipe, env={"ZOO_CACHE_DIR": str(tmp_path / "first")}).code == 0
    lock = recipe.with_suffix(".lock")
    before = lock.read_bytes()
    assert list(_platforms(lock)) == [host.platform_class()]
    cli = zoo_cli("run", recipe, "--frozen", env={"ZOO_CACHE_DIR": str(tmp_path / "empty")})
    assert cli.code == 0, cli.text
    assert "2 ran, 0 cached" in cli.out
    assert lock.read_bytes() == before


def test_frozen_on_an_empty_cache_refuses_a_result_that_differs_naming_its_digests(tmp_path):
    recipe = write_recipe(tmp_path, "schema_version: 1\nname: n\nversion: 0.1.0\nstages:\n"
                                    "  n: {kind: noisy}\n  after: {kind: writer, needs: [n]}\n")
    assert zoo_cli("run", recipe, env={"ZOO_CACHE_DIR": str(tmp_path / "first")}).code == 0
    lock = recipe.with_suffix(".lock")
    before = lock.read_bytes()
    here = host.platform_class()
    locked = _platforms(lock)[here]["n"]["outputs"]["data"]
    cli = zoo_cli("run", recipe, "--frozen", "--json", env={"ZOO_CACHE_DIR": str(tmp_path / "empty")})
    assert cli.code == 1 and cli.err == "", cli.text  # --json: the error is the document
    message = json.loads(cli.out)["error"]["message"]
    built = [line.split("built ")[1].split(",")[0] for line in message.splitlines() if "output 'data'" in line]
    assert len(built) == 1 and len(built[0]) == len(locked) and built[0] != locked
    assert (f"~ n: outputs differ from the lockfile's {here} record:\n"
            f"    output 'data': built {built[0]}, locked {locked}") in message
    assert "ran before the difference was found, kept in the cache: n" in message
    assert lock.read_bytes() == before
    # the run stopped at the difference: the dependent never ran
    assert not [p for p in (tmp_path / "empty" / "entries").rglob("*.json")
                if yaml.safe_load(p.read_text())["stage"] == "after"]


def test_frozen_on_an_empty_cache_checks_a_stage_whose_key_becomes_known_before_it_runs(tmp_path):
    text = ("schema_version: 1\nname: c\nversion: 0.1.0\nstages:\n  a: {kind: writer}\n"
            "  b: {kind: writer, needs: [a], config: {text: \"old\"}}\n")
    recipe = write_recipe(tmp_path, text)
    assert zoo.run(recipe, cache_dir=tmp_path / "first").ok
    recipe.write_text(text.replace('"old"', '"new"'))
    with pytest.raises(LockOutOfDate) as e:
        zoo.run(recipe, cache_dir=tmp_path / "empty", frozen=True)
    # b's key needed a's output: known only once a ran (and matched); b itself never ran
    assert "~ b: would run (config changed: text: old → new)" in e.value.message
    assert "~ a" not in e.value.message and "kept in the cache: a)" in e.value.message
    result = zoo.plan(recipe, cache_dir=tmp_path / "empty")
    assert {s.id: s.state for s in result.stages} == {"a": "cached", "b": "will run"}


def test_frozen_refuses_before_running_what_no_record_of_this_class_can_match(tmp_path, monkeypatch):
    """A lock whose only records are of another class (a stand-in name: the records' class is
    rewritten in the file, this machine's detection is real): nothing runs, and the refusal says
    which classes the lock has."""
    recipe = write_recipe(tmp_path, DETERMINISTIC)
    assert zoo.run(recipe, cache_dir=tmp_path / "first").ok
    lock = recipe.with_suffix(".lock")
    data = yaml.safe_load(lock.read_text())
    data["platforms"] = {"ppc64le": data["platforms"][host.platform_class()]}
    lock.write_text(yaml.safe_dump(data))
    with pytest.raises(LockOutOfDate) as e:
        zoo.run(recipe, cache_dir=tmp_path / "empty", frozen=True)
    assert (f"+ a: not in the lockfile for platform {host.platform_class()} (it would be built here; "
            "the lockfile has records for ppc64le)") in e.value.message
    assert not (tmp_path / "empty" / "entries").exists() or not list((tmp_path / "empty" / "entries").rglob("*.json"))


def test_a_flat_lock_of_an_older_zoo_is_read_by_its_hosts_class_and_unknown_records_are_not_trusted(tmp_path):
    recipe = write_recipe(tmp_path, DETERMINISTIC)
    assert zoo.run(recipe).ok
    lock = recipe.with_suffix(".lock")
    records = yaml.safe_load(lock.read_text())["platforms"][host.platform_class()]
    flat = {"schema_version": 2, "recipe": yaml.safe_load(lock.read_text())["recipe"], "stages": records}
    lock.write_text(yaml.safe_dump(flat))
    assert zoo.run(recipe, frozen=True).ok  # records with this host: this class's
    for record in flat["stages"].values():
        del record["host"]  # written before hosts were recorded: whose bytes, nobody knows
    lock.write_text(yaml.safe_dump(flat))
    with pytest.raises(LockOutOfDate, match=rf"\+ a: not in the lockfile for platform {host.platform_class()} "
                                            rf"\(built on {host.platform_class()}; the lockfile has records for unknown\)"):
        zoo.run(recipe, frozen=True)
    assert zoo.run(recipe).ok  # a plain run adds this class's records beside the unknown ones
    assert set(_platforms(lock)) == {host.UNKNOWN_PLATFORM, host.platform_class()}


# --- two classes (stand-in CPUs) -------------------------------------------------------------

def test_stand_in_cpu_a_second_class_adds_its_records_without_touching_the_first(tmp_path, machine):
    cache_a, cache_b = _caches(tmp_path)
    recipe = write_recipe(tmp_path, KERNELS)
    lock = recipe.with_suffix(".lock")
    machine(AVX512)
    assert zoo.run(recipe, cache_dir=cache_a).ok
    first = _platforms(lock)
    assert list(first) == [A] and set(first[A]) == {"src", "k", "side"}
    assert all(r["host"] == AVX512 for r in first[A].values())
    machine(ARM)
    result = zoo.run(recipe, cache_dir=cache_b)
    assert result.ok and result.lock_changed
    both = _platforms(lock)
    assert both[A] == first[A]  # the first class's records, untouched
    assert set(both[B]) == {"src", "k", "side"} and all(r["host"] == ARM for r in both[B].values())
    # platform-independent stages: the same key and bytes on both; the float stage: other bytes
    assert both[B]["src"]["outputs"] == both[A]["src"]["outputs"]
    same_record = {f: both[B]["k"][f] for f in ("config", "inputs", "tools", "kind_version")}
    assert same_record == {f: both[A]["k"][f] for f in same_record} and both[B]["k"]["outputs"] != both[A]["k"]["outputs"]
    # the recipe runs clean on each class whose records it carries, from its cache or an empty one
    text = lock.read_bytes()
    for cpu, cache in ((AVX512, cache_a), (ARM, cache_b), (AVX512, tmp_path / "empty-a"),
                       (ARM, tmp_path / "empty-b")):
        machine(cpu)
        assert zoo.run(recipe, cache_dir=cache, frozen=True).ok
        again = zoo.run(recipe, cache_dir=cache)
        assert again.ok and not again.lock_changed
    assert lock.read_bytes() == text


def test_stand_in_cpu_a_cache_shared_between_classes_files_records_under_their_builder(tmp_path, machine):
    shared = tmp_path / "shared"
    recipe = write_recipe(tmp_path, KERNELS)
    lock = recipe.with_suffix(".lock")
    machine(AVX512)
    assert zoo.run(recipe, cache_dir=shared).ok
    first = lock.read_bytes()
    machine(ARM)  # another class, the same cache: every stage is a hit on bytes the AVX-512 machine built
    result = zoo.run(recipe, cache_dir=shared)
    assert result.ok and result.executed == [] and not result.lock_changed
    assert {s.built_on for s in result.stages} == {A}
    assert lock.read_bytes() == first and B not in _platforms(lock)  # no ARM record describes x86 bytes
    assert zoo.run(recipe, cache_dir=shared, frozen=True).ok  # compared with the builder's records
    # with the float stage rebuilt here (forced), its record goes under this class, and only it
    assert zoo.run(recipe, cache_dir=shared, force=["k"]).ok
    platforms = _platforms(lock)
    assert set(platforms[B]) == {"k"} and platforms[A] == yaml.safe_load(first.decode())["platforms"][A]


def test_stand_in_cpu_frozen_on_a_new_class_refuses_naming_the_missing_records(tmp_path, machine):
    recipe = write_recipe(tmp_path, KERNELS)
    lock = recipe.with_suffix(".lock")
    machine(AVX512)
    assert zoo.run(recipe, cache_dir=tmp_path / "a").ok
    before = lock.read_bytes()
    machine(ARM)
    with pytest.raises(LockOutOfDate) as e:
        zoo.run(recipe, cache_dir=tmp_path / "b", frozen=True)
    assert (f"+ src: not in the lockfile for platform {B} (it would be built here; the lockfile has records "
            f"for {A})") in e.value.message
    assert "ran before" not in e.value.message  # refused before anything ran
    assert lock.read_bytes() == before


# --- repro --check across classes -----------------------------------------------------------

def test_stand_in_cpu_repro_on_another_class_reports_numerical_equivalence(tmp_path, machine):
    shared = tmp_path / "shared"  # holds the AVX-512 machine's outputs, as a shared or remote cache does
    recipe = write_recipe(tmp_path, KERNELS)
    machine(AVX512)
    assert zoo.run(recipe, cache_dir=shared).ok
    assert repro.check(recipe, cache_dir=shared).bit_identical  # on its own class: bit for bit
    machine(ARM)
    report = repro.check(recipe, cache_dir=shared)
    checks = {s.id: s for s in report.stages}
    assert report.ok and not report.bit_identical
    assert checks["src"].status == "identical" and checks["src"].details == [
        f"no {B} record; bit-identical to the {A} record"]
    k = checks["k"]
    assert k.status == "equivalent", k.details
    assert k.details[0] == (f"rebuilt on {B}, which has no record: compared with the {A} record for equivalence "
                            "(other CPU kernels round floats differently, so bytes cannot match)")
    # k was rebuilt from the A record's output of src (identical here anyway), taken from the cache
    assert k.details[1] == f"rebuilt from the {A} record's upstream outputs (src), from the cache"
    assert any(d.startswith("data/values.npy: equivalent arrays within <= 0.0001 + 0.001*|ref|")
               for d in k.details), k.details
    assert not any("labels.npy" in d for d in k.details)  # identical bytes need no comparison
    cli_text = "\n".join(k.details)
    assert "max-abs" in cli_text


def test_stand_in_cpu_repro_on_another_class_fails_outside_the_tolerance_or_without_the_locked_bytes(tmp_path, machine):
    shared = tmp_path / "shared"
    recipe = write_recipe(tmp_path, KERNELS.replace("kind: kernels,", "kind: kernels, config: {drift: 0.5},"))
    machine(AVX512)
    assert zoo.run(recipe, cache_dir=shared).ok
    machine(ARM)
    report = repro.check(recipe, cache_dir=shared)
    k = {s.id: s for s in report.stages}["k"]
    assert not report.ok and k.status == "differs"
    assert any(d.startswith("data/values.npy: not equivalent: array outside") for d in k.details), k.details
    # a cache without the other class's outputs cannot show equivalence: it says so, and fails
    shutil.rmtree(shared)
    report = repro.check(recipe, cache_dir=tmp_path / "fresh")
    k = {s.id: s for s in report.stages}["k"]
    assert k.status == "differs" and any("outputs are not in this cache" in d for d in k.details), k.details


def test_stand_in_cpu_repro_cli_says_equivalent_not_bit_identical(tmp_path, machine):
    from typer.testing import CliRunner

    from zoo.cli.main import app

    shared = tmp_path / "shared"
    recipe = write_recipe(tmp_path, KERNELS)
    machine(AVX512)
    assert zoo.run(recipe, cache_dir=shared).ok
    machine(ARM)
    out = CliRunner().invoke(app, ["repro", str(recipe), "--check", "--cache-dir", str(shared)])
    assert out.exit_code == 0, out.output
    assert "or equivalent (same outputs within tolerance, or held-out quality) where this platform class has no " \
           "record" in out.output
    assert "bit-identical to the lockfile" not in out.output


# --- release on an empty cache --------------------------------------------------------------

def test_release_on_an_empty_cache_builds_and_releases_under_the_lock(tmp_path):
    from zoo.registry import api as registry
    from zoo.release.ship import release

    recipe = write_recipe(tmp_path, SHIPPED)
    registry.remote_add("site", str(tmp_path / "site"))
    assert zoo.run(recipe, cache_dir=tmp_path / "first").ok
    lock = recipe.with_suffix(".lock").read_bytes()
    result = release(recipe, version="0.1.0", to="site", cache_dir=tmp_path / "empty")
    assert result.executed == ["a", "check", "ship"] and result.created and not result.lock_changed
    assert recipe.with_suffix(".lock").read_bytes() == lock


def test_release_on_an_empty_cache_refuses_a_build_that_differs_and_publishes_nothing(tmp_path):
    from zoo.registry import api as registry
    from zoo.registry.store import LocalZoo
    from zoo.release.ship import release

    recipe = write_recipe(tmp_path, SHIPPED.replace('a: {kind: writer, config: {text: "payload"}}',
                                                    "a: {kind: noisy, config: {text: true}}"))
    registry.remote_add("site", str(tmp_path / "site"))
    assert zoo.run(recipe, cache_dir=tmp_path / "first").ok
    assert zoo_cli("rm", "shipped@0.1.0").code == 0
    with pytest.raises(LockOutOfDate) as e:
        release(recipe, version="0.1.0", to="site", cache_dir=tmp_path / "empty")
    assert "~ a: outputs differ from the lockfile's" in e.value.message and "output 'data': built " in e.value.message
    assert e.value.message.endswith("nothing was released")
    assert LocalZoo().get("shipped", "0.1.0") is None  # the run stopped before the shipper
    assert lockfile.read(recipe.with_suffix(".lock")) is not None


def test_frozen_run_whose_publishing_stage_differs_from_the_lock_publishes_nothing(tmp_path):
    """The publishing stage's own output differs from its record (same key): the guard refuses the
    run after it, and the engine publishes only what the lock still pins (zoo/engine/publish.py), so
    the local zoo is left without a version the lockfile does not describe."""
    from zoo.registry.store import LocalZoo

    recipe = write_recipe(tmp_path, SHIPPED)
    assert zoo.run(recipe, cache_dir=tmp_path / "first").ok
    assert zoo_cli("rm", "shipped@0.1.0").code == 0
    lock_path = recipe.with_suffix(".lock")
    lock = lockfile.read(lock_path)
    [platform] = lock.platforms
    locked = lock.platforms[platform]["ship"].outputs["release"]
    lock.platforms[platform]["ship"].outputs["release"] = "0" * len(locked)
    lockfile.write(lock_path, lock)
    with pytest.raises(LockOutOfDate) as e:
        zoo.run(recipe, cache_dir=tmp_path / "empty", frozen=True)
    assert f"output 'release': built {locked}, locked {'0' * len(locked)}" in e.value.message
    assert LocalZoo().get("shipped", "0.1.0") is None
    # the same run with the true record publishes (the check is what held it back)
    lock.platforms[platform]["ship"].outputs["release"] = locked
    lockfile.write(lock_path, lock)
    assert zoo.run(recipe, cache_dir=tmp_path / "empty2", frozen=True).ok
    assert LocalZoo().get("shipped", "0.1.0") is not None

