"""Quantization benchmarks of the real stage kinds (prints figures; never run as a test).

1. Latency: AlexNet-224 (random-init weights, seeded) goes through `zoo run` as a temporary
   recipe export → optimize (levels all and extended: the fp32 builds) and export → quantize
   (static QDQ with the classifier as 8-bit blockwise MatMulNBits, `linear: blockwise`, calibrated on scikit-learn's digits resized to 3x224x224). The ONNX models are
   then timed here with onnxruntime on 1 thread, batch 1, after warm-up, in interleaved blocks
   so machine load hits all alike: p50/p90 and the ratio fastest fp32 p50 / int8 p50 (goal ≥ 3.5×).
2. Accuracy: a copy of recipes/alexnet.yaml (AlexNet trained on digits at 3x64x64) runs end to
   end; verify's metrics (`zoo run --json`) give fp32 and int8 held-out accuracy and the drop
   in points (goal ≤ 0.5 pt).

    .venv/bin/python bench/bench_quantize.py [--runs 300] [--quick] [--variants]
                                             [--skip-latency] [--skip-accuracy] [--keep]

Every run uses its own ZOO_CACHE_DIR/ZOO_HOME in a temporary folder; nothing in the repo changes.
`bench_olive.py` imports the helpers below (zoo invocation, output lookup, timing).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zoo.files import sha256_file

REPO = Path(__file__).resolve().parents[1]
LATENCY_GOAL = 3.5  # int8 build at least this many times faster than the fp32 build
MAIN_INT8 = "int8 build (static QDQ, blockwise linear)"
DROP_GOAL_PT = 0.5  # int8 accuracy at most this many points below fp32


# ---------------------------------------------------------------------------------------------
# helpers shared with bench_olive.py


def zoo_command() -> list[str]:
    """The `zoo` executable of this interpreter's environment (what users run)."""
    exe = Path(sys.executable).parent / "zoo"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "zoo"]


def load_average() -> str:
    """The 1/5/15-minute load averages, for the record (timings are noisy on a shared host)."""
    try:
        one, five, fifteen = os.getloadavg()
        return f"{one:.2f} {five:.2f} {fifteen:.2f}"
    except OSError:
        return "n/a"


def run_zoo(recipe: Path, cache_dir: Path, home: Path, *, check: bool = True) -> tuple[dict[str, Any], float]:
    """`zoo run RECIPE --json` with its own cache and zoo home; (parsed summary, wall seconds).

    With `check`, a failed run stops the bench with the failing stage's error; without it the
    summary is returned as is (its stages carry their own `error`).
    """
    env = dict(os.environ, ZOO_CACHE_DIR=str(cache_dir), ZOO_HOME=str(home))
    start = time.perf_counter()
    proc = subprocess.run(zoo_command() + ["run", str(recipe), "--json"], cwd=recipe.parent, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    try:
        summary = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"zoo run {recipe} gave no JSON summary (exit {proc.returncode}):\n"
                         f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}") from None
    if check and not summary.get("ok"):
        raise SystemExit(f"zoo run {recipe} failed:\n{stage_errors(summary)}")
    return summary, wall


def stage_errors(summary: dict[str, Any]) -> str:
    """One line per failed stage: id, error type and first line of its message."""
    lines = []
    for s in summary.get("stages", []):
        err = s.get("error")
        if err:
            # pydantic puts the reason on the second line of its message
            first = [ln.strip() for ln in str(err.get("message", "")).strip().splitlines() if ln.strip()][:2]
            lines.append(f"  {s['id']}: {err.get('type')}: {' | '.join(first)}")
    return "\n".join(lines) or "  (no stage error recorded)"


def stage(summary: dict[str, Any], stage_id: str) -> dict[str, Any]:
    for s in summary["stages"]:
        if s["id"] == stage_id:
            return s
    raise KeyError(stage_id)


def output_path(summary: dict[str, Any], stage_id: str, name: str = "model") -> Path:
    """Where a stage's output lives in the run cache (materialised on demand)."""
    from zoo.engine.cache import Cache

    cache = Cache(Path(summary["cache_dir"]))
    entry = cache.read_entry(stage(summary, stage_id)["key"])
    if entry is None:
        raise SystemExit(f"stage {stage_id} has no cache entry in {summary['cache_dir']}")
    return cache.output_paths(entry)[name]


