"""Engine benchmarks (prints figures; never run as a test).

1. `zoo --help` wall time (goal ≤ 0.10 s).
2. A 6-stage recipe passing a 230 MB artifact along (test kinds from tests/plugins): cold run,
   then fully cached rerun (goal ≤ 0.15 s), side by side with an equivalent 6-stage dvc.yaml under
   `dvc repro` (dvc in a temporary venv), in the same run: medians and ratio (goal ≤ 0.3× DVC's
   no-op repro).
3. With `--against REV`: `zoo --help` and the cached rerun of this checkout side by side with
   those of another commit (a temporary git worktree of REV, its own code on PYTHONPATH), timed
   interleaved in the same run so the host's load falls on both alike.

    .venv/bin/python bench/bench_engine.py [--size-mb 230] [--repeat 7] [--dvc-venv DIR] [--against REV] [--skip-dvc]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "tests" / "plugins"
ZOO = [sys.executable, "-m", "zoo"]


def timed(cmd: list[str], cwd: Path, env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def median_of(cmd, cwd, env, repeat) -> float:
    return statistics.median(timed(cmd, cwd, env) for _ in range(repeat))


def zoo_recipe(size_mb: int) -> str:
    stages = [f"  s1:\n    kind: blob\n    config: {{size_mb: {size_mb}, seed: 42}}\n"]
    for i in range(2, 7):
        stages.append(f"  s{i}:\n    kind: blob\n    config: {{transform: true, seed: {i}}}\n")
    return "schema_version: 1\nname: bench\nversion: 0.1.0\nstages:\n" + "".join(stages)


def dvc_project(folder: Path, size_mb: int) -> None:
    (folder / "params.yaml").write_text(f"train:\n  seed: 42\n  size_mb: {size_mb}\n")
    (folder / "gen.py").write_text(textwrap.dedent("""\
        import random, yaml
        p = yaml.safe_load(open("params.yaml"))["train"]
        rng = random.Random(p["seed"])
        with open("s1.bin", "wb") as f:
            for _ in range(p["size_mb"]):
                f.write(rng.randbytes(1 << 20))
        """))
    (folder / "transform.py").write_text(textwrap.dedent("""\
        import sys
        src, dst = sys.argv[1], sys.argv[2]
        with open(src, "rb") as a, open(dst, "wb") as b:
            for chunk in iter(lambda: a.read(1 << 20), b""):
                b.write(chunk[::-1])
        """))
    lines = ["stages:", "  s1:", "    cmd: python gen.py", "    deps: [gen.py]",
             "    params: [train.seed, train.size_mb]", "    outs: [s1.bin]"]
    for i in range(2, 7):
        lines += [f"  s{i}:", f"    cmd: python transform.py s{i-1}.bin s{i}.bin",
                  f"    deps: [transform.py, s{i-1}.bin]", f"    outs: [s{i}.bin]"]
    (folder / "dvc.yaml").write_text("\n".join(lines) + "\n")


def ensure_dvc_venv(venv: Path) -> Path:
    dvc = venv / "bin" / "dvc"
    if not dvc.exists():
        print(f"creating a temporary venv with dvc at {venv} …", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "dvc"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pip install dvc failed:\n{proc.stderr[-3000:]}")
    return dvc


def interleaved(commands: dict[str, tuple[list[str], Path, dict]], repeat: int) -> dict[str, float]:
    """The median wall time of each command, run in turn `repeat` times (a, b, a, b, ...)."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(repeat):
        for name, (cmd, cwd, env) in commands.items():
            times[name].append(timed(cmd, cwd, env))
    return {name: statistics.median(t) for name, t in times.items()}


