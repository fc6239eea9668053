"""The issue's scenario with the shipped lenet-digits recipe and a real S3 server (moto):
machine A (its own ZOO_CACHE_DIR and ZOO_HOME) runs it with `--cache-remote` and pushes; machine
B (a fresh cache and zoo, its own copy of the recipe) runs the same recipe with the same remote
and runs nothing; the builds B publishes are byte-identical to A's."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from cli_helpers import table_rows, zoo as zoo_cli
from conftest import REPO

pytest.importorskip("torch")  # machine A trains
pytestmark = pytest.mark.slow

STAGES = ["train", "export", "optimize", "quantize", "verify", "deploy"]
LENET_BUILDS = {"cpu-fp32", "cpu-int8", "cuda-fp16", "mobile", "openvino-fp32", "openvino-int8", "tensorrt-fp16"}


@pytest.fixture(scope="module")
def machines(tmp_path_factory, s3_endpoint):
    """A runs lenet-digits against the remote; B runs its own copy of the recipe afterwards."""
    url = f"s3://zoo/{uuid.uuid4().hex[:10]}"
    out = {"url": url}
    for name in ("a", "b"):
        base = tmp_path_factory.mktemp(f"machine-{name}")
        shutil.copy(REPO / "recipes" / "lenet-digits.yaml", base / "lenet-digits.yaml")
        # the moto endpoint reaches botocore through the environment, as a team's MinIO would
        env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home"), "AWS_ENDPOINT_URL": s3_endpoint}
        cli = zoo_cli("run", base / "lenet-digits.yaml", "--cache-remote", url, "--json", env=env, timeout=900)
        assert cli.code == 0, cli.text
        out[name] = {"env": env, "recipe": base / "lenet-digits.yaml", "result": json.loads(cli.out)}
    return out


def test_machine_a_runs_every_stage_and_pushes_it(machines):
    stages = machines["a"]["result"]["stages"]
    assert [s["id"] for s in stages] == STAGES and {s["state"] for s in stages} == {"done"}
    assert machines["a"]["result"]["notes"] == []


def test_machine_b_runs_nothing_every_stage_is_a_remote_hit(machines):
    result = machines["b"]["result"]
    assert {s["id"]: s["state"] for s in result["stages"]} == {sid: "cached" for sid in STAGES}
    assert all(s["reasons"] == [f"cached: from the remote cache {machines['url']}"] for s in result["stages"])
    assert {s["id"]: s["outputs"] for s in result["stages"]} == \
        {s["id"]: s["outputs"] for s in machines["a"]["result"]["stages"]}
    deploy = next(s for s in result["stages"] if s["id"] == "deploy")
    assert deploy["effects"] == [{"kind": "published", "ref": "lenet-digits@1.0.0"}]  # into B's own zoo


def test_machine_b_publishes_builds_byte_identical_to_machine_a(machines):
    from zoo.registry.store import LocalZoo

    zoos = {m: LocalZoo(Path(machines[m]["env"]["ZOO_HOME"])) for m in ("a", "b")}
    manifests = {m: z.resolve("lenet-digits@1.0.0") for m, z in zoos.items()}
    assert set(manifests["b"].builds) == set(manifests["a"].builds) == LENET_BUILDS
    for name, build in manifests["a"].builds.items():
        files_a = {(f.path, f.sha256, f.size) for f in build.all_files()}
        files_b = {(f.path, f.sha256, f.size) for f in manifests["b"].builds[name].all_files()}
        assert files_b == files_a, name
        for f in build.all_files():
            assert zoos["b"].blobs.path(f.sha256).read_bytes() == zoos["a"].blobs.path(f.sha256).read_bytes()


def test_machine_b_stores_its_builds_as_links_to_its_run_cache_objects(machines):
    """B's deploy was a cache hit: its release's files are read-only run cache objects, so the zoo
    links them instead of copying them (B holds each build's bytes once)."""

    from zoo.registry.store import LocalZoo

    b = machines["b"]["env"]
    manifest = LocalZoo(Path(b["ZOO_HOME"])).resolve("lenet-digits@1.0.0")
    objects = {(st.st_dev, st.st_ino) for p in (Path(b["ZOO_CACHE_DIR"]) / "objects").rglob("*") if p.is_file()
               for st in [p.stat()]}
    blobs = LocalZoo(Path(b["ZOO_HOME"])).blobs
    for build in manifest.builds.values():
        for f in build.all_files():
            st = blobs.path(f.sha256).stat()
            assert (st.st_dev, st.st_ino) in objects, f.path
            assert not st.st_mode & 0o222


def test_cache_status_on_b_shows_every_stage_on_both_sides(machines):
    b = machines["b"]
    cli = zoo_cli("cache", "status", b["recipe"], "--remote", machines["url"], env=b["env"])
    assert cli.code == 0, cli.text
    rows = {r[1]: r for r in table_rows(cli.out)[1:]}
    assert set(rows) == set(STAGES) and all(r[3] == "yes" and r[4] == "yes" for r in rows.values())
