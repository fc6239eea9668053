"""Cold export → optimize → quantize of AlexNet-224: zoo side by side with Olive (prints figures).

Olive runs the peer configuration in /work/shared/peers/olive/ (OnnxConversion opset 17 →
OnnxPeepholeOptimizer → OnnxDynamicQuantization) from a temporary venv, never the project's.
zoo runs a temporary recipe with the same passes on the same ``alexnet.pt`` state dict
(export ``weights: {path, sha256}``, opset 17, dynamic batch → optimize ``level: basic`` →
quantize ``mode: dynamic``: the like-for-like row), plus a second row with static QDQ
quantization (calibrated on digits at 3x224x224), which Olive's config does not do.

Every run is cold: Olive gets a fresh folder (its cache and output dirs are relative to it),
zoo a fresh ZOO_CACHE_DIR/ZOO_HOME. The runs alternate, and their order rotates every round
(Olive, zoo dynamic, zoo static; then zoo dynamic, zoo static, Olive; …), so machine load and
the cost of the previous run's freed memory fall on all rows alike. Printed: median/min/max wall time, the ratio to
Olive (goal: zoo ≤ 0.5× Olive), per-stage/pass medians, and import overheads.

    .venv/bin/python bench/bench_olive.py [--repeat 5] [--olive-venv DIR] [--skip-static]
                                          [--skip-olive] [--profile]

--olive-venv DIR reuses (or creates, and keeps) a venv with Olive; without it a temporary one is
created (pip install olive-ai onnx onnxruntime requests torch==2.13.0, about 1 minute, 1.5 GB)
and removed at the end. --profile adds one in-process cProfile run of the zoo dynamic recipe.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.dont_write_bytecode = True  # no __pycache__ next to the bench scripts
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quantize import load_average, output_path, run_zoo, stage_errors, table  # noqa: E402

from zoo.files import sha256_file  # noqa: E402

PEERS = Path("/work/shared/peers/olive")
OLIVE_PACKAGES = ["olive-ai", "onnx", "onnxruntime", "requests", "torch==2.13.0"]
RATIO_GOAL = 0.5  # zoo's cold wall time at most this share of Olive's


def ensure_olive_venv(venv: Path) -> Path:
    """The `olive` executable of `venv`, creating the venv (and installing Olive) if needed."""
    olive = venv / "bin" / "olive"
    if not olive.exists():
        print(f"creating a venv with Olive at {venv} (pip install {' '.join(OLIVE_PACKAGES)}) …", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *OLIVE_PACKAGES], check=True)
    return olive


def link(src: Path, dest: Path) -> None:
    """A hard link (no 233 MB copy per run), or a copy across filesystems."""
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)


def zoo_recipe(weights: Path, sha: str, static: bool) -> str:
    quantize = ("      mode: static\n      format: qdq\n      calibration: {samples: 64, method: minmax}\n"
                if static else "      mode: dynamic\n")
    data = ("# digits resized to 3x224x224: calibration images and quantize's accuracy check\n"
            "data: {source: digits, image_size: 224, channels: 3, val_fraction: 0.2, split_seed: 0, limit: 400}\n"
            if static else "")
    return f"""\
