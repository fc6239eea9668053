"""The issue's Dask scenario with the shipped lenet-digits recipe: a real scheduler and two
`dask worker` processes, each with its own cache, ZOO_HOME and HOME (one declares GPU=1, the
other memory=16e9), and a real S3 server (moto) as the only thing they share; where this machine
allows it, the workers cannot see the caller's folder at all (their own mount namespace). The
caller (its own cache and zoo, `zoo run --executor dask://… --cache-remote s3://…`) ends with
every build published in its zoo, bit for bit those of a local run, with the timings its verify
entry holds, while the workers' zoos stay empty. Then lenet-digits-finetune, whose `model.from`
parent is in the caller's zoo only, runs on the same workers with nothing pulled there."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest

from cli_helpers import zoo as zoo_cli
from conftest import REPO
from dask_cluster import WorkerSpec, can_hide, cluster
from zoo.engine.cache import Cache
from zoo.registry.store import LocalZoo

pytest.importorskip("torch")  # the workers train
pytest.importorskip("distributed", reason="the dask extra is part of the dev set-up")
pytestmark = pytest.mark.slow

STAGES = ["train", "export", "optimize", "quantize", "verify", "deploy"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, s3_endpoint):
    """The recipe (train tagged GPU, export tagged memory) run through the cluster and, apart, locally;
    and the untagged recipe planned against the local run's cache."""
    base = tmp_path_factory.mktemp("dask-lenet")
    text = (REPO / "recipes" / "lenet-digits.yaml").read_text()
    tagged = text.replace("  train:\n", "  train:\n    resources: {GPU: 1}\n", 1) \
                 .replace("  export:\n", "  export:\n    resources: {memory: 8GB}\n", 1)
    assert tagged.count("resources:") == 2
    hidden = base / "caller"  # the caller's recipes, cache and zoo
    hidden.mkdir()
    hide = hidden if can_hide() else None
    workers = {"gpu": WorkerSpec("gpu", base / "gpu", "GPU=1", {"AWS_ENDPOINT_URL": s3_endpoint}, hide=hide),
               "mem": WorkerSpec("mem", base / "mem", "memory=16e9", {"AWS_ENDPOINT_URL": s3_endpoint}, hide=hide)}
    out = {"workers": workers}
    with cluster(list(workers.values())) as address:
        for name, extra in [("caller", ["--executor", address, "--cache-remote", f"s3://zoo/{uuid.uuid4().hex[:10]}"]),
                            ("local", ["--cache-remote", "none"])]:
            folder = base / name
            folder.mkdir(exist_ok=True)
            (folder / "lenet-digits.yaml").write_text(tagged)
            shutil.copy(REPO / "recipes" / "lenet-digits-finetune.yaml", folder)
            env = {"ZOO_CACHE_DIR": str(folder / "cache"), "ZOO_HOME": str(folder / "home"),
                   "AWS_ENDPOINT_URL": s3_endpoint}
            cli = zoo_cli("run", folder / "lenet-digits.yaml", *extra, "--json", env=env, timeout=1200)
            assert cli.code == 0, cli.text
            out[name] = {"folder": folder, "result": json.loads(cli.out)}
            # the parent is now in this machine's zoo (and in no worker's)
            cli = zoo_cli("run", folder / "lenet-digits-finetune.yaml", *extra, "--json", env=env, timeout=1200)
            assert cli.code == 0, cli.text
            out[f"{name}-finetune"] = {"folder": folder, "result": json.loads(cli.out)}
    (base / "untagged").mkdir()
    (base / "untagged" / "lenet-digits.yaml").write_text(text)
    cli = zoo_cli("plan", base / "untagged" / "lenet-digits.yaml", "--json",
                  env={"ZOO_CACHE_DIR": str(base / "local" / "cache"), "ZOO_HOME": str(base / "local" / "home")})
    assert cli.code == 0, cli.text
    out["untagged"] = {"result": json.loads(cli.out)}
    shutil.rmtree(base / "caller" / "cache" / "tmp", ignore_errors=True)
    return out


def _stages(run) -> dict[str, dict]:
    return {s["id"]: s for s in run["result"]["stages"]}


def test_every_stage_ran_on_the_workers_with_the_keys_and_bytes_of_a_local_run(runs):
    cluster_run, local = _stages(runs["caller"]), _stages(runs["local"])
    assert list(cluster_run) == STAGES and {s["state"] for s in cluster_run.values()} == {"done"}
    assert {s["state"] for s in local.values()} == {"done"}
    assert {k: s["key"] for k, s in cluster_run.items()} == {k: s["key"] for k, s in local.items()}
    assert {k: s["outputs"] for k, s in cluster_run.items()} == {k: s["outputs"] for k, s in local.items()}


