"""The shipped lenet-digits recipe end to end, as a user runs it: run, rerun, repro, pull."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli_helpers import table_rows, zoo as zoo_cli
from conftest import REPO
from zoo.engine.lockfile import LOCK_SCHEMA_VERSION

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    """One cold run of recipes/lenet-digits.yaml in its own folder, cache and zoo."""
    base = tmp_path_factory.mktemp("lenet")
    shutil.copy(REPO / "recipes" / "lenet-digits.yaml", base / "lenet-digits.yaml")
    env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home")}
    cli = zoo_cli("run", base / "lenet-digits.yaml", "--json", env=env)
    assert cli.code == 0, cli.text
    return {"dir": base, "recipe": base / "lenet-digits.yaml", "env": env, "result": json.loads(cli.out)}


def test_cold_run_runs_every_stage_and_passes_its_gates(lenet):
    stages = {s["id"]: s for s in lenet["result"]["stages"]}
    assert list(stages) == ["train", "export", "optimize", "quantize", "verify", "deploy"]
    assert {s["state"] for s in stages.values()} == {"done"}
    assert stages["train"]["metrics"]["val_accuracy"] >= 0.9
    assert stages["verify"]["metrics"]["passed"] is True
    assert stages["deploy"]["effects"] == [{"kind": "published", "ref": "lenet-digits@1.0.0"}]
    lock = (lenet["dir"] / "lenet-digits.lock").read_text()
    assert f"schema_version: {LOCK_SCHEMA_VERSION}" in lock and all(f"  {sid}:" in lock for sid in stages)


def test_second_run_is_fully_cached_and_imports_nothing_heavy(lenet):
    code = ("import sys\nsys.argv = ['zoo', 'run', sys.argv[1]]\nfrom zoo.entry import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('EXIT', e.code)\n"
            "print('HEAVY', [m for m in ('torch', 'onnx', 'onnxruntime') if m in sys.modules])\n")
    proc = subprocess.run([sys.executable, "-c", code, str(lenet["recipe"])], capture_output=True, text=True,
                          env={**os.environ, **lenet["env"]})
    assert "0 ran, 6 cached" in proc.stdout, proc.stdout + proc.stderr
    assert "HEAVY []" in proc.stdout
    # the full path (plan) also decides everything without torch/onnx/onnxruntime
    code_plan = code.replace("'run'", "'plan'")
    proc = subprocess.run([sys.executable, "-c", code_plan, str(lenet["recipe"])], capture_output=True, text=True,
                          env={**os.environ, **lenet["env"]})
    assert "deploy [deploy] ← export, optimize, quantize, verify: cached" in proc.stdout, proc.stdout + proc.stderr
    assert "HEAVY []" in proc.stdout


def test_every_build_is_published_with_vectors_and_card(lenet):
    from zoo.registry.store import LocalZoo

    manifest = LocalZoo(Path(lenet["env"]["ZOO_HOME"])).resolve("lenet-digits@1.0.0")
    assert set(manifest.builds) == {"cpu-fp32", "cpu-int8", "cuda-fp16", "mobile", "openvino-fp32", "openvino-int8",
                                    "tensorrt-fp16"}
    assert manifest.builds["mobile"].format == "ort"
    assert manifest.builds["cuda-fp16"].requires.get("device") == "cuda"
    assert manifest.builds["cpu-int8"].precision == "int8"
    for build in manifest.builds.values():
        assert build.test_vectors, build.name
        assert build.metrics.get("accuracy", 0) >= 0.85, (build.name, build.metrics)
    assert manifest.card is not None and manifest.lineage.recipe["name"] == "lenet-digits"
    assert "latency_p50_ms" in manifest.builds["cpu-int8"].metrics  # measured timings are published


def test_every_build_says_what_runs_it_whether_it_ran_there_and_what_it_was_timed_on(lenet):
    """Issue #16: a portable build in every version, runtimes named, a CUDA build made without a GPU
    marked unverified (with the reason, on the card too), OpenVINO builds run and timed by OpenVINO."""
    import onnxruntime

    from zoo.registry.store import LocalZoo

    zoo = LocalZoo(Path(lenet["env"]["ZOO_HOME"]))
    manifest = zoo.resolve("lenet-digits@1.0.0")
    b = manifest.builds
    assert manifest.schema_version == 3
    assert (b["cpu-fp32"].runtime, b["cpu-fp32"].portable, b["cpu-fp32"].verified) == ("onnx", True, True)
    assert (b["mobile"].format, b["mobile"].runtime, b["mobile"].portable) == ("ort", "onnxruntime>=1.32", False)
    for name in ("openvino-fp32", "openvino-int8"):
        ov = b[name]
        assert (ov.format, ov.runtime, ov.verified, ov.portable) == ("openvino", "openvino>=2026.4", True, False)
        assert {Path(f.path).name for f in [ov.file, *ov.extra_files]} == {"model.xml", "model.bin"}
        assert ov.measured_on["runtime"] == "openvino" and ov.measured_on["threads"] == 1
        assert ov.metrics["latency_p50_ms"] > 0 and ov.metrics["speedup"] > 0  # against verify's reference
        assert ov.metrics["throughput_bs1"] > 0 and ov.metrics["throughput_bs16"] > 0  # verify's batch sizes
    assert b["cpu-fp32"].measured_on["execution_provider"] == "CPUExecutionProvider"
    assert b["cpu-fp32"].measured_on["platform"].startswith(("x86-64", "arm64"))
    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        assert b["cuda-fp16"].verified is False and "not run on a CUDA GPU" in b["cuda-fp16"].unverified_reason
        card = zoo.blobs.path(manifest.card.sha256).read_text()
        assert "**Not verified**" in card and "`cuda-fp16`: not run on a CUDA GPU" in card
    trt = b["tensorrt-fp16"]  # the export's file, for onnxruntime's TensorRT provider with its engine options
    assert (trt.precision, trt.execution_providers[0], trt.requires) == ("fp16", "TensorrtExecutionProvider",
                                                                          {"device": "cuda"})
    assert trt.provider_options["TensorrtExecutionProvider"]["trt_fp16_enable"] == "True"
    assert trt.provider_options["TensorrtExecutionProvider"]["trt_engine_cache_enable"] == "True"
    if "TensorrtExecutionProvider" not in onnxruntime.get_available_providers():
        assert trt.verified is False and "not run with TensorRT" in trt.unverified_reason
        assert not trt.measured_on and "latency_p50_ms" not in trt.metrics  # no timing it was not run for
        card = zoo.blobs.path(manifest.card.sha256).read_text()
        assert "`tensorrt-fp16`: not run with TensorRT" in card and "`trt_fp16_enable=True`" in card
    shown = zoo_cli("show", "lenet-digits", env={**lenet["env"], "COLUMNS": "250"})
    assert shown.code == 0 and "measured on" in shown.out and "openvino 2026.4" in shown.out, shown.text
    if b["cuda-fp16"].verified is False:
        assert "not verified (zoo pull picks them only with --build):\n  cuda-fp16: not run on a CUDA GPU" in shown.out
    assert "provider options:\n  tensorrt-fp16: TensorrtExecutionProvider trt_engine_cache_enable=True" in shown.out
    # the default pull: a build that was verified and runs here, by measured latency
    cli = zoo_cli("pull", "lenet-digits", "--json", env=lenet["env"])
    assert cli.code == 0, cli.text
    chosen = json.loads(cli.out)["build"]
    assert b[chosen].verified is True and b[chosen].metrics.get("latency_p50_ms") == min(
        x.metrics["latency_p50_ms"] for x in b.values() if x.verified and "latency_p50_ms" in x.metrics)


def test_repro_check_is_bit_identical(lenet):
    cli = zoo_cli("repro", lenet["recipe"], "--check", env=lenet["env"], timeout=900)
    assert cli.code == 0, cli.text
    statuses = {r[0]: r[1] for r in table_rows(cli.out)}
    for sid in ("train", "export", "optimize", "quantize", "verify", "deploy"):
        assert statuses[sid] == "identical"


def test_frozen_run_passes_on_an_up_to_date_lock(lenet):
    cli = zoo_cli("run", lenet["recipe"], "--frozen", env=lenet["env"])
    assert cli.code == 0, cli.text


def test_a_forced_rebuild_with_the_same_bytes_leaves_the_lockfile_alone(lenet):
    lock = lenet["dir"] / "lenet-digits.lock"
    before = lock.read_bytes()
    cli = zoo_cli("run", lenet["recipe"], "--force", "export", "--json", env=lenet["env"])
    assert cli.code == 0, cli.text
    stages = {s["id"]: s for s in json.loads(cli.out)["stages"]}
    assert stages["export"]["state"] == "done" and stages["optimize"]["state"] == "cached"
    # export ran again (new timings, same bytes): the lock pins bytes, so it does not change
    assert lock.read_bytes() == before


def test_a_shared_cache_publishes_into_each_machines_own_zoo(lenet, tmp_path):
    from zoo.registry.codec import dump_manifest, same_content
    from zoo.registry.store import LocalZoo

    # another machine: the same (shared) cache, its own local zoo
    other = tmp_path / "other-home"
    env = {**lenet["env"], "ZOO_HOME": str(other)}
    lock_before = (lenet["dir"] / "lenet-digits.lock").read_bytes()
    cli = zoo_cli("run", lenet["recipe"], "--json", env=env)
    assert cli.code == 0, cli.text
    stages = {s["id"]: s for s in json.loads(cli.out)["stages"]}
    assert {s["state"] for s in stages.values()} == {"cached"}
    assert stages["deploy"]["effects"] == [{"kind": "published", "ref": "lenet-digits@1.0.0"}]
    assert (lenet["dir"] / "lenet-digits.lock").read_bytes() == lock_before
    there = LocalZoo(other).resolve("lenet-digits@1.0.0")
    first = LocalZoo(Path(lenet["env"]["ZOO_HOME"])).resolve("lenet-digits@1.0.0")
    assert same_content(there, first)  # the same bytes
    # and the same manifest: the timings verify's cache entry holds travel with it (card included)
    assert "latency_p50_ms" in there.builds["cpu-int8"].metrics
    assert dump_manifest(there.model_copy(update={"created": first.created})) == dump_manifest(first)
    pulled = zoo_cli("pull", "lenet-digits", "--build", "cpu-int8", env=env)
    assert pulled.code == 0 and Path(pulled.out.strip()).is_relative_to(other), pulled.text
    # the zoo is wiped: a cached rerun (the no-op fast path included) must publish again, not just say so
    shutil.rmtree(other)
    for _ in range(2):
        cli = zoo_cli("run", lenet["recipe"], env=env)
        assert cli.code == 0 and "published lenet-digits@1.0.0" in cli.out, cli.text
        assert LocalZoo(other).get("lenet-digits", "1.0.0") is not None
