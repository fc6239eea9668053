"""Runtimes side by side: AlexNet-224 builds under onnxruntime and OpenVINO (prints figures; never a test).

A temporary recipe (random-init AlexNet at 3x224x224, seeded, as in bench_quantize.py) goes through
`zoo run`: export → optimize (level basic: the portable fp32 build) and export → quantize (static
QDQ, calibrated on scikit-learn's digits resized to 224). Its deploy stage makes four builds of those
two models — `cpu-fp32` and `cpu-int8` for onnxruntime, `openvino-fp32` and `openvino-int8` for
OpenVINO's CPU plugin (IR converted by zoo, float32 inference pinned) — and checks each against its
source. The four published builds are then timed here in one interleaved run: 1 thread, batch 1,
after warm-up, blocks of runs taking turns so load from other processes hits all alike. Prints each
p50/p90 and the ratios against onnxruntime fp32.

On a host whose onnxruntime offers CUDA, the float16 build (`cuda-fp16`) is also timed on
CUDAExecutionProvider; where it offers TensorRT too, the recipe gains a quantize stage for TensorRT
(`preset: tensorrt`: symmetric int8, float biases) and deploy's `tensorrt-fp16` and `tensorrt-int8`
builds, timed on TensorrtExecutionProvider with the provider options their manifest records (engine
cache in the work folder; the engine is built during warm-up). Elsewhere the table says they were
not run.

    .venv/bin/python bench/bench_runtimes.py [--runs 200] [--warmup 20] [--quantize qdq|blockwise] [--keep]

`--quantize blockwise` quantizes the classifier as recipes/alexnet.yaml does (8-bit MatMulNBits,
a com.microsoft operator: OpenVINO must read it too); the default is plain QDQ for every layer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_quantize import host_line, load_average, run_zoo, save_random_alexnet, stage, table  # noqa: E402

BUILDS = ("cpu-fp32", "cpu-int8", "openvino-fp32", "openvino-int8")


TENSORRT_STAGE = """\
  quantize-trt:
    kind: quantize
    needs: [export]
    config:
      mode: static
      preset: tensorrt
      calibration: {samples: 64, method: minmax}
      eval_samples: 32
      accept: {max_accuracy_drop: 1.0, min_speedup: 0.0}
"""
TENSORRT_BUILDS = """\
        tensorrt-fp16: {from: optimize, convert: tensorrt}
        tensorrt-int8: {from: quantize-trt, convert: tensorrt}
"""


def recipe_text(weights: Path, sha: str, classes: int, quantize: str, tensorrt: bool = False) -> str:
    linear = "      linear: blockwise\n" if quantize == "blockwise" else ""
    return f"""\
