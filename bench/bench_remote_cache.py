"""Remote run cache benchmark (prints figures; never run as a test).

Two machines share work through an S3 remote run cache (moto's S3 server on 127.0.0.1). Each
"machine" is its own copy of the recipe folder with its own ZOO_CACHE_DIR and ZOO_HOME; every
command runs in a fresh process, as a user would run it.

1. `recipes/alexnet.yaml`: machine A runs it cold with `--cache-remote` (it builds and pushes);
   machine B, with an empty local cache, runs it too and runs nothing (every stage from the
   remote; its published builds are checked byte-identical to A's). B's wall time is compared
   with a raw boto3 download (`get_object` to files, in a fresh process) of exactly the remote
   objects B needed: the stages' entries and their output objects. Goals: B ≤ 1.3× raw, and B
   ≥ 10× faster than A's cold run. For reference, the same raw download hashing sha256 as it
   streams (a script's check of every byte; zoo checks blake3, the run cache's digest) is timed
   beside it.
   Each machine has its own code memo (the parsed imports of zoo's installed modules, which zoo
   keeps per user, outside any project). B has used zoo before (a `zoo plan` in another project,
   untimed; its run cache stays empty); a second B where zoo never ran is timed beside it.
2. The 6-stage, 230 MB project of bench_engine.py, side by side on the same server: zoo (A runs
   and pushes, B runs through the remote cache) against DVC (A: `dvc repro`, `dvc push
   --run-cache`; B, a `git clone` without .dvc/cache: `dvc pull --run-cache` + `dvc repro`).
   DVC with dvc-s3 runs from a separate venv (created in a temp folder unless `--dvc-venv`).

B's runs take turns with the raw downloads (each at each place of a round: a run slows the next one
with its disk's writeback), and the zoo and DVC B-sides alternate; `--repeat` sets how many rounds.

    .venv/bin/python bench/bench_remote_cache.py [--recipe recipes/alexnet.yaml] [--repeat 3]
        [--size-mb 230] [--dvc-venv DIR] [--skip-dvc] [--profile [FILE]]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # registry_servers: the tests' S3 server
from bench_engine import dvc_project, zoo_recipe  # noqa: E402  (the 6-stage project, shared)

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "tests" / "plugins"
ZOO = [sys.executable, "-m", "zoo"]
BUCKET = "zoo"

# A raw download in a fresh process (as `zoo run` is): boto3 `get_object` of each key, streamed
# to a file, one after the other. argv: endpoint, bucket, destination folder, JSON list of keys.
RAW_GET = """\
import json, sys
from pathlib import Path
import boto3
endpoint, bucket, dest, keys = sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
s3 = boto3.client("s3", endpoint_url=endpoint)
for i, key in enumerate(keys):
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    with open(dest / str(i), "wb") as f:
        for chunk in body.iter_chunks(8 << 20):
            f.write(chunk)
"""
# The same download with a check of every byte it installs (sha256 while the bytes
# stream): what is left of B's time beyond it is zoo's own (start-up, keys, blake3, the publish).
RAW_GET_SHA256 = """\
import hashlib, json, sys
from pathlib import Path
import boto3
endpoint, bucket, dest, keys = sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
s3 = boto3.client("s3", endpoint_url=endpoint)
for i, key in enumerate(keys):
    body = s3.get_object(Bucket=bucket, Key=key)["Body"]
    h = hashlib.sha256()
    with open(dest / str(i), "wb") as f:
        for chunk in body.iter_chunks(8 << 20):
            h.update(chunk)
            f.write(chunk)
    h.hexdigest()
