"""Registry benchmarks: list/resolve with 10,000 versions; pull 233 MB from S3 vs raw boto3.

Run: .venv/bin/python bench/bench_registry.py [--versions 10000] [--mb 233] [--skip-list|--skip-pull]
Prints figures only (goals: list/resolve ≤ 0.2 s; pull ≥ 0.8× raw boto3 throughput with the
sha256 check included). Everything runs in temp folders against moto's S3 server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# the staging folders and servers the tests use (tests/registry_servers.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _timed(fn, repeat: int = 5) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def bench_list(tmp: Path, n_versions: int) -> None:
    from zoo.registry import api
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging

    root = tmp / "zoo-list"
    zoo = LocalZoo(root)
    base = zoo.publish(make_staging(tmp / "seed", name="m000", version="0.0.1"))
    models = 100
    per = max(1, n_versions // models)
    t = time.perf_counter()
    count = 1
    for m in range(models):
        for v in range(per):
            if count >= n_versions:
                break
            # every version shares the seed's blobs; only the manifest differs, like real re-releases
            zoo.adopt(base.model_copy(update={"name": f"m{m:03d}", "version": f"1.{v // 10}.{v % 10}", "created": None}))
            count += 1
    print(f"setup: {count} versions of {models} models adopted in {time.perf_counter() - t:.1f} s")

    def fresh() -> LocalZoo:
        return LocalZoo(root)  # a new object: a cold SQLite connection, as a new process would have

    t_list, rows = _timed(lambda: fresh().list())
    t_models, models_out = _timed(lambda: api.list_models(zoo=fresh()))
    t_pin, _ = _timed(lambda: fresh().resolve("m042@1.5.3"), 20)
    t_tag, m = _timed(lambda: fresh().resolve("m042"), 20)
    t_search, hits = _timed(lambda: api.search("m04", max_latency=5.0, zoo=fresh()))
    print(f"list all versions ({len(rows)} rows):         {t_list * 1000:8.1f} ms   (goal ≤ 200 ms)")
    print(f"list models ({len(models_out)} models):            {t_models * 1000:8.1f} ms")
    print(f"resolve name@version:                  {t_pin * 1000:8.2f} ms")
    print(f"resolve name (tag latest → {m.version}):    {t_tag * 1000:8.2f} ms")
    print(f"search text + latency ({len(hits)} hits):     {t_search * 1000:8.1f} ms")
    import subprocess

    env = dict(os.environ, ZOO_HOME=str(root))
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "zoo", "list", "--versions", "--json"], env=env, capture_output=True)
    print(f"`zoo list --versions --json` process:  {(time.perf_counter() - t) * 1000:8.1f} ms "
          f"(whole process: interpreter, imports, JSON of {len(proc.stdout) // 1024} KB)")


def bench_pull(tmp: Path, mb: int) -> None:
    import boto3

    from zoo.registry import api
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging, moto_s3

    size = mb * 1_000_000
    t = time.perf_counter()
    pub = LocalZoo(tmp / "pub")
    manifest = pub.publish(make_staging(tmp / "big", name="big", big_bytes=size))
    ref = manifest.builds["cpu-fp32"].file
    print(f"setup: {ref.size / 1e6:.0f} MB ONNX build published locally in {time.perf_counter() - t:.1f} s")
    with moto_s3("zoo") as endpoint:
        api.remote_add("s3", "s3://zoo/bench", options={"endpoint_url": endpoint}, zoo=pub)
        t = time.perf_counter()
        api.push("big@1.0.0", "s3", zoo=pub)
        print(f"push to moto: {time.perf_counter() - t:.1f} s")
        key = f"bench/blobs/sha256/{ref.sha256[:2]}/{ref.sha256}"
        s3 = boto3.client("s3", endpoint_url=endpoint)

        def raw_get() -> float:
            out = tmp / "raw.bin"
            t0 = time.perf_counter()
            body = s3.get_object(Bucket="zoo", Key=key)["Body"]
            with open(out, "wb") as f:
                for chunk in body.iter_chunks(8 << 20):
                    f.write(chunk)
            dt = time.perf_counter() - t0
            out.unlink()
            return dt

        def raw_download_file() -> float:
            out = tmp / "raw2.bin"
            t0 = time.perf_counter()
            s3.download_file("zoo", key, str(out))
            dt = time.perf_counter() - t0
            out.unlink()
            return dt

        def zoo_pull(i: int) -> float:
            consumer = LocalZoo(tmp / f"consumer{i}")
            api.remote_add("s3", "s3://zoo/bench", options={"endpoint_url": endpoint}, zoo=consumer)
            t0 = time.perf_counter()
            res = api.pull("big@1.0.0", remote="s3", zoo=consumer)
            dt = time.perf_counter() - t0
            assert Path(res.path).stat().st_size == ref.size
            t1 = time.perf_counter()
            api.pull("big@1.0.0", zoo=consumer)
            cached = time.perf_counter() - t1
            import shutil

            shutil.rmtree(consumer.root, onerror=lambda f, p, e: (os.chmod(p, 0o755), f(p)))
            zoo_pull.cached.append(cached)
            return dt

        zoo_pull.cached = []
        raw, raw2, pulls = [], [], []
        for i in range(3):  # interleaved so both see the same machine state
            raw.append(raw_get())
            pulls.append(zoo_pull(i))
            raw2.append(raw_download_file())
        r, r2, p = min(raw), min(raw2), min(pulls)
        mbs = lambda s: ref.size / s / 1e6  # noqa: E731
        print(f"raw boto3 get_object → file:          {r:6.2f} s  {mbs(r):7.1f} MB/s (no sha256)")
        print(f"raw boto3 download_file (threaded):   {r2:6.2f} s  {mbs(r2):7.1f} MB/s (no sha256)")
        print(f"zoo pull (s3fs, sha256, link, ONNX check): {p:6.2f} s  {mbs(p):7.1f} MB/s "
              f"= {r / p:.2f}× get_object, {r2 / p:.2f}× download_file (goal ≥ 0.8×)")
        print(f"second pull of the same version (cache): {min(zoo_pull.cached) * 1000:.1f} ms")
        from zoo.pathsafety import external_data_locations

        t = time.perf_counter()
        external_data_locations(pub.blobs.path(ref.sha256))
        print(f"  of which the ONNX external-data check: {time.perf_counter() - t:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--versions", type=int, default=10_000)
    ap.add_argument("--mb", type=int, default=233)
    ap.add_argument("--skip-list", action="store_true")
    ap.add_argument("--skip-pull", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="zoo-bench-") as tmp:
        os.environ.setdefault("ZOO_HOME", str(Path(tmp) / "home"))
        if not args.skip_list:
            bench_list(Path(tmp), args.versions)
        if not args.skip_pull:
            bench_pull(Path(tmp), args.mb)


if __name__ == "__main__":
    main()