def time_models(paths: dict[str, Path], *, runs: int, warmup: int, block: int = 10,
                shape: tuple[int, ...] = (1, 3, 224, 224)) -> dict[str, dict[str, float]]:
    """p50/p90/mean latency (ms) of each model: onnxruntime CPU, 1 thread, batch 1.

    Sessions come from zoo's one builder (graph optimization all, deterministic compute, as the
    kinds time them). Timed runs alternate between the models in blocks of `block`, so load from
    other processes spreads over all of them.
    """
    import numpy as np

    from zoo_stages.lib.runtimes.ort_session import make_session

    sessions = {name: make_session(path, threads=1, level="all") for name, path in paths.items()}
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    feeds = {name: {s.get_inputs()[0].name: x} for name, s in sessions.items()}
    for name, s in sessions.items():
        for _ in range(warmup):
            s.run(None, feeds[name])
    times: dict[str, list[float]] = {name: [] for name in sessions}
    while any(len(t) < runs for t in times.values()):
        for name, s in sessions.items():
            for _ in range(min(block, runs - len(times[name]))):
                t0 = time.perf_counter_ns()
                s.run(None, feeds[name])
                times[name].append((time.perf_counter_ns() - t0) / 1e6)
    return {name: {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)),
                   "mean": float(np.mean(t)), "runs": len(t)} for name, t in times.items()}


def table(header: list[str], rows: list[list[Any]]) -> str:
    """A plain text table, first column left-aligned, the others right-aligned."""
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for k, r in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# 1. AlexNet-224: int8 vs fp32 latency


def save_random_alexnet(path: Path, num_classes: int, seed: int = 0) -> str:
    """A seeded random-init AlexNet state dict (zoo's own layout) saved with torch.save; its sha256."""
    import torch

    from zoo_stages.lib.models.archs import alexnet

    torch.manual_seed(seed)
    torch.save(alexnet(num_classes=num_classes).state_dict(), str(path))
    return sha256_file(path)


def latency_recipe(weights: Path, sha: str, num_classes: int, calib_samples: int, variants: bool) -> str:
    quant = (f"      calibration: {{samples: {calib_samples}, method: minmax}}\n"
             "      eval_samples: 32          # random weights: accuracy is meaningless, keep it cheap\n"
             "      accept: {max_accuracy_drop: 1.0, min_speedup: 0.0}\n")
    text = f"""\
schema_version: 1
name: bench-alexnet224-int8
version: 0.0.1
description: AlexNet-224 random-init weights, int8 latency benchmark (bench/bench_quantize.py)
model: {{arch: alexnet, num_classes: {num_classes}}}
# digits resized to 3x224x224 only calibrate (and feed quantize's own accuracy check)
data: {{source: digits, image_size: 224, channels: 3, val_fraction: 0.2, split_seed: 0, limit: 400}}
stages:
  export:
    config:
      opset: 17
      dynamic_batch: true
      input_shape: [3, 224, 224]
      weights: {{path: {weights}, sha256: {sha}}}
  optimize:
    config: {{level: all}}
  optimize-extended:
    kind: optimize
    needs: [export]
    config: {{level: extended}}
  quantize:
    needs: [export]
    config:
      mode: static
      format: qdq
      linear: blockwise         # as recipes/alexnet.yaml: the classifier as 8-bit MatMulNBits
{quant}"""
    if variants:
        for sid, extra in (("quantize-qgemm", "      format: qdq\n"),
                           ("quantize-per-channel", "      format: qdq\n      per_channel: true\n"),
                           ("quantize-qoperator", "      format: qoperator\n"),
                           ("quantize-x86-vnni", "      format: qdq\n      preset: x86-vnni\n")):
            text += f"  {sid}:\n    kind: quantize\n    needs: [export]\n    config:\n      mode: static\n{extra}{quant}"
    return text


