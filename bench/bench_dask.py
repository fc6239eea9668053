"""Dask benchmark (prints figures; never run as a test): the issue's benchmark 2.

A recipe with four independent matrix branches (LeNet-5 on the digits, one training per seed,
one thread each) run cold on a dask.distributed LocalCluster of two single-threaded worker
processes against one worker; the runs alternate, each in a fresh cache, after one untimed run
per cluster warms its workers (torch's import). Goal: two workers
≤ 0.65× one worker's wall time (the machine has 2 cores).

    .venv/bin/python bench/bench_dask.py [--repeat 3] [--epochs 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

RECIPE = """\
schema_version: 1
name: four-branches
version: 1.0.0
task: image-classification
model: {{arch: lenet5, num_classes: 10}}
data: {{source: digits, image_size: 16, channels: 1, val_fraction: 0.2, split_seed: 0}}
stages:
  train:
    matrix: {{seed: [0, 1, 2, 3]}}
    config:
      epochs: {epochs}
      batch_size: 32
      optimizer: {{name: adam, lr: 0.003}}
      seed: ${{matrix.seed}}
      threads: 1
"""


def one_run(recipe: Path, address: str, cache: Path) -> float:
    import zoo

    start = time.perf_counter()
    result = zoo.run(recipe, executor=address, cache_dir=cache, cache_remote="none", jobs=4)
    elapsed = time.perf_counter() - start
    if not result.ok or [s.state for s in result.stages] != ["done"] * 4:
        raise SystemExit(f"the run failed: {[(s.id, s.state, s.error) for s in result.stages]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    import distributed

    with tempfile.TemporaryDirectory(prefix="bench-dask-") as tmp:
        base = Path(tmp)
        os.environ["ZOO_HOME"] = str(base / "home")
        recipe = base / "four-branches.yaml"
        recipe.write_text(RECIPE.format(epochs=args.epochs))
        clusters = {n: distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                                host="127.0.0.1", dashboard_address=":0") for n in (1, 2)}
        try:
            for n in (1, 2):  # warm the workers (torch's import, the digits) outside the timings
                one_run(recipe, clusters[n].scheduler_address, base / f"cache-{n}-warm")
            times: dict[int, list[float]] = {1: [], 2: []}
            for i in range(args.repeat):
                for n in (1, 2):  # alternate, so both see the same load
                    times[n].append(one_run(recipe, clusters[n].scheduler_address, base / f"cache-{n}-{i}"))
        finally:
            for c in clusters.values():
                c.close()
    one, two = statistics.median(times[1]), statistics.median(times[2])
    load = os.getloadavg()
    print(f"four independent training branches ({args.epochs} epochs each), cold, median of {args.repeat}; "
          f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {os.cpu_count()} CPUs")
    print(f"| | 1 worker | 2 workers | 2/1 |\n|---|---:|---:|---:|\n"
          f"| wall (s) | {one:.2f} | {two:.2f} | {two / one:.2f} |")
    print(f"runs: 1 worker {', '.join(f'{t:.2f}' for t in times[1])}; "
          f"2 workers {', '.join(f'{t:.2f}' for t in times[2])}")


if __name__ == "__main__":
    main()