def test_resources_are_not_in_the_keys(runs):
    """Only deploy, which records the recipe file's digest in its provenance, sees the edited file."""
    planned = {k: s["state"] for k, s in _stages(runs["untagged"]).items()}
    assert planned == {**{sid: "cached" for sid in STAGES[:-1]}, "deploy": "will run"}


def test_tagged_stages_ran_on_the_worker_offering_their_resources(runs):
    keys = {k: s["key"] for k, s in _stages(runs["caller"]).items()}
    held = {name: {e.key for e in Cache(w.cache).iter_entries()} for name, w in runs["workers"].items()}
    assert keys["train"] in held["gpu"] and keys["train"] not in held["mem"]
    # export read train's checkpoint from the remote: the worker that ran it never ran train
    assert keys["export"] in held["mem"] and keys["export"] not in held["gpu"]


def test_the_callers_zoo_holds_the_builds_of_a_local_run_and_the_workers_zoos_stay_empty(runs):
    deploy = _stages(runs["caller"])["deploy"]
    assert deploy["effects"] == [{"kind": "published", "ref": "lenet-digits@1.0.0"}]
    zoos = {name: LocalZoo(runs[name]["folder"] / "home") for name in ("caller", "local")}
    manifests = {name: z.resolve("lenet-digits@1.0.0") for name, z in zoos.items()}
    assert set(manifests["caller"].builds) == set(manifests["local"].builds) == \
        {"cpu-fp32", "cpu-int8", "cuda-fp16", "mobile", "openvino-fp32", "openvino-int8", "tensorrt-fp16"}
    for name, build in manifests["local"].builds.items():
        files = {(f.path, f.sha256, f.size) for f in build.all_files()}
        assert {(f.path, f.sha256, f.size) for f in manifests["caller"].builds[name].all_files()} == files, name
        for f in build.all_files():
            assert zoos["caller"].blobs.path(f.sha256).read_bytes() == zoos["local"].blobs.path(f.sha256).read_bytes()
    for w in runs["workers"].values():
        assert LocalZoo(w.home).list() == []


def test_the_version_published_from_a_worker_has_the_timings_of_its_verify_entry(runs):
    """deploy ran on a worker; the caller publishes what a local deploy on that verify result
    publishes: verify's timings (measured on a worker, carried in its entry) in the manifest, and
    the OpenVINO builds' timings deploy measured itself (carried in deploy's entry)."""
    stages = _stages(runs["caller"])
    cache = Cache(runs["caller"]["folder"] / "cache")
    verify, deploy = cache.lookup(stages["verify"]["key"]), cache.lookup(stages["deploy"]["key"])
    published = LocalZoo(runs["caller"]["folder"] / "home").resolve("lenet-digits@1.0.0")
    measured = published.extra["deploy"]["measured"]
    assert measured["builds"] and set(measured["builds"]) <= set(published.builds)
    assert set(deploy.metrics["measured"]) == {"openvino-fp32", "openvino-int8"}
    for name in measured["builds"]:
        timings = {k: v for k, v in published.builds[name].metrics.items() if k.startswith(("latency", "throughput"))}
        source = deploy.metrics["measured"][name]["metrics"] if name.startswith("openvino") \
            else verify.metrics["builds"][name]
        assert timings and all(source[k] == v for k, v in timings.items()), name
        assert published.builds[name].measured_on["runtime"] == ("openvino" if name.startswith("openvino")
                                                                 else "onnxruntime")


def test_a_model_from_parent_in_the_callers_zoo_only_trains_on_the_workers_as_locally(runs):
    """lenet-digits-finetune's train and export read lenet-digits@1.0.0, which only the caller's zoo
    holds: the workers get its pin and ONNX file with the stage, and nothing was pulled there."""
    cluster_run, local = _stages(runs["caller-finetune"]), _stages(runs["local-finetune"])
    assert {s["state"] for s in cluster_run.values()} == {"done"} == {s["state"] for s in local.values()}
    assert {k: s["key"] for k, s in cluster_run.items()} == {k: s["key"] for k, s in local.items()}
    assert {k: s["outputs"] for k, s in cluster_run.items()} == {k: s["outputs"] for k, s in local.items()}
    held = set().union(*({e.key for e in Cache(w.cache).iter_entries()} for w in runs["workers"].values()))
    assert cluster_run["train"]["key"] in held and cluster_run["export"]["key"] in held
    for w in runs["workers"].values():
        assert LocalZoo(w.home).list() == []
    assert LocalZoo(runs["caller"]["folder"] / "home").resolve("lenet-digits-finetune@1.0.0").lineage.sources


def test_the_callers_cache_holds_every_stage(runs):
    cache = Cache(runs["caller"]["folder"] / "cache")
    assert all(cache.lookup(s["key"]) is not None for s in _stages(runs["caller"]).values())
