"""The zoo commands as a user runs them (`python -m zoo …` in a subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

from cli_helpers import zoo

from zoo.registry.store import LocalZoo
from registry_servers import make_staging

HEAVY = ("onnx", "onnxruntime", "torch", "fsspec", "dvc", "huggingface_hub", "boto3", "s3fs", "gcsfs", "adlfs", "azure",
         "paramiko", "rich", "cyclonedx")


def _publish(tmp_path: Path, **kw) -> LocalZoo:
    z = LocalZoo()  # ZOO_HOME from conftest: the same one the subprocess sees
    z.publish(make_staging(tmp_path / f"s-{kw.get('version', '1.0.0')}", **kw))
    return z


def test_help_imports_nothing_heavy():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "zoo", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "pull" in proc.stdout and "remote" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert not imported & set(HEAVY), imported & set(HEAVY)


def test_list_show_search_pull_tag_rm(tmp_path):
    _publish(tmp_path, builds={"cpu-fp32": {"metrics": {"latency_p50_ms": 2.0, "accuracy": 0.9}},
                               "cpu-int8": {"metrics": {"latency_p50_ms": 1.0, "accuracy": 0.88}}})
    r = zoo("list", "--json")
    assert r.code == 0, r.text
    assert [(m["name"], m["latest"]) for m in json.loads(r.out)] == [("tiny", "1.0.0")]
    r = zoo("list")
    assert r.code == 0 and "tiny" in r.out and "1.0.0" in r.out

    r = zoo("show", "tiny@latest", "--json")
    assert r.code == 0 and sorted(json.loads(r.out)["builds"]) == ["cpu-fp32", "cpu-int8"]
    r = zoo("show", "tiny")
    assert r.code == 0 and "cpu-int8" in r.out and "lineage" in r.out

    r = zoo("search", "tiny", "--max-latency", "1.5", "--json")
    assert [(x["name"], x["build"]) for x in json.loads(r.out)] == [("tiny", "cpu-int8")]

    r = zoo("pull", "tiny")
    assert r.code == 0, r.text
    path = Path(r.out.strip().splitlines()[-1])
    assert path.is_file() and path.parts[-2] == "cpu-int8"
    r = zoo("pull", "tiny@1.0.0", "--build", "cpu-fp32", "--to", tmp_path / "here", "--json")
    assert json.loads(r.out)["path"] == str(tmp_path / "here/builds/cpu-fp32/model.onnx")

    assert zoo("tag", "tiny@1.0.0", "prod").code == 0
    assert json.loads(zoo("show", "tiny@prod", "--json").out)["tags"] == ["latest", "prod"]
    r = zoo("rm", "tiny@1.0.0")
    assert r.code == 0 and "removed tiny@1.0.0" in r.out
    assert json.loads(zoo("list", "--json").out) == []


def test_errors_map_to_exit_codes(tmp_path):
    _publish(tmp_path, name="alexnet")
    r = zoo("pull", "alexnte")
    assert r.code == 2 and "alexnet" in r.err and "hint:" in r.err
    r = zoo("pull", "Bad Name")
    assert r.code == 2
    r = zoo("remote", "add", "s3", "s3://bucket/zoo", "--option", "secret_access_key=abc")
    assert r.code == 2 and "credential" in r.err
    r = zoo("push", "alexnet@1.0.0", "--to", "nowhere")
    assert r.code == 2 and "no remote called" in r.err


def test_push_to_a_folder_remote_and_a_tampered_pull_exits_4(tmp_path):
    z = _publish(tmp_path)
    remote = tmp_path / "remote"
    assert zoo("remote", "add", "team", str(remote)).code == 0
    r = zoo("remote", "list", "--json")
    assert json.loads(r.out)[0]["url"] == str(remote)
    r = zoo("push", "tiny@1.0.0", "--to", "team", "--tag", "prod")
    assert r.code == 0 and "published" in r.out, r.text
    assert [m["name"] for m in json.loads(zoo("list", "--remote", "team", "--json").out)] == ["tiny"]

    blob_sha = z.resolve("tiny@1.0.0").builds["cpu-fp32"].file.sha256
    blob = remote / "blobs/sha256" / blob_sha[:2] / blob_sha
    blob.chmod(0o644)
    blob.write_bytes(blob.read_bytes()[:-1] + b"\x00")
    other = {"ZOO_HOME": str(tmp_path / "other-home")}
    assert zoo("remote", "add", "team", str(remote), env=other).code == 0
    r = zoo("pull", "tiny@prod", "--remote", "team", env=other)
    assert r.code == 4 and "checksum mismatch" in r.err, r.text
    assert not (tmp_path / "other-home/models/tiny/versions").exists()
    assert not any((tmp_path / "other-home/blobs/sha256").glob(f"*/{blob_sha}"))


def test_offline_pull_uses_only_the_cache(tmp_path):
    """With a remote that holds a newer `tiny` and a model the local zoo lacks, `--offline` serves
    the local copy and refuses the rest; the same pulls online reach the remote (the control)."""
    z = _publish(tmp_path)  # tiny@1.0.0, local
    remote = tmp_path / "remote"
    assert zoo("remote", "add", "team", str(remote)).code == 0
    for name, version in (("tiny", "2.0.0"), ("other", "1.0.0")):
        z.publish(make_staging(tmp_path / f"s-{name}-{version}", name=name, version=version, scale=7.0))
        assert zoo("push", f"{name}@{version}", "--to", "team").code == 0
        assert zoo("rm", f"{name}@{version}").code == 0
    assert [(m["name"], m["latest"]) for m in json.loads(zoo("list", "--json").out)] == [("tiny", "1.0.0")]

    r = zoo("pull", "tiny", "--offline", "--json")
    assert r.code == 0, r.text
    got = json.loads(r.out)
    assert (got["version"], got["source"], got["downloaded_files"]) == ("1.0.0", "local", 0)
    r = zoo("pull", "other", "--offline")
    assert r.code == 2 and "other@latest is not in the local zoo (offline)" in r.err, r.text
    assert [(m["name"], m["latest"]) for m in json.loads(zoo("list", "--json").out)] == [("tiny", "1.0.0")]

    # online, the same pulls use the remote: what --offline left alone was really there
    r = zoo("pull", "tiny", "--json")
    assert r.code == 0, r.text
    assert (json.loads(r.out)["version"], json.loads(r.out)["source"]) == ("2.0.0", "team")
    r = zoo("pull", "other", "--json")
    assert r.code == 0 and json.loads(r.out)["source"] == "team", r.text
