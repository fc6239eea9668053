"""`zoo remote add NAME --from-dvc REMOTE [--dvc-repo PATH]`: a remote defined in a DVC repo's config
(made with the real `dvc remote add` / `dvc remote modify`), reused with its URL and options, its
credentials left out of zoo's remotes.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cli_helpers import zoo
from dvc_repos import dvc
from zoo.errors import MissingExtra
from zoo.registry import api
from zoo.registry.store import LocalZoo
from registry_servers import make_staging


@pytest.fixture(scope="module")
def dvc_project(tmp_path_factory):
    """A DVC repo (no git needed for its config) with a folder remote given relative to the repo, an
    S3 remote with an endpoint, and a WebDAV one; the secrets in config.local, as DVC advises."""
    repo = tmp_path_factory.mktemp("dvc-config") / "project"
    repo.mkdir()
    dvc(repo, "init", "-q", "--no-scm")
    dvc(repo, "remote", "add", "-d", "storage", "../dvc-store")
    dvc(repo, "remote", "add", "minio", "s3://datasets/team")
    dvc(repo, "remote", "modify", "minio", "endpointurl", "http://127.0.0.1:9000")
    dvc(repo, "remote", "modify", "minio", "region", "eu-west-1")
    dvc(repo, "remote", "modify", "minio", "use_ssl", "false")
    dvc(repo, "remote", "modify", "--local", "minio", "access_key_id", "AKIAEXAMPLE")
    dvc(repo, "remote", "modify", "--local", "minio", "secret_access_key", "s3cr3t-value")
    dvc(repo, "remote", "add", "dav", "webdavs://dav.example.com/data")
    dvc(repo, "remote", "modify", "dav", "user", "bob")
    dvc(repo, "remote", "modify", "--local", "dav", "password", "dav-pa55")
    dvc(repo, "remote", "add", "gcs", "gs://bucket/path")
    dvc(repo, "remote", "modify", "gcs", "projectname", "vision-team")
    dvc(repo, "remote", "modify", "--local", "gcs", "credentialpath", "/secrets/sa.json")
    dvc(repo, "remote", "add", "blob", "azure://datasets/team")
    dvc(repo, "remote", "modify", "blob", "account_name", "zoostore")
    dvc(repo, "remote", "modify", "--local", "blob", "account_key", "azure-k3y")
    dvc(repo, "remote", "add", "box", "ssh://build-box/srv/dvc")
    dvc(repo, "remote", "modify", "box", "user", "ci")
    dvc(repo, "remote", "modify", "box", "port", "2222")
    dvc(repo, "remote", "modify", "box", "keyfile", "/home/ci/.ssh/id_ed25519")
    dvc(repo, "remote", "modify", "--local", "box", "password", "ssh-pa55")
    dvc(repo, "remote", "add", "hadoop", "hdfs://namenode/data")
    return repo


def _remotes_file() -> Path:
    """Where `zoo remote add` keeps the remotes (the user's config folder: zoo.registry.config)."""
    from zoo.registry.config import RemotesConfig

    return RemotesConfig(LocalZoo().root).path


def _remotes() -> dict:
    return json.loads(_remotes_file().read_text())


def test_a_folder_dvc_remote_becomes_a_zoo_remote_that_pushes_beside_dvcs_objects(dvc_project, tmp_path):
    store = dvc_project.parent / "dvc-store"
    (store / "files" / "md5" / "ab").mkdir(parents=True)
    (store / "files" / "md5" / "ab" / "cdef").write_bytes(b"a DVC object")
    added = zoo("remote", "add", "team", "--from-dvc", "storage", "--dvc-repo", dvc_project)
    assert added.code == 0, added.text
    assert f"remote team → {store}" in added.out and "DVC remote 'storage'" in added.out
    [remote] = _remotes()["remotes"]
    assert remote == {"name": "team", "url": str(store), "options": {}, "mirrors": []}
    # the remote works as any folder remote, and DVC's objects stay where they were
    LocalZoo().publish(make_staging(tmp_path / "staging"))
    pushed = zoo("push", "tiny@1.0.0", "--to", "team")
    assert pushed.code == 0, pushed.text
    listed = zoo("list", "--remote", "team", "--json")
    assert [m["name"] for m in json.loads(listed.out)] == ["tiny"], listed.text
    assert (store / "files" / "md5" / "ab" / "cdef").read_bytes() == b"a DVC object"


def test_an_s3_dvc_remote_keeps_its_endpoint_and_region_but_never_its_credentials(dvc_project):
    added = zoo("remote", "add", "data", "--from-dvc", "minio", "--dvc-repo", dvc_project)
    assert added.code == 0, added.text
    [remote] = _remotes()["remotes"]
    assert remote["url"] == "s3://datasets/team"
    assert remote["options"] == {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-west-1"}
    text = _remotes_file().read_text()
    assert "AKIAEXAMPLE" not in text and "s3cr3t-value" not in text
    assert "not copied (credentials): access_key_id, secret_access_key" in added.err and "AWS_ACCESS_KEY_ID" in added.err
    assert "skipped (zoo has no such option): use_ssl" in added.err


def test_a_webdav_dvc_remote_takes_the_password_from_a_variable_given_with_o(dvc_project):
    added = zoo("remote", "add", "dav", "--from-dvc", "dav", "--dvc-repo", dvc_project, "-o", "password_env=DAV_PW")
    assert added.code == 0, added.text
    [remote] = _remotes()["remotes"]
    assert remote["url"] == "webdav+https://dav.example.com/data"
    assert remote["options"] == {"user": "bob", "password_env": "DAV_PW"}
    assert "dav-pa55" not in _remotes_file().read_text()
    assert "not copied (credentials): password" in added.err


@pytest.mark.parametrize("dvc_name, url, options, secret, not_copied", [
    ("gcs", "gs://bucket/path", {"project": "vision-team"}, "/secrets/sa.json", "credentialpath"),
    ("blob", "az://datasets/team", {"account_name": "zoostore"}, "azure-k3y", "account_key"),
    ("box", "ssh://build-box:2222/srv/dvc", {"username": "ci", "key_filename": "/home/ci/.ssh/id_ed25519"},
     "ssh-pa55", "password"),
])
def test_gcs_azure_and_ssh_dvc_remotes_keep_their_settings_but_never_their_credentials(
        dvc_project, dvc_name, url, options, secret, not_copied):
    added = zoo("remote", "add", "r", "--from-dvc", dvc_name, "--dvc-repo", dvc_project)
    assert added.code == 0, added.text
    [remote] = _remotes()["remotes"]
    assert (remote["url"], remote["options"]) == (url, options)
    assert secret not in _remotes_file().read_text()
    assert f"not copied (credentials): {not_copied}" in added.err


def test_what_cannot_be_reused_is_refused_with_a_hint(dvc_project, tmp_path):
    typo = zoo("remote", "add", "x", "--from-dvc", "minoi", "--dvc-repo", dvc_project)
    assert typo.code == 2 and "no remote 'minoi' (did you mean 'minio'?)" in typo.err, typo.text
    hdfs = zoo("remote", "add", "x", "--from-dvc", "hadoop", "--dvc-repo", dvc_project)
    assert hdfs.code == 2 and "zoo has no hdfs remotes" in hdfs.err, hdfs.text
    not_dvc = zoo("remote", "add", "x", "--from-dvc", "storage", "--dvc-repo", tmp_path)
    assert not_dvc.code == 2 and "is not a DVC repo" in not_dvc.err, not_dvc.text
    both = zoo("remote", "add", "x", "s3://b/p", "--from-dvc", "minio", "--dvc-repo", dvc_project)
    neither = zoo("remote", "add", "x")
    assert both.code == neither.code == 2 and "one of them" in both.err and "one of them" in neither.err
    assert not _remotes_file().exists()


def test_without_the_dvc_extra_from_dvc_names_the_pip_install_dvc_hidden_stand_in(dvc_project, monkeypatch):
    """dvc hidden from the import system: a stand-in for an environment without the extra."""
    for name in [m for m in sys.modules if m == "dvc" or m.startswith("dvc.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "dvc", None)
    with pytest.raises(MissingExtra) as e:
        api.remote_add_from_dvc("x", "storage", dvc_repo=Path(dvc_project))
    assert "pip install 'zoo-onnx[dvc]'" in e.value.hint