schema_version: 1
name: bench-olive-alexnet224
version: 0.0.1
description: AlexNet-224, export → optimize → quantize, as Olive's peer config (bench/bench_olive.py)
model: {{arch: alexnet, num_classes: 1000}}
{data}stages:
  export:
    config:
      opset: 17
      dynamic_batch: true
      input_shape: [3, 224, 224]
      weights: {{path: {weights}, sha256: {sha}}}
  optimize:
    config: {{level: basic}}      # standard ONNX ops only, like Olive's peephole optimizer
  quantize:
    config:
{quantize}"""


def run_olive(olive: Path, work: Path, i: int, weights: Path) -> dict[str, Any]:
    """One cold Olive run in a fresh folder; wall time and per-pass durations from its run history."""
    folder = work / f"olive-{i}"
    folder.mkdir()
    for name in ("model.py", "alexnet.yaml"):
        shutil.copyfile(PEERS / name, folder / name)
    link(weights, folder / "alexnet.pt")
    env = dict(os.environ, CI="1")  # without CI=1 Olive's telemetry stalls each run 7-17 s offline
    start = time.perf_counter()
    proc = subprocess.run([str(olive), "run", "--config", "alexnet.yaml"], cwd=folder, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    model = folder / "out" / "model.onnx"
    if proc.returncode != 0 or not model.exists():
        raise SystemExit(f"olive run failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    history = (folder / "out" / "run_history.txt").read_text() if (folder / "out" / "run_history.txt").exists() else ""
    passes = {name: float(sec) for name, sec in re.findall(r"from_pass='(\w+)', duration_sec=([0-9.]+)", history)}
    ops = op_counts(model)
    return {"wall": wall, "stages": passes, "ops": ops, "folder": folder}


def run_zoo_cold(work: Path, i: int, weights: Path, sha: str, static: bool) -> dict[str, Any]:
    folder = work / f"zoo-{'static' if static else 'dynamic'}-{i}"
    folder.mkdir()
    recipe = folder / "bench.yaml"
    recipe.write_text(zoo_recipe(weights, sha, static))
    summary, wall = run_zoo(recipe, folder / "cache", folder / "home", check=False)
    result = {"wall": wall, "stages": {s["id"]: s["duration_s"] for s in summary["stages"]}, "ok": summary["ok"],
              "error": "" if summary["ok"] else stage_errors(summary), "folder": folder}
    if summary["ok"]:
        result["ops"] = op_counts(output_path(summary, "quantize"))
        m = next(s for s in summary["stages"] if s["id"] == "quantize")["metrics"]
        result["speedup"] = m.get("speedup")
    return result


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))


def import_time(python: Path, modules: str, repeat: int = 3) -> float:
    """Median wall time of a fresh interpreter importing `modules`."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([str(python), "-c", f"import {modules}"], check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_zoo(work: Path, weights: Path, sha: str, top: int = 18) -> None:
    """One cold zoo run in this process under cProfile (stages inline): the hot spots, cumulative seconds."""
    import cProfile
    import pstats
    from concurrent.futures import Future

    from zoo import api
    from zoo.engine.worker import execute

    class Inline:
        def submit(self, task):
            future: Future = Future()
            future.set_result(execute(task))
            return future

        def shutdown(self):
            pass

    folder = work / "zoo-profile"
    folder.mkdir()
    recipe = folder / "bench.yaml"
    recipe.write_text(zoo_recipe(weights, sha, static=False))
    os.environ["ZOO_HOME"] = str(folder / "home")
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    result = api.run(recipe, cache_dir=folder / "cache", executor=Inline())
    profiler.disable()
    wall = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats  # (file, line, func) -> (cc, nc, tottime, cumtime, callers)
    print(f"\nzoo dynamic, in-process profile: {wall:.1f} s "
          f"({', '.join(f'{s.id} {s.duration_s:.1f} s' + ('' if s.state != 'failed' else ' FAILED') for s in result.stages)})")
    spots = {
        "protobuf SerializeToString (model bytes, checker, saves)": ("tot", "SerializeToString"),
        "protobuf ParseFromString (model loads)": ("tot", "ParseFromString"),
        "protobuf ByteSize (2 GB limit checks)": ("tot", "ByteSize"),
        "onnxruntime session creation": ("cum", "_create_inference_session"),
        "onnxruntime inference (parity, latency)": ("tot", "onnxruntime_pybind11_state.run"),
        "torch.onnx.export": ("cum", "torch/onnx/__init__.py:export"),
        "onnx.checker.check_model": ("cum", "onnx/checker.py:check_model"),
        "onnx.shape_inference.infer_shapes": ("cum", "onnx/shape_inference.py:infer_shapes"),
        "onnxruntime quantize_dynamic": ("cum", "quantize.py:quantize_dynamic"),
        "file writes": ("tot", "'write' of '_io.BufferedWriter'"),
        "imports (torch, onnx, onnxruntime…)": ("cum", "_find_and_load"),
    }
    rows = []
    for label, (kind, needle) in spots.items():
        total = 0.0
        for (file, line, func), (_, _, tt, ct, _) in stats.items():
            name = f"{file}:{func}" if not file.startswith("~") else func
            if needle in name or needle in f"{file}:{line}({func})":
                total = max(total, ct) if kind == "cum" else total + tt
        rows.append([label, f"{total:.2f}"])
    print("hot spots (seconds; they overlap, e.g. the checker serialises the model):")
    print(table(["where", "s"], rows))
    ranked = sorted(stats.items(), key=lambda kv: kv[1][3], reverse=True)
    print(f"top {top} by cumulative time inside the stages:")
    shown = 0
    for (file, line, func), (_, _, tt, ct, _) in ranked:
        if "/zoo_stages/" in file:
            print(f"  {ct:7.2f} s  {Path(file).name}:{line}({func})")
            shown += 1
            if shown >= top:
                break