"""


# --- processes ---------------------------------------------------------------------------------
def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, str]:
    """Wall time of `cmd` and its stdout; exits the benchmark if it fails.

    The page cache is flushed first (`os.sync`): each command writes up to a gigabyte, and without
    it the next command timed would pay for the previous one's writeback (a raw download timed right
    after a B run came out slower than the same download doing more work)."""
    os.sync()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return elapsed, proc.stdout


class Machine:
    """A machine of its own: a copy of the recipe folder, its own run cache and zoo home."""

    def __init__(self, root: Path, source: Path, env: dict):
        self.root = root
        self.folder = root / source.name
        shutil.copytree(source, self.folder)
        # its own code memo too (zoo keeps parsed imports of installed modules per user, outside
        # any project: see zoo/engine/import_closure.py), so no machine profits from another's
        self.env = dict(env, ZOO_CACHE_DIR=str(root / "cache"), ZOO_HOME=str(root / "home"),
                        ZOO_CODE_MEMO=str(root / "code-memo.sqlite"))

    def has_run_zoo_before(self, recipe: str) -> None:
        """What a machine that has used zoo before has: `zoo plan` of the recipe in another project
        (another run cache, which is then removed; this machine's own cache stays empty)."""
        other = self.root / "another-project-cache"
        timed(ZOO + ["plan", recipe], self.folder, dict(self.env, ZOO_CACHE_DIR=str(other)))
        shutil.rmtree(other, ignore_errors=True)
        if not Path(self.env["ZOO_CODE_MEMO"]).is_file():
            raise SystemExit("`zoo plan` left no code memo: the machine-B figures would not be what they say")

    def zoo_run(self, recipe: str, remote: str) -> tuple[float, dict]:
        seconds, out = timed(ZOO + ["run", recipe, "--cache-remote", remote, "--json"], self.folder, self.env)
        return seconds, json.loads(out)

    def builds(self, ref: str) -> dict[str, str]:
        """{build name: sha256} of version `ref` in this machine's zoo."""
        _, out = timed(ZOO + ["show", ref, "--json"], self.folder, self.env)
        return {name: b["file"]["sha256"] for name, b in json.loads(out)["builds"].items()}

    def remove(self) -> None:
        shutil.rmtree(self.root, onerror=lambda f, p, e: (os.chmod(p, 0o755), f(p)))


def stages_of(report: dict) -> list[dict]:
    return report["stages"] if isinstance(report, dict) else report


def check_all_remote(report: dict, what: str) -> list[str]:
    """The stage keys of a run in which every stage came from the remote cache (else exit)."""
    stages = stages_of(report)
    bad = [s["id"] for s in stages
           if s["state"] != "cached" or not any("from the remote cache" in r for r in s["reasons"])]
    if bad:
        raise SystemExit(f"{what}: stages not taken from the remote cache: {', '.join(bad)}\n"
                         f"{json.dumps(report, indent=1)[:4000]}")
    return [s["key"] for s in stages]


# --- the remote's objects ----------------------------------------------------------------------
def needed_keys(s3, prefix: str, stage_keys: list[str]) -> tuple[list[str], int]:
    """The S3 keys a machine with an empty cache reads to take `stage_keys` from the remote cache
    at `prefix` (each stage's entry, then each distinct object its entry names), and their bytes."""
    keys, seen, total = [], set(), 0
    for key in stage_keys:
        entry_key = f"{prefix}/entries/{key[:2]}/{key}.json"
        doc = json.loads(s3.get_object(Bucket=BUCKET, Key=entry_key)["Body"].read())
        keys.append(entry_key)
        total += s3.head_object(Bucket=BUCKET, Key=entry_key)["ContentLength"]
        for sha in doc["sha256"].values():
            if sha not in seen:
                seen.add(sha)
                obj = f"{prefix}/objects/sha256/{sha[:2]}/{sha}"
                keys.append(obj)
                total += s3.head_object(Bucket=BUCKET, Key=obj)["ContentLength"]
    return keys, total


def remote_listing(s3, prefix: str) -> tuple[int, int]:
    """(objects, bytes) stored under `prefix/objects/`."""
    n = size = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/objects/"):
        for obj in page.get("Contents", []):
            n, size = n + 1, size + obj["Size"]
    return n, size


def raw_download(endpoint: str, keys: list[str], dest: Path, env: dict, *, sha256: bool = False) -> float:
    dest.mkdir(parents=True)
    script = RAW_GET_SHA256 if sha256 else RAW_GET
    seconds, _ = timed([sys.executable, "-c", script, endpoint, BUCKET, str(dest), json.dumps(keys)], dest, env)
    shutil.rmtree(dest)
    return seconds


# --- part 1: a real recipe ---------------------------------------------------------------------
def bench_recipe(work: Path, recipe: Path, endpoint: str, env: dict, repeat: int, profile: str | None) -> dict:
    import boto3
    import yaml

    meta = yaml.safe_load(recipe.read_text())
    ref = f"{meta['name']}@{meta['version']}"
    remote = f"s3://{BUCKET}/run-cache-{meta['name']}"
    prefix = remote.removeprefix(f"s3://{BUCKET}/")
    s3 = boto3.client("s3", endpoint_url=endpoint)

    a = Machine(work / "A", recipe.parent, env)
    cold, a_report = a.zoo_run(recipe.name, remote)
    ran = [s["id"] for s in stages_of(a_report) if s["state"] != "cached"]
    print(f"[{meta['name']}] A, cold run with --cache-remote (runs {len(ran)} stages and pushes them): "
          f"{cold:.1f} s", flush=True)
    a_builds = a.builds(ref)

    found: dict = {"keys": [], "bytes": 0, "stage_keys": []}

    def run_b(i: int, used_before: bool = True) -> float:
        b = Machine(work / f"B{i}{'' if used_before else 'new'}", recipe.parent, env)
        if used_before:
            b.has_run_zoo_before(recipe.name)
        seconds, report = b.zoo_run(recipe.name, remote)
        found["stage_keys"] = check_all_remote(report, f"B run {i}")
        b_builds = b.builds(ref)
        if b_builds != a_builds:
            raise SystemExit(f"B's builds differ from A's:\nA {a_builds}\nB {b_builds}")
        b.remove()
        if not found["keys"]:
            found["keys"], found["bytes"] = needed_keys(s3, prefix, found["stage_keys"])
        return seconds

    runs = {"b": run_b,
            "bnew": lambda i: run_b(i, used_before=False),
            "raw": lambda i: raw_download(endpoint, found["keys"], work / f"raw{i}", env),
            "sha": lambda i: raw_download(endpoint, found["keys"], work / f"rawsha{i}", env, sha256=True)}
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(repeat):
        # the four take turns at each place in a round (B first in the first: it finds the keys),
        # so none always follows the same one: whatever a run leaves the disk doing (writeback, the
        # discards of the folder it deleted) slows the next run, whichever it is
        order = names[i % len(names):] + names[:i % len(names)]
        now = {name: runs[name](i) for name in order}
        for name, seconds in now.items():
            times[name].append(seconds)
        print(f"[{meta['name']}] round {i + 1} ({', '.join(order)}): B via remote cache {now['b']:.2f} s "
              f"(zoo never used on B: {now['bnew']:.2f} s), raw boto3 {now['raw']:.2f} s, "
              f"raw boto3 + sha256 {now['sha']:.2f} s", flush=True)
    b_times, raw_times, raw_sha_times = times["b"], times["raw"], times["sha"]
    keys, nbytes, stage_keys = found["keys"], found["bytes"], found["stage_keys"]
    n_objects, stored = remote_listing(s3, prefix)
    print(f"[{meta['name']}] B took all {len(stage_keys)} stages from the remote and published "
          f"{len(a_builds)} builds identical to A's (sha256); it read {len(keys)} S3 objects, "
          f"{nbytes / 1e6:.0f} MB (the remote holds {n_objects} objects, {stored / 1e6:.0f} MB)", flush=True)
    if profile is not None:
        profile_b(work, recipe, remote, env, Path(profile).resolve() if profile else None)
    a.remove()
    return {"name": meta["name"], "cold": cold, "b": statistics.median(b_times), "raw": statistics.median(raw_times),
            "bnew": statistics.median(times["bnew"]),
            "raw_sha": statistics.median(raw_sha_times),
            "b_all": b_times, "raw_all": raw_times, "mb": nbytes / 1e6, "files": len(keys)}


def profile_b(work: Path, recipe: Path, remote: str, env: dict, keep: Path | None) -> None:
    """One more machine B under cProfile: where its wall time goes (a breakdown, then the top
    functions by own time). `keep`: where to leave the cProfile data."""
    import pstats

    b = Machine(work / "Bprof", recipe.parent, env)
    out = keep or work / "b.prof"
    seconds, _ = timed([sys.executable, "-m", "cProfile", "-o", str(out), "-m", "zoo", "run", recipe.name,
                        "--cache-remote", remote, "--json"], b.folder, b.env)
    stats = pstats.Stats(str(out))
    total = stats.total_tt

    def cumulative(module: str, function: str) -> float:
        return sum(v[3] for (path, _, name), v in stats.stats.items()
                   if name == function and path.replace(os.sep, "/").endswith(module))

    # the main thread's view: the downloads themselves run on the fetch threads (RemoteCache.begin)
    parts = [
        ("the whole process", total),
        ("  imports", cumulative("<frozen importlib._bootstrap>", "_find_and_load")),
        ("  stage keys (keys.stage_key)", cumulative("zoo/engine/keys.py", "stage_key")),
        ("  remote entries read, downloads started (RemoteCache.begin)",
         cumulative("zoo/engine/remote_cache.py", "begin")),
        ("  waiting for the downloads (RemoteCache.finish)", cumulative("zoo/engine/remote_cache.py", "finish")),
        ("  the cached deploy publishes into B's zoo (LocalZoo.publish)",
         cumulative("zoo/registry/store.py", "publish")),
    ]
    print(f"\nprofile of one B run ({seconds:.2f} s wall under cProfile; profiled time {total:.2f} s):")
    for what, s in parts:
        print(f"  {what:<62}{s:7.2f} s")
    print("by own time:")
    stats.sort_stats("tottime").print_stats(15)
    b.remove()


# --- part 2: the 6-stage project, zoo against DVC ----------------------------------------------
def bench_six_stages(work: Path, endpoint: str, env: dict, size_mb: int, repeat: int, dvc_venv: Path | None) -> dict:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)
    zenv = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(PLUGINS), env.get("PYTHONPATH")])))
    source = work / "six-src"
    source.mkdir()
    (source / "bench.yaml").write_text(zoo_recipe(size_mb))
    remote = f"s3://{BUCKET}/run-cache-six"
    z_local, _ = Machine(work / "zA0", source, zenv).zoo_run("bench.yaml", "none")
    z_cold, _ = Machine(work / "zA", source, zenv).zoo_run("bench.yaml", remote)
    print(f"[6 stages] zoo A, cold run: without a remote {z_local:.2f} s, with --cache-remote "
          f"(runs and pushes) {z_cold:.2f} s", flush=True)

    dvc = ensure_dvc_venv(dvc_venv or work / "dvc-venv")
    denv = dict(env, PATH=f"{dvc.parent}{os.pathsep}{env['PATH']}", DVC_NO_ANALYTICS="1")
    denv.pop("PYTHONPATH", None)
    da = work / "dA"
    da.mkdir()
    dvc_project(da, size_mb)
    git = ["git", "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    for cmd in (["git", "init", "-q"], [str(dvc), "init", "-q"],
                [str(dvc), "remote", "add", "-d", "s3", f"s3://{BUCKET}/dvc"],
                [str(dvc), "remote", "modify", "s3", "endpointurl", endpoint]):
        timed(cmd, da, denv)
    d_cold, _ = timed([str(dvc), "repro", "-q"], da, denv)
    timed(["git", "add", "-A"], da, denv)
    timed(git + ["commit", "-q", "-m", "pipeline"], da, denv)
    d_push, _ = timed([str(dvc), "push", "--run-cache", "-q"], da, denv)
    print(f"[6 stages] dvc A: cold repro {d_cold:.2f} s, dvc push --run-cache {d_push:.2f} s", flush=True)
    want = sha256_of(da / "s6.bin")

    zb, dpull, drepro, raw_times, keys = [], [], [], [], []
    for i in range(repeat):
        b = Machine(work / f"zB{i}", source, zenv)
        seconds, report = b.zoo_run("bench.yaml", remote)
        stage_keys = check_all_remote(report, f"zoo 6-stage B run {i}")
        b.remove()
        if not keys:
            keys, _ = needed_keys(s3, "run-cache-six", stage_keys)
        raw_times.append(raw_download(endpoint, keys, work / f"zraw{i}", env))
        zb.append(seconds)

        db = work / f"dB{i}"
        timed(["git", "clone", "-q", str(da), str(db)], work, denv)
        assert not (db / ".dvc" / "cache").exists() and not (db / "s6.bin").exists()
        pull, _ = timed([str(dvc), "pull", "--run-cache", "-q"], db, denv)
        repro, out = timed([str(dvc), "repro"], db, denv)
        if sha256_of(db / "s6.bin") != want:
            raise SystemExit("DVC B's s6.bin differs from A's")
        shutil.rmtree(db)
        dpull.append(pull)
        drepro.append(repro)
        print(f"[6 stages] pair {i + 1}: zoo B {seconds:.2f} s (raw boto3 {raw_times[-1]:.2f} s); "
              f"dvc B pull --run-cache {pull:.2f} s + repro {repro:.2f} s", flush=True)
    print(f"[6 stages] dvc B's last `dvc repro` said: {' | '.join(out.strip().splitlines()[-3:])}")
    return {"z_local": z_local, "z_cold": z_cold, "d_cold": d_cold, "d_push": d_push, "zb": statistics.median(zb),
            "dpull": statistics.median(dpull), "drepro": statistics.median(drepro),
            "raw": statistics.median(raw_times)}


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_dvc_venv(venv: Path) -> Path:
    """`dvc` of a venv that has dvc and dvc-s3 (installed there if it lacks them)."""
    python = venv / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import dvc, dvc_s3"], capture_output=True).returncode:
        print(f"installing dvc and dvc-s3 into a venv at {venv} …", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "dvc", "dvc-s3"], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"pip install dvc dvc-s3 failed:\n{proc.stderr[-3000:]}")
    return venv / "bin" / "dvc"


