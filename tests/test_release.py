"""`zoo release` end to end: lenet-digits to a moto S3 server on 127.0.0.1, pulled back into a fresh
ZOO_HOME; reruns are no-ops, a stale lock / other version / other bytes are refused.

One lenet run for the whole module (training costs ~10 s); later scenarios only rerun deploy.
The tests run in file order and share the module's recipe folder, cache, zoo and remote.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from cli_helpers import zoo as zoo_cli
from conftest import REPO
from zoo.engine import lockfile
from zoo.registry import api as registry
from zoo.registry.store import LocalZoo
from registry_servers import moto_s3

pytestmark = pytest.mark.slow
REF = "lenet-digits@1.0.0"
BUILDS = {"cpu-fp32", "cpu-int8", "cuda-fp16", "mobile", "openvino-fp32", "openvino-int8", "tensorrt-fp16"}


@pytest.fixture(scope="module")
def s3():
    with moto_s3("zoo") as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def rel(tmp_path_factory, s3):
    """lenet-digits in its own folder, cache and zoo, with an S3 remote `prod`; released once as 1.0.0."""
    base = tmp_path_factory.mktemp("release")
    recipe = base / "lenet-digits.yaml"
    shutil.copy(REPO / "recipes" / "lenet-digits.yaml", recipe)
    env = {"ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home"), "ZOO_CONFIG_DIR": str(base / "config")}
    ctx = {"base": base, "recipe": recipe, "env": env, "endpoint": s3, "url": "s3://zoo/releases"}
    cli = zoo_cli("remote", "add", "prod", ctx["url"], "--option", f"endpoint_url={s3}", env=env)
    assert cli.code == 0, cli.text
    # the tests' own calls open this zoo by its folder, under another user config folder: its own remote
    registry.remote_add("prod", ctx["url"], options={"endpoint_url": s3}, zoo=LocalZoo(base / "home"))
    # no lockfile yet: a release refuses to guess what it should be, and runs nothing
    ctx["unlocked"] = zoo_cli("release", recipe, "--version", "1.0.0", "--to", "prod", env=env)
    cli = zoo_cli("run", recipe, env=env, timeout=900)
    assert cli.code == 0, cli.text
    ctx["lock_before"] = (base / "lenet-digits.lock").read_text()
    cli = zoo_cli("release", recipe, "--version", "1.0.0", "--to", "prod", "--tag", "prod", "--json", env=env)
    assert cli.code == 0, cli.text
    ctx["first"] = json.loads(cli.out)
    return ctx


def _release(rel, *args: str, version: str = "1.0.0", recipe: Path | None = None):
    return zoo_cli("release", recipe or rel["recipe"], "--version", version, "--to", "prod", *args, env=rel["env"],
                   timeout=900)


def _remote_manifest(rel, home: Path, ref: str):
    zoo = LocalZoo(home)
    registry.remote_add("prod", rel["url"], options={"endpoint_url": rel["endpoint"]}, zoo=zoo, replace=True)
    return registry.show(ref, remote="prod", zoo=zoo)


def test_release_without_a_lockfile_is_refused(rel):
    cli = rel["unlocked"]
    assert cli.code == 1, cli.text
    assert "not in the lockfile" in cli.err and "nothing was released" in cli.err
    assert "--allow-stale-lock" in cli.err


def test_first_release_runs_nothing_and_uploads_every_file(rel):
    first = rel["first"]
    assert first["ref"] == REF and first["remote"] == "prod" and first["tags"] == ["prod"]
    assert first["executed"] == [] and len(first["cached"]) == 6  # `zoo run` built everything
    assert first["created"] is True and first["uploaded"] > 0 and first["noop"] is False
    assert set(first["builds"]) == BUILDS
    assert set(first["files"]) == {"zoo.lock", "provenance.intoto.json"}
    assert any(g["gate"] == "cpu-fp32.accuracy >= 0.9" and g["passed"] for g in first["gates"])
    assert (rel["base"] / "lenet-digits.lock").read_text() == rel["lock_before"]  # --frozen: untouched
    assert LocalZoo(Path(rel["env"]["ZOO_HOME"])).read_tag("lenet-digits", "prod") == "1.0.0"


def test_pull_back_into_a_fresh_zoo_home(rel, tmp_path):
    home = tmp_path / "fresh-home"
    env = {"ZOO_HOME": str(home), "ZOO_CACHE_DIR": str(tmp_path / "fresh-cache")}
    cli = zoo_cli("remote", "add", "prod", rel["url"], "--option", f"endpoint_url={rel['endpoint']}", env=env)
    assert cli.code == 0, cli.text
    dest = tmp_path / "pulled"
    for build in sorted(BUILDS):
        cli = zoo_cli("pull", "lenet-digits@prod", "--build", build, "--to", dest, env=env)
        assert cli.code == 0, cli.text
    manifest = LocalZoo(home).resolve(REF)
    sha = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    for name, build in manifest.builds.items():
        assert build.file.sha256 == rel["first"]["builds"][name]
        for f in build.all_files():
            assert sha(dest / f.path) == f.sha256, f.path
    for f in manifest.files:
        assert sha(dest / f.path) == rel["first"]["files"][f.path]
    # the released lockfile pins every stage the recipe's own lockfile does, with the same outputs
    import yaml

    from zoo.host import platform_class

    released = yaml.safe_load((dest / "zoo.lock").read_text())
    recipe_lock = yaml.safe_load(rel["lock_before"])
    assert released["recipe"] == recipe_lock["recipe"]
    # the release's records name no platform class (its bytes depend on its records alone); the
    # recipe's lock files them under the class of this machine, which built them
    (records,) = released["platforms"].values()
    ours = recipe_lock["platforms"][platform_class()]
    assert list(released["platforms"]) == ["unknown"] and set(records) == set(ours) - {"deploy"}
    for sid, stage in records.items():
        assert lockfile.record_identity(stage) == lockfile.record_identity(ours[sid])  # what built them
        assert stage["outputs"] == ours[sid]["outputs"] and "key" not in stage and "code" not in stage
    stmt = json.loads((dest / "provenance.intoto.json").read_text())
    subjects = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    assert subjects == {f.path: f.sha256 for b in manifest.builds.values() for f in b.all_files()}
    assert stmt["predicate"]["buildDefinition"]["externalParameters"]["recipe"]["name"] == "lenet-digits"
    # and every shipped ONNX model says where it came from
    import onnx

    props = {p.key: p.value for p in onnx.load(str(dest / "builds/cpu-int8/model.onnx")).metadata_props}
    assert props["zoo.recipe"] == REF and props["zoo.build"] == "cpu-int8" and props["zoo.license"] == "CC-BY-4.0"
    assert "## Provenance" in (dest / "README.md").read_text()


def test_rerunning_the_same_release_is_a_no_op(rel):
    cli = _release(rel, "--tag", "prod", "--json")
    assert cli.code == 0, cli.text
    again = json.loads(cli.out)
    assert again["noop"] is True and again["created"] is False and again["uploaded"] == 0
    assert again["builds"] == rel["first"]["builds"] and again["files"] == rel["first"]["files"]
    cli = _release(rel)  # the human-readable form says so too
    assert cli.code == 0 and "already on prod with the same bytes" in cli.out, cli.text


def test_a_release_to_an_empty_folder_uploads_every_file_and_finds_none_there(rel, tmp_path):
    """`--to` takes a folder; on an empty remote nothing is "already there" (builds sharing test
    vectors share a blob: it goes up once and is counted once); the stages show on stderr."""
    folder = tmp_path / "empty-remote"
    cli = zoo_cli("release", rel["recipe"], "--version", "1.0.0", "--to", folder, env=rel["env"], timeout=900)
    assert cli.code == 0, cli.text
    [line] = [x for x in cli.out.splitlines() if x.startswith("published")]
    blobs = [p for p in (folder / "blobs").rglob("*") if p.is_file()]
    assert line.startswith(f"published {REF} to {folder}: {len(blobs)} file(s) uploaded (")
    assert line.endswith(" KB)") or line.endswith(" MB)")
    assert "already there" not in line
    assert "[zoo] train: cached" in cli.err and "[zoo] deploy: cached" in cli.err


def test_a_release_to_an_oci_registry_is_pulled_back_verified(rel, tmp_path):
    """`--to oci://…`: the same release to Debian's docker-registry on 127.0.0.1 (nothing reruns);
    a fresh zoo pulls the int8 build by the release's tag, and a plain OCI client's view of the
    version names every file with its digest."""
    from registry_servers import docker_registry

    with docker_registry(tmp_path / "registry") as host:
        url = f"oci://{host}/releases"
        cli = zoo_cli("release", rel["recipe"], "--version", "1.0.0", "--to", url, "--tag", "prod", env=rel["env"],
                      timeout=900)
        assert cli.code == 0, cli.text
        assert "[zoo] deploy: cached" in cli.err
        env = {"ZOO_HOME": str(tmp_path / "fresh-home"), "ZOO_CACHE_DIR": str(tmp_path / "fresh-cache")}
        cli = zoo_cli("pull", "lenet-digits@prod", "--remote", url, "--build", "cpu-int8", "--to", tmp_path / "out", env=env)
        assert cli.code == 0, cli.text
        manifest = LocalZoo(tmp_path / "fresh-home").resolve(REF)
        f = manifest.builds["cpu-int8"].file
        assert hashlib.sha256((tmp_path / "out" / f.path).read_bytes()).hexdigest() == f.sha256 == rel["first"]["builds"]["cpu-int8"]
        import oras.client

        oci = oras.client.OrasClient(hostname=host, insecure=True).get_manifest(f"{host}/releases/lenet-digits:1.0.0")
        digests = {d["annotations"]["org.cncf.model.filepath"]: d["digest"] for d in oci["layers"]}
        assert {p: d for p, d in digests.items() if p in rel["first"]["files"]} == \
            {p: f"sha256:{sha}" for p, sha in rel["first"]["files"].items()}


def test_a_code_change_that_moves_no_byte_releases_the_same_bytes_with_a_note(rel, tmp_path):
    """Another kind epoch (zoo.stage.KIND_EPOCH: in every key, in no lock record) stands for an
    upgrade of zoo that changed the kinds' code: every stage rebuilds, the bytes are the locked ones,
    so the release is the same (a no-op) and says why the stages ran."""
    (tmp_path / "sitecustomize.py").write_text("import zoo.stage\nzoo.stage.KIND_EPOCH += 1\n")
    env = dict(rel["env"], PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    cli = zoo_cli("release", rel["recipe"], "--version", "1.0.0", "--to", "prod", "--json", env=env, timeout=900)
    assert cli.code == 0, cli.text
    out = json.loads(cli.out)
    assert out["created"] is False and out["uploaded"] == 0 and len(out["executed"]) == 6  # the same version
    assert any("train: rebuilt (code changed: kind epoch 1 → 2)" in n for n in out["notes"]), out["notes"]
    assert (rel["base"] / "lenet-digits.lock").read_text() == rel["lock_before"]


def test_version_must_match_the_recipe(rel):
    cli = _release(rel, version="9.9.9")
    assert cli.code == 2, cli.text
    assert "does not match the recipe's version 1.0.0" in cli.err and "version: 9.9.9" in cli.err


def test_stale_lock_is_refused_unless_allowed(rel):
    recipe = rel["recipe"]
    recipe.write_text(recipe.read_text().replace("version: 1.0.0", "version: 1.0.1"))
    cli = _release(rel, version="1.0.1")
    assert cli.code == 1, cli.text
    assert "deploy: would run" in cli.err and "nothing was released" in cli.err
    assert (rel["base"] / "lenet-digits.lock").read_text() == rel["lock_before"]
    assert [v.version for v in registry.list_versions("lenet-digits", remote="prod",
                                                      zoo=LocalZoo(Path(rel["env"]["ZOO_HOME"])))] == ["1.0.0"]
    cli = _release(rel, "--allow-stale-lock", "--json", version="1.0.1")
    assert cli.code == 0, cli.text
    out = json.loads(cli.out)
    # the version is in deploy's key only: nothing is retrained, the lockfile now records 1.0.1
    assert out["executed"] == ["deploy"] and out["lock_changed"] is True and out["created"] is True
    assert "version: 1.0.1" in (rel["base"] / "lenet-digits.lock").read_text()
    assert out["builds"]["cpu-fp32"] != rel["first"]["builds"]["cpu-fp32"]  # its stamp names the new version
    assert _remote_manifest(rel, rel["base"] / "reader", "lenet-digits@1.0.1")["version"] == "1.0.1"


def test_other_bytes_under_a_released_version_are_refused(rel):
    home = Path(rel["env"]["ZOO_HOME"])
    remote_before = _remote_manifest(rel, rel["base"] / "reader", "lenet-digits@1.0.1")
    recipe = rel["recipe"]
    original = recipe.read_text()
    changed = original.replace("    config:\n      builds:\n        cpu-fp32",
                               "    config:\n      intended_use: Something else.\n      builds:\n        cpu-fp32")
    assert changed != original
    recipe.write_text(changed)
    # the local zoo already holds 1.0.1: deploy's publish is refused
    cli = _release(rel, "--allow-stale-lock", version="1.0.1")
    assert cli.code == 3 and "already published with different content" in cli.err, cli.text
    # without the local copy, deploy publishes other bytes locally: the remote refuses them
    assert zoo_cli("rm", "lenet-digits@1.0.1", env=rel["env"]).code == 0
    cli = _release(rel, "--allow-stale-lock", version="1.0.1")
    assert cli.code == 3 and "already on remote prod with different content" in cli.err, cli.text
    after = _remote_manifest(rel, rel["base"] / "reader", "lenet-digits@1.0.1")
    assert after["card"] == remote_before["card"] and after["builds"] == remote_before["builds"]
    # back to the released recipe: deploy is cached, and re-publishing its cached release into the
    # local zoo (which now holds the other bytes) is refused before anything reaches the remote
    recipe.write_text(original)
    cli = _release(rel, "--allow-stale-lock", version="1.0.1")
    assert cli.code == 3 and "already published with different content" in cli.err, cli.text
    assert "nothing was published to prod" in cli.err
    assert LocalZoo(home).resolve("lenet-digits@1.0.1").card.sha256 != remote_before["card"]["sha256"]


def test_a_failing_gate_fails_the_release_and_publishes_nothing(rel):
    folder = rel["base"] / "strict"
    folder.mkdir()
    recipe = folder / "lenet-digits.yaml"
    text = (REPO / "recipes" / "lenet-digits.yaml").read_text()
    strict = text.replace("- cpu-fp32.accuracy >= 0.9", "- cpu-fp32.accuracy >= 0.9999")
    assert strict != text
    recipe.write_text(strict.replace("version: 1.0.0", "version: 1.0.2"))
    cli = _release(rel, "--allow-stale-lock", version="1.0.2", recipe=recipe)
    assert cli.code == 1, cli.text
    assert "stage verify failed" in cli.err and "cpu-fp32.accuracy" in cli.err and "nothing was published" in cli.err
    home = LocalZoo(Path(rel["env"]["ZOO_HOME"]))
    assert home.get("lenet-digits", "1.0.2") is None
    assert "1.0.2" not in [v.version for v in registry.list_versions("lenet-digits", remote="prod", zoo=home)]


RECIPE_WITHOUT_DEPLOY = """\
schema_version: 1
name: chain
version: 0.1.0
stages:
  a:
    kind: writer
"""


def test_refusals_before_anything_runs(tmp_path):
    from zoo.errors import InvalidInput, NotFound
    from zoo.release.ship import release

    recipe = tmp_path / "chain.yaml"
    recipe.write_text(RECIPE_WITHOUT_DEPLOY)
    zoo = LocalZoo()
    registry.remote_add("web", "https://models.example.org/zoo", zoo=zoo)
    with pytest.raises(InvalidInput, match="no stage that publishes the version"):
        release(recipe, version="0.1.0", to="web")
    lenet = tmp_path / "lenet-digits.yaml"
    shutil.copy(REPO / "recipes" / "lenet-digits.yaml", lenet)
    with pytest.raises(NotFound, match="no remote called 'nowhere'"):
        release(lenet, version="1.0.0", to="nowhere")
    with pytest.raises(InvalidInput, match="read-only"):
        release(lenet, version="1.0.0", to="web")
    with pytest.raises(InvalidInput, match="`latest` cannot be set"):
        release(lenet, version="1.0.0", to="web", tags=["latest"])
    with pytest.raises(InvalidInput, match="invalid version"):
        release(lenet, version="v1", to="web")
    assert not (tmp_path / "lenet-digits.lock").exists() and zoo.list() == []  # nothing ran