def summarise(label: str, runs: list[dict[str, Any]], olive_median: float | None) -> list[Any]:
    walls = [r["wall"] for r in runs]
    med = statistics.median(walls)
    ratio = f"{med / olive_median:.2f}" if olive_median else "n/a"
    if not all(r.get("ok", True) for r in runs):
        ratio = "n/a"  # a failed run stops early: its time is no figure for the whole pipeline
    return [label, f"{med:.2f}", f"{min(walls):.2f}", f"{max(walls):.2f}", len(walls), ratio]


def stage_medians(runs: list[dict[str, Any]]) -> str:
    names = list(runs[0]["stages"])
    parts = [f"{n} {statistics.median(r['stages'].get(n, 0.0) for r in runs):.2f}" for n in names]
    rest = statistics.median(r["wall"] - sum(r["stages"].values()) for r in runs)
    return ", ".join(parts) + f"; outside stages {rest:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="cold runs per row (default 5)")
    parser.add_argument("--olive-venv", type=Path, default=None,
                        help="reuse (or create and keep) this venv with Olive (default: a new temporary one)")
    parser.add_argument("--skip-olive", action="store_true", help="zoo rows only (no Olive venv needed)")
    parser.add_argument("--skip-static", action="store_true", help="no zoo static QDQ row")
    parser.add_argument("--profile", action="store_true", help="also profile one zoo dynamic run in-process")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (printed)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="zoo-bench-olive-"))
    print(f"bench_olive: {time.strftime('%Y-%m-%d %H:%M')}, load average {load_average()}, work dir {work}", flush=True)
    try:
        olive = None
        if not args.skip_olive:
            olive = ensure_olive_venv((args.olive_venv or (work / "olive-venv")).resolve())
        # the same state dict for both tools: Olive's model.py, seed 0, 1000 classes
        setup = work / "weights"
        setup.mkdir()
        shutil.copyfile(PEERS / "model.py", setup / "model.py")
        python = (olive.parent / "python") if olive else Path(sys.executable)
        subprocess.run([str(python), "model.py"], cwd=setup, check=True, capture_output=True)
        weights = setup / "alexnet.pt"
        sha = sha256_file(weights)

        rows: dict[str, list[dict[str, Any]]] = {"olive": [], "dynamic": [], "static": []}
        kinds = (["olive"] if olive else []) + ["dynamic"] + ([] if args.skip_static else ["static"])
        for i in range(args.repeat):
            # Rotate the order each round: on this VM a run right after a large process has exited
            # pays for faulting in freshly released memory (up to +2 s measured here), so every
            # row must follow every other row equally often.
            order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
            print(f"  run {i + 1}/{args.repeat}:", end="", flush=True)
            for kind in order:
                if kind == "olive":
                    r = run_olive(olive, work, i, weights)
                    rows["olive"].append(r)
                    print(f" olive {r['wall']:.2f} s;", end="", flush=True)
                    shutil.rmtree(r.pop("folder"), ignore_errors=True)  # 0.5 GB of Olive cache per run
                    continue
                static = kind == "static"
                r = run_zoo_cold(work, i, weights, sha, static)
                rows[kind].append(r)
                print(f" zoo {kind} {r['wall']:.2f} s" + ("" if r["ok"] else " (FAILED)") + ";", end="", flush=True)
                shutil.rmtree(r.pop("folder"), ignore_errors=True)
            print(f"  [load {load_average()}]", flush=True)

        olive_median = statistics.median(r["wall"] for r in rows["olive"]) if rows["olive"] else None
        out = []
        if rows["olive"]:
            out.append(summarise("Olive: conversion → peephole → dynamic int8", rows["olive"], olive_median))
        labels = {"dynamic": "zoo: export → optimize → quantize dynamic", "static": "zoo: export → optimize → quantize static QDQ"}
        failures = {}
        for key in ("dynamic", "static"):
            if rows[key]:
                out.append(summarise(labels[key], rows[key], olive_median))
                failed = [r for r in rows[key] if not r["ok"]]
                if failed:
                    out[-1][0] += " (FAILED)"
                    failures[key] = failed[0]["error"]
        print()
        print(f"AlexNet-224 cold export → optimize → quantize, wall seconds ({args.repeat} runs each):")
        print(table(["pipeline", "median", "min", "max", "runs", "/ Olive"], out))
        if rows["olive"] and rows["dynamic"]:
            ratio = statistics.median(r["wall"] for r in rows["dynamic"]) / olive_median
            if "dynamic" in failures:
                print(f"zoo dynamic / Olive: NOT measured — a zoo stage failed (see below); the run up to the "
                      f"failure already took {ratio:.2f}x Olive's time (goal ≤ {RATIO_GOAL}x)")
            else:
                print(f"zoo dynamic / Olive: {ratio:.2f}x — goal ≤ {RATIO_GOAL}x {'MET' if ratio <= RATIO_GOAL else 'NOT met'}")
        print("\nwhere the time goes (medians, seconds):")
        if rows["olive"]:
            print("  Olive passes: " + ", ".join(f"{k} {statistics.median(r['stages'].get(k, 0.0) for r in rows['olive']):.2f}"
                                                for k in rows["olive"][0]["stages"]))
        for key in ("dynamic", "static"):
            if rows[key]:
                print(f"  zoo {key}: {stage_medians(rows[key])}")
        zoo_py = Path(sys.executable)
        overheads = [f"import torch {import_time(zoo_py, 'torch'):.2f}",
                     f"import onnx, onnxruntime {import_time(zoo_py, 'onnx, onnxruntime'):.2f}",
                     f"import zoo.cli.main {import_time(zoo_py, 'zoo.cli.main'):.2f}"]
        print("  fresh interpreter, zoo venv: " + ", ".join(overheads))
        if olive:
            olive_py = olive.parent / "python"
            print(f"  fresh interpreter, Olive venv: import torch {import_time(olive_py, 'torch'):.2f}, "
                  f"import olive.workflows {import_time(olive_py, 'olive.workflows'):.2f}")
        for key, error in failures.items():
            print(f"\nzoo {key} failed:\n{error}")
        if rows["olive"] and rows["dynamic"] and "ops" in rows["dynamic"][0]:
            print(f"\nquantized graphs (op counts) — Olive: {rows['olive'][0]['ops']}\n"
                  f"                                 zoo:   {rows['dynamic'][0]['ops']}")
        if args.profile:
            profile_zoo(work, weights, sha)
        print(f"\nload average at the end: {load_average()}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