def bench_latency(work: Path, args) -> dict[str, Any]:
    folder = work / "alexnet224"
    folder.mkdir()
    weights = folder / "alexnet224-random.pt"
    print(f"[1] saving random-init AlexNet-224 ({args.classes} classes) weights …", flush=True)
    sha = save_random_alexnet(weights, args.classes)
    recipe = folder / "bench.yaml"
    recipe.write_text(latency_recipe(weights, sha, args.classes, args.calib_samples, args.variants))
    print(f"[1] zoo run {recipe.name} (export → optimize all / extended, export → quantize) …", flush=True)
    summary, wall = run_zoo(recipe, folder / "cache", folder / "home")
    durations = {s["id"]: s["duration_s"] for s in summary["stages"]}
    print(f"[1] built in {wall:.1f} s ({', '.join(f'{k} {v:.1f} s' for k, v in durations.items())})", flush=True)

    quant_ids = [s["id"] for s in summary["stages"] if s["kind"] == "quantize"]
    paths = {"fp32 export": output_path(summary, "export"),
             "fp32 optimize extended": output_path(summary, "optimize-extended"),
             "fp32 optimize all": output_path(summary, "optimize")}
    for sid in quant_ids:
        label = MAIN_INT8 if sid == "quantize" else f"int8 {sid.removeprefix('quantize-')}"
        paths[label] = output_path(summary, sid)
    print(f"[1] timing {len(paths)} models: {args.runs} runs each after {args.warmup} warm-up, 1 thread, batch 1 "
          f"(load {load_average()}) …", flush=True)
    timings = time_models(paths, runs=args.runs, warmup=args.warmup)
    # the int8 build is compared with the fastest fp32 build: the honest baseline
    fp32_label = min((k for k in timings if k.startswith("fp32")), key=lambda k: timings[k]["p50"])
    fp32 = timings[fp32_label]["p50"]
    rows = []
    for label, t in timings.items():
        rows.append([label, f"{paths[label].stat().st_size / 2**20:.1f}", f"{t['p50']:.2f}", f"{t['p90']:.2f}",
                     f"{t['mean']:.2f}", f"{fp32 / t['p50']:.2f}x"])
    ratio = fp32 / timings[MAIN_INT8]["p50"]
    own = stage(summary, "quantize")["metrics"]
    profile = None
    if args.profile:
        print(f"[1] profiling {fp32_label} and {MAIN_INT8} per operator …", flush=True)
        profile = {label: op_times(paths[label]) for label in (fp32_label, *(k for k in paths if k.startswith("int8")))}
    return {"rows": rows, "ratio": ratio, "fp32_label": fp32_label, "durations": durations, "profile": profile,
            "stage_speedup": own.get("speedup"),
            "stage_p50": (own.get("fp32_latency_p50_ms"), own.get("latency_p50_ms")),
            "stage_threads": own.get("latency_threads")}