# --- report ------------------------------------------------------------------------------------
def print_tables(r: dict, six: dict | None, size_mb: int) -> None:
    print(f"\n{r['name']} through the S3 remote cache (B: fresh cache; medians of {len(r['b_all'])}; "
          f"{r['files']} objects, {r['mb']:.0f} MB):")
    print(f"{'':<44}{'s':>8}")
    print(f"{'A: cold run (runs every stage, pushes)':<44}{r['cold']:>8.2f}")
    print(f"{'B: zoo run --cache-remote (runs nothing)':<44}{r['b']:>8.2f}")
    print(f"{'  the same where zoo never ran before':<44}{r['bnew']:>8.2f}")
    print(f"{'raw boto3 get_object of the same objects':<44}{r['raw']:>8.2f}")
    print(f"{'  the same, hashing sha256 as the bytes stream':<44}{r['raw_sha']:>8.2f}")
    to_raw, speedup = r["b"] / r["raw"], r["cold"] / r["b"]
    print(f"B / raw = {to_raw:.2f}× (goal ≤ 1.3×: {'met' if to_raw <= 1.3 else 'NOT met'}); "
          f"cold / B = {speedup:.1f}× (goal ≥ 10×: {'met' if speedup >= 10 else 'NOT met'})")
    print(f"B / (raw + sha256) = {r['b'] / r['raw_sha']:.2f}× (for reference: a raw download that checks what it gets); "
          f"where zoo never ran: B / raw = {r['bnew'] / r['raw']:.2f}×")
    if six is None:
        return
    print(f"\n6 stages, {size_mb} MB artifact, through S3 on the same server (B: medians):")
    print(f"{'':<44}{'zoo':>8}{'dvc':>8}")
    print(f"{'A: cold run (no remote)':<44}{six['z_local']:>8.2f}{six['d_cold']:>8.2f}")
    print(f"{'A: cold run + push (zoo: --cache-remote)':<44}{six['z_cold']:>8.2f}{six['d_cold'] + six['d_push']:>8.2f}")
    dvc_b = six["dpull"] + six["drepro"]
    print(f"{'B: fetch (dvc pull --run-cache)':<44}{'—':>8}{six['dpull']:>8.2f}")
    print(f"{'B: run (zoo run --cache-remote / dvc repro)':<44}{six['zb']:>8.2f}{six['drepro']:>8.2f}")
    print(f"{'B: total':<44}{six['zb']:>8.2f}{dvc_b:>8.2f}")
    print(f"zoo B / dvc B = {six['zb'] / dvc_b:.2f}; zoo B / raw boto3 of its objects ({six['raw']:.2f} s) = "
          f"{six['zb'] / six['raw']:.2f}×")