def against(rev: str, work: Path, env: dict, size_mb: int, repeat: int) -> None:
    """`zoo --help` and the cached rerun here and at `rev`, side by side."""
    tree = work / "against"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), rev], cwd=REPO, check=True)
    try:
        sides = {}
        for name, root in (("this checkout", REPO), (rev, tree)):
            folder = work / f"side-{len(sides)}"
            folder.mkdir()
            (folder / "bench.yaml").write_text(zoo_recipe(size_mb))
            side_env = dict(env, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests" / "plugins")]),
                            ZOO_CACHE_DIR=str(folder / "cache"), ZOO_HOME=str(folder / "home"))
            timed(ZOO + ["run", "bench.yaml"], folder, side_env)  # cold: fills this side's cache
            sides[name] = (folder, side_env)
        helps = interleaved({n: (ZOO + ["--help"], f, e) for n, (f, e) in sides.items()}, repeat)
        reruns = interleaved({n: (ZOO + ["run", "bench.yaml"], f, e) for n, (f, e) in sides.items()}, repeat)
        here, there = list(sides)
        print()
        print(f"{'':<28}{here:>16}{there:>16}{'ratio':>8}")
        print(f"{'zoo --help (s)':<28}{helps[here]:>16.3f}{helps[there]:>16.3f}{helps[here] / helps[there]:>8.2f}")
        print(f"{'cached rerun (s)':<28}{reruns[here]:>16.3f}{reruns[there]:>16.3f}{reruns[here] / reruns[there]:>8.2f}")
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=230)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dvc-venv", type=Path, default=None, help="reuse a venv with dvc (default: a new temp one)")
    parser.add_argument("--against", metavar="REV", help="also time --help and the cached rerun at commit REV")
    parser.add_argument("--skip-dvc", action="store_true", help="leave out the dvc side")
    args = parser.parse_args()

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")]))
    env["DVC_NO_ANALYTICS"] = "1"
    work = Path(tempfile.mkdtemp(prefix="zoo-bench-"))
    try:
        help_s = median_of(ZOO + ["--help"], work, env, args.repeat)
        print(f"zoo --help: median {help_s:.3f} s over {args.repeat} (goal ≤ 0.10 s)", flush=True)

        zdir = work / "zoo"
        zdir.mkdir()
        (zdir / "bench.yaml").write_text(zoo_recipe(args.size_mb))
        zenv = dict(env, ZOO_CACHE_DIR=str(zdir / "cache"), ZOO_HOME=str(zdir / "home"))
        cold = timed(ZOO + ["run", "bench.yaml"], zdir, zenv)
        cached = median_of(ZOO + ["run", "bench.yaml"], zdir, zenv, args.repeat)
        print(f"zoo 6 stages, {args.size_mb} MB artifact: cold {cold:.2f} s, cached rerun median {cached:.3f} s", flush=True)
        if args.against:
            against(args.against, work, env, args.size_mb, args.repeat)
        if args.skip_dvc:
            return

        venv = args.dvc_venv or (work / "dvc-venv")
        dvc = ensure_dvc_venv(venv)
        ddir = work / "dvc"
        ddir.mkdir()
        dvc_project(ddir, args.size_mb)
        denv = dict(env, PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}")
        denv.pop("PYTHONPATH")
        subprocess.run(["git", "init", "-q"], cwd=ddir, check=True)
        subprocess.run([str(dvc), "init", "-q"], cwd=ddir, check=True, env=denv)
        dvc_cold = timed([str(dvc), "repro", "-q"], ddir, denv)
        dvc_noop = median_of([str(dvc), "repro", "-q"], ddir, denv, args.repeat)
        print(f"dvc 6 stages, {args.size_mb} MB artifact: cold {dvc_cold:.2f} s, no-op repro median {dvc_noop:.3f} s", flush=True)
        print()
        print(f"{'':<28}{'zoo':>10}{'dvc':>10}{'zoo/dvc':>10}")
        print(f"{'cold run (s)':<28}{cold:>10.2f}{dvc_cold:>10.2f}{cold / dvc_cold:>10.2f}")
        print(f"{'cached / no-op rerun (s)':<28}{cached:>10.3f}{dvc_noop:>10.3f}{cached / dvc_noop:>10.2f}")
        print(f"goals: cached ≤ 0.15 s ({'met' if cached <= 0.15 else 'NOT met'}), "
              f"≤ 0.3× dvc ({'met' if cached <= 0.3 * dvc_noop else 'NOT met'}); "
              f"--help ≤ 0.10 s ({'met' if help_s <= 0.10 else 'NOT met'})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