def op_times(path: Path, runs: int = 20) -> dict[str, float]:
    """Mean kernel milliseconds per inference by operator type (onnxruntime's profiler, 1 thread,
    batch 1). The profiler adds overhead, so these sum to more than the p50 above: read them as
    shares."""
    import json
    from collections import defaultdict

    import numpy as np

    from zoo_stages.lib.runtimes.ort_session import make_session

    # the profile goes outside the cache entry
    session = make_session(path, threads=1, level="all", profile_prefix=path.parent.parent / "profile")
    feed = {session.get_inputs()[0].name: np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)}
    for _ in range(5):
        session.run(None, feed)
    for _ in range(runs):
        session.run(None, feed)
    trace = Path(session.end_profiling())
    totals: dict[str, float] = defaultdict(float)
    for event in json.loads(trace.read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            totals[event["args"]["op_name"]] += event["dur"]
    trace.unlink()
    warm = 5 + runs  # the profiler records warm-up runs too
    return {op: us / warm / 1000 for op, us in sorted(totals.items(), key=lambda kv: -kv[1])}


def host_line() -> str:
    """CPU model and the SIMD features that decide int8 speed, with what they imply."""
    from zoo_stages.lib.runtimes.host_info import host_info, int8_may_saturate

    host = host_info()
    flags = ", ".join(host["flags"]) or "none known"
    line = f"host: {host['cpu']}, {host['cpu_count']} CPUs, onnxruntime {host['versions']['onnxruntime']}; int8 features: {flags}"
    if int8_may_saturate(host):
        line += ("\n  no VNNI: int8 dot products run on VPMADDUBSW (AVX2), about twice fp32's rate per instruction, "
                 "not four times as with VNNI/AMX; expect a lower int8 speedup than on a VNNI host")
    return line


# ---------------------------------------------------------------------------------------------
# 2. accuracy drop on real data (recipes/alexnet.yaml)


def bench_accuracy(work: Path, args) -> dict[str, Any]:
    folder = work / "alexnet-digits"
    folder.mkdir()
    recipe = folder / args.recipe.name
    shutil.copyfile(args.recipe, recipe)  # zoo rewrites the lockfile next to the recipe: run a copy
    print(f"[2] zoo run {args.recipe.relative_to(REPO) if args.recipe.is_relative_to(REPO) else args.recipe} "
          "(a copy; trains AlexNet on digits, 2-4 minutes) …", flush=True)
    summary, wall = run_zoo(recipe, folder / "cache", folder / "home", check=False)
    verify = next((s for s in summary["stages"] if s["kind"] == "verify"), None)
    if verify is None or verify.get("state") not in ("done", "cached") or not verify.get("metrics"):
        raise SystemExit(f"[2] verify did not complete:\n{stage_errors(summary)}")
    builds = verify["metrics"]["builds"]
    ref = verify["metrics"]["reference"]
    int8 = next(b for b, m in builds.items() if b != ref and "int8" in b) if len(builds) > 1 else ref
    fp32_acc, int8_acc = builds[ref]["accuracy"], builds[int8]["accuracy"]
    result = {"wall": wall, "ref": ref, "int8": int8, "fp32": fp32_acc, "int8_acc": int8_acc,
              "drop_pt": (fp32_acc - int8_acc) * 100, "samples": None, "speedup_64": builds[int8].get("speedup"),
              "agreement": builds[int8].get("top1_agreement"), "failed": stage_errors(summary) if not summary["ok"] else "",
              "durations": {s["id"]: s["duration_s"] for s in summary["stages"]}}
    split = next((s["metrics"].get("split") for s in summary["stages"] if s["kind"] == "train"), None)
    if split:
        result["samples"] = split.get("num_val")
    manifest = folder / "home" / "models" / "alexnet" / "versions" / "1.0.0" / "zoo-manifest.json"
    if manifest.exists():  # the published release agrees with verify (deploy copies its metrics)
        published = json.loads(manifest.read_text())["builds"]
        result["published"] = {b: published[b]["metrics"].get("accuracy") for b in (ref, int8) if b in published}
    return result


# ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300, help="timed runs per model (default 300)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs per model first (default 20)")
    parser.add_argument("--classes", type=int, default=1000, help="AlexNet-224 classes (default 1000, as ImageNet)")
    parser.add_argument("--calib-samples", type=int, default=256, help="static calibration images (default 256)")
    parser.add_argument("--variants", action="store_true",
                        help="also build and time per-channel QDQ, QOperator and the x86-vnni preset")
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "alexnet.yaml",
                        help="digits-trained recipe for the accuracy drop (default recipes/alexnet.yaml)")
    parser.add_argument("--quick", action="store_true", help="60 timed runs, 64 calibration images")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-accuracy", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (printed)")
    parser.add_argument("--profile", action="store_true",
                        help="also print where the time goes: kernel ms per operator type (onnxruntime profiler)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.warmup, args.calib_samples = 60, 10, 64
    args.recipe = args.recipe.resolve()

    work = Path(tempfile.mkdtemp(prefix="zoo-bench-quantize-"))
    print(f"bench_quantize: {time.strftime('%Y-%m-%d %H:%M')}, load average {load_average()}, work dir {work}")
    print(host_line())
    try:
        lat = None if args.skip_latency else bench_latency(work, args)
        acc = None if args.skip_accuracy else bench_accuracy(work, args)
        print()
        if lat:
            print(f"AlexNet-224, onnxruntime CPU, 1 thread, batch 1 (ms; speedup against the fastest fp32 build, "
                  f"{lat['fp32_label']}):")
            print(table(["model", "size MB", "p50", "p90", "mean", "speedup"], lat["rows"]))
            print(f"int8 build / fastest fp32 build speedup: {lat['ratio']:.2f}x — goal ≥ {LATENCY_GOAL}x "
                  f"{'MET' if lat['ratio'] >= LATENCY_GOAL else 'NOT met'}")
            fp, q = lat["stage_p50"]
            if lat["stage_speedup"]:
                print(f"(the quantize stage's own check, fp32 export {fp:.2f} ms vs int8 {q:.2f} ms, "
                      f"{lat['stage_threads']} thread(s), its default runs: {lat['stage_speedup']:.2f}x)")
            if lat["profile"]:
                print("\nkernel ms per inference by operator (profiled; shares, not latencies):")
                for label, ops in lat["profile"].items():
                    top = ", ".join(f"{op} {ms:.2f}" for op, ms in list(ops.items())[:4])
                    print(f"  {label:<42} total {sum(ops.values()):6.2f}: {top}")
            print()
        if acc:
            print(f"AlexNet 3x64x64 trained on digits ({args.recipe.name}), held-out split"
                  + (f" ({acc['samples']} images; 1 image = {100 / acc['samples']:.2f} pt)" if acc["samples"] else "")
                  + ":")
            print(table(["build", "accuracy", "drop (pt)"],
                        [[acc["ref"], f"{acc['fp32']:.4f}", ""],
                         [acc["int8"], f"{acc['int8_acc']:.4f}", f"{acc['drop_pt']:+.2f}"]]))
            print(f"accuracy drop: {acc['drop_pt']:.2f} pt — goal ≤ {DROP_GOAL_PT} pt "
                  f"{'MET' if acc['drop_pt'] <= DROP_GOAL_PT else 'NOT met'}"
                  f" (top-1 agreement {acc['agreement']:.4f}; verify's 64x64 int8 speedup {acc['speedup_64']:.2f}x)")
            if acc.get("published"):
                print(f"published manifest accuracies: {acc['published']}")
            print(f"recipe run {acc['wall']:.0f} s: " + ", ".join(f"{k} {v:.1f} s" for k, v in acc["durations"].items()))
            if acc["failed"]:
                print(f"note: the recipe run did not finish cleanly (figures above come from verify):\n{acc['failed']}")
        print(f"load average at the end: {load_average()}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