schema_version: 1
name: bench-alexnet224-runtimes
version: 0.0.1
description: AlexNet-224 random-init weights, onnxruntime against OpenVINO (bench/bench_runtimes.py)
license: CC-BY-4.0
model: {{arch: alexnet, num_classes: {classes}}}
# digits resized to 3x224x224: calibration and the builds' parity checks (random weights: accuracy is meaningless)
data: {{source: digits, image_size: 224, channels: 3, val_fraction: 0.2, split_seed: 0, limit: 400}}
stages:
  export:
    config:
      opset: 17
      dynamic_batch: true
      input_shape: [3, 224, 224]
      weights: {{path: {weights}, sha256: {sha}}}
  optimize:
    config: {{level: basic}}
  quantize:
    needs: [export]
    config:
      mode: static
      format: qdq
{linear}      calibration: {{samples: 64, method: minmax}}
      eval_samples: 32
      accept: {{max_accuracy_drop: 1.0, min_speedup: 0.0}}
{TENSORRT_STAGE if tensorrt else ""}  deploy:
    needs: [optimize, quantize{", quantize-trt" if tensorrt else ""}]
    config:
      parity_samples: 16
      builds:
        cpu-fp32: {{from: optimize}}
        cpu-int8: {{from: quantize}}
        openvino-fp32: {{from: optimize, convert: openvino}}
        openvino-int8: {{from: quantize, convert: openvino}}
        cuda-fp16: {{from: optimize, convert: fp16}}
{TENSORRT_BUILDS if tensorrt else ""}"""


def runners(files: dict[str, Path], options: dict[str, dict[str, dict[str, str]]],
            engines: Path) -> dict[str, Callable[[Any], Any]]:
    """One `run(x)` per build: onnxruntime sessions and OpenVINO compiled models, 1 thread each;
    on a GPU host the CUDA and TensorRT builds too (TensorRT's with the build's provider options)."""
    from zoo_stages.lib.runtimes import openvino_build
    from zoo_stages.lib.runtimes.ort_session import make_session

    out: dict[str, Callable[[Any], Any]] = {}
    for name in BUILDS:
        if name.startswith("openvino"):
            session = openvino_build.CompiledSession(openvino_build.compile_model(files[name], threads=1))
            inp = session.get_inputs()[0].name
            out[name] = lambda x, s=session, i=inp: s.run(None, {i: x})
        else:
            session = make_session(files[name], threads=1, level="all")
            inp = session.get_inputs()[0].name
            out[name] = lambda x, s=session, i=inp: s.run(None, {i: x})
    import onnxruntime as ort

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" in providers and "cuda-fp16" in files:
        session = make_session(files["cuda-fp16"], threads=1, level="all", providers=["CUDAExecutionProvider"])
        inp = session.get_inputs()[0].name
        out["cuda-fp16 (onnxruntime CUDA)"] = lambda x, s=session, i=inp: s.run(None, {i: x})
    if "TensorrtExecutionProvider" in providers:
        from zoo_stages.lib.runtimes import tensorrt_build

        for name in ("tensorrt-fp16", "tensorrt-int8"):
            trt_options = options[name]["TensorrtExecutionProvider"]
            session = tensorrt_build.make_session(files[name], trt_options, engines / name)
            inp = session.get_inputs()[0].name
            out[f"{name} (onnxruntime TensorRT)"] = lambda x, s=session, i=inp: s.run(None, {i: x})
    return out


def interleaved(run: dict[str, Callable[[Any], Any]], *, runs: int, warmup: int, block: int = 10
                ) -> dict[str, dict[str, float]]:
    import numpy as np

    x = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    for f in run.values():
        for _ in range(warmup):
            f(x)
    times: dict[str, list[float]] = {k: [] for k in run}
    while any(len(t) < runs for t in times.values()):
        for k, f in run.items():
            for _ in range(min(block, runs - len(times[k]))):
                t0 = time.perf_counter_ns()
                f(x)
                times[k].append((time.perf_counter_ns() - t0) / 1e6)
    return {k: {"p50": float(np.percentile(t, 50)), "p90": float(np.percentile(t, 90)), "runs": len(t)}
            for k, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--quantize", choices=("qdq", "blockwise"), default="qdq")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()

    from zoo.registry.store import LocalZoo

    work = Path(tempfile.mkdtemp(prefix="zoo-bench-runtimes-"))
    try:
        print(host_line())
        weights = work / "alexnet224-random.pt"
        sha = save_random_alexnet(weights, args.classes)
        recipe = work / "bench.yaml"
        import onnxruntime

        tensorrt = "TensorrtExecutionProvider" in onnxruntime.get_available_providers()
        if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
            from zoo_stages.lib.runtimes.host_info import gpu_name

            print(f"GPU: {gpu_name()}; onnxruntime providers: {', '.join(onnxruntime.get_available_providers())}")
        recipe.write_text(recipe_text(weights, sha, args.classes, args.quantize, tensorrt))
        print(f"zoo run {recipe.name}: export → optimize (basic) / quantize (static QDQ, {args.quantize}) → "
              f"deploy (4 builds + cuda-fp16{' + tensorrt-fp16/int8' if tensorrt else ''}) …", flush=True)
        home = work / "home"
        summary, wall = run_zoo(recipe, work / "cache", home)
        print(f"built in {wall:.1f} s", flush=True)
        os.environ["ZOO_HOME"] = str(home)  # the zoo the run published into
        zoo = LocalZoo()
        m = zoo.resolve("bench-alexnet224-runtimes")
        files = {name: zoo.blobs.path(b.file.sha256) for name, b in m.builds.items()}
        # OpenVINO reads model.xml beside model.bin: lay the build out as it ships
        for name in ("openvino-fp32", "openvino-int8"):
            folder = work / "pulled" / name
            folder.mkdir(parents=True)
            for ref in [m.builds[name].file, *m.builds[name].extra_files]:
                shutil.copyfile(zoo.blobs.path(ref.sha256), folder / Path(ref.path).name)
            files[name] = folder / Path(m.builds[name].file.path).name
        own = stage(summary, "deploy")["metrics"].get("measured") or {}
        print(f"timing {len(BUILDS)} builds: {args.runs} runs each after {args.warmup} warm-up, 1 thread, batch 1, "
              f"interleaved (load {load_average()}) …", flush=True)
        options = {name: b.provider_options for name, b in m.builds.items()}
        timings = interleaved(runners(files, options, work / "engines"), runs=args.runs, warmup=args.warmup)
        base = timings["cpu-fp32"]["p50"]
        rows, not_run = [], []
        for name, t in timings.items():
            timed_with = "OpenVINO CPU" if name.startswith("openvino") else "onnxruntime"
            rows.append([name, timed_with, f"{t['p50']:.2f}", f"{t['p90']:.2f}", f"{base / t['p50']:.2f}x"])
        for label in ("cuda-fp16 (onnxruntime CUDA)", "tensorrt-fp16 (onnxruntime TensorRT)",
                      "tensorrt-int8 (onnxruntime TensorRT)"):
            if label not in timings:
                rows.append([label, "-", "-", "-", "-"])
                not_run.append(label.split()[0])
        print("\nAlexNet-224, batch 1, 1 thread (p50/p90 ms; speed = onnxruntime fp32 p50 / this p50):")
        print(table(["build", "timed with", "p50", "p90", "speed"], rows))
        if not_run:
            print(f"not run: {', '.join(not_run)} (onnxruntime offers no CUDA/TensorRT provider on this host)")
        ov, ort_ = timings["openvino-fp32"]["p50"], timings["cpu-fp32"]["p50"]
        print(f"\nOpenVINO fp32 / onnxruntime fp32 = {ov / ort_:.2f}; OpenVINO int8 / onnxruntime int8 = "
              f"{timings['openvino-int8']['p50'] / timings['cpu-int8']['p50']:.2f}; int8 speedup: onnxruntime "
              f"{ort_ / timings['cpu-int8']['p50']:.2f}x, OpenVINO {ov / timings['openvino-int8']['p50']:.2f}x")
        if own:
            print("deploy's own timings of the OpenVINO builds (30 runs, in the stage): " + ", ".join(
                f"{k} {v['metrics']['latency_p50_ms']:.2f} ms" for k, v in sorted(own.items()) if v.get("metrics")))
        print(f"load average at the end: {load_average()}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