def compile_bytecode() -> None:
    """Write the bytecode of zoo's own modules, as an installed zoo has it (pip compiles a package
    when it installs it; a source checkout writes it at its first import). These machines set
    PYTHONDONTWRITEBYTECODE=1, so without this every timed B process would compile zoo's modules
    from source (≈ 0.3–0.5 s), which no user's second run of zoo does; the raw script's boto3 was
    compiled by pip. py_compile writes regardless of that variable."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "zoo"), str(REPO / "zoo_stages"),
                    str(PLUGINS)], check=True, capture_output=True)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", type=Path, default=REPO / "recipes" / "alexnet.yaml")
    parser.add_argument("--repeat", type=int, default=3, help="B runs, each paired with a raw download")
    parser.add_argument("--size-mb", type=int, default=230, help="the 6-stage project's artifact")
    parser.add_argument("--dvc-venv", type=Path, default=None, help="a venv with dvc and dvc-s3 (default: a new temp one)")
    parser.add_argument("--skip-dvc", action="store_true", help="only the recipe, not the 6-stage zoo/DVC part")
    parser.add_argument("--profile", nargs="?", const="", default=None, metavar="FILE",
                        help="profile one more B run (cProfile); FILE keeps the profile data")
    args = parser.parse_args()

    from registry_servers import moto_s3

    compile_bytecode()
    work = Path(tempfile.mkdtemp(prefix="zoo-bench-rcache-"))
    try:
        with moto_s3(BUCKET) as endpoint:  # sets fake AWS credentials in os.environ
            # zoo reads the endpoint of an s3:// remote from AWS_ENDPOINT_URL (botocore), as CI would set it
            env = dict(os.environ, AWS_ENDPOINT_URL=endpoint)
            print(f"moto S3 at {endpoint}; work folder {work}; load average {load()}", flush=True)
            r = bench_recipe(work, args.recipe.resolve(), endpoint, env, args.repeat, args.profile)
            six = None if args.skip_dvc else bench_six_stages(work, endpoint, env, args.size_mb, args.repeat, args.dvc_venv)
        print_tables(r, six, args.size_mb)
        print(f"load average at the end: {load()}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
