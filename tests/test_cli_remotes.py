"""Remote options take a name, a folder or a URL (`push --to`, `pull/list/show/search --remote`,
`remote gc`), and the user's named remotes work whichever ZOO_HOME is set (zoo/registry/config.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cli_helpers import zoo
from registry_servers import make_staging

from zoo.registry.store import LocalZoo


def _publish(tmp_path: Path) -> LocalZoo:
    z = LocalZoo()  # ZOO_HOME from conftest: the same one the subprocess sees
    z.publish(make_staging(tmp_path / "staging"))
    return z


def test_a_folder_works_wherever_a_remote_is_asked_for(tmp_path):
    _publish(tmp_path)
    folder = tmp_path / "shared"
    r = zoo("push", "tiny@1.0.0", "--to", folder)
    assert r.code == 0, r.text
    assert f"tiny@1.0.0 → {folder}: published" in r.out and "bytes" not in r.out  # a size, not a byte count
    assert (folder / "models" / "tiny").is_dir()
    r = zoo("push", "tiny@1.0.0", "--to", folder)
    assert r.code == 0 and r.out.strip() == f"tiny@1.0.0 → {folder}: already there (same content); nothing to upload"

    # relative to the working folder, written ./…
    r = zoo("list", "--remote", "./shared", "--json", cwd=tmp_path)
    assert r.code == 0, r.text
    assert [m["name"] for m in json.loads(r.out)] == ["tiny"]
    r = zoo("search", "tiny", "--remote", str(folder), "--json")
    assert r.code == 0 and {row["build"] for row in json.loads(r.out)} == {"cpu-fp32"}
    r = zoo("show", "tiny@1.0.0", "--remote", str(folder), "--json")
    assert r.code == 0 and json.loads(r.out)["source"] == str(folder)

    # a consumer with another local zoo pulls from the folder, and is told a size
    fresh = {"ZOO_HOME": str(tmp_path / "fresh-home")}
    r = zoo("pull", "tiny", "--remote", str(folder), env=fresh)
    assert r.code == 0, r.text
    assert Path(r.out.strip()).is_file()
    assert "verified" in r.err and " bytes" not in r.err and ("KB" in r.err or " B " in r.err), r.err

    r = zoo("remote", "gc", str(folder), "--dry-run")
    assert r.code == 0 and f"remote {folder}: would free 0 blob(s), 0 B" in r.out, r.text


def test_a_url_works_as_a_remote(tmp_path, http_site):
    url, root = http_site
    _publish(tmp_path)
    assert zoo("push", "tiny@1.0.0", "--to", root).code == 0
    fresh = {"ZOO_HOME": str(tmp_path / "fresh-home")}
    r = zoo("pull", "tiny@1.0.0", "--remote", url, "--json", env=fresh)
    assert r.code == 0, r.text
    assert json.loads(r.out)["downloaded_files"] >= 1
    r = zoo("push", "tiny@1.0.0", "--to", url)  # plain https is read-only
    assert r.code != 0 and "read-only" in r.err.lower() and "Traceback" not in r.err, r.text


def test_what_is_neither_a_name_nor_a_folder_or_url_is_refused_with_the_forms(tmp_path):
    _publish(tmp_path)
    (tmp_path / "team" / "sub").mkdir(parents=True)
    r = zoo("push", "tiny@1.0.0", "--to", "ftp://host/zoo")
    assert r.code == 2 and "unsupported remote URL 'ftp://host/zoo'" in r.err and "s3://" in r.err, r.text
    r = zoo("push", "tiny@1.0.0", "--to", "team/sub", cwd=tmp_path)  # a relative path without ./
    assert r.code == 2 and "'team/sub' is neither a remote name nor a folder or URL" in r.err, r.text
    assert "write ./team/sub" in r.err
    r = zoo("pull", "tiny", "--remote", "team", cwd=tmp_path)  # a bare word is a name, never a folder
    assert r.code == 2 and "no remote called 'team'" in r.err and "write ./team" in r.err, r.text
    assert not (tmp_path / "team" / "models").exists()
    r = zoo("push", "tiny@1.0.0", "--to", "", "--json")
    assert r.code == 2 and json.loads(r.out)["error"]["message"] == "the remote is empty"


def test_a_configured_name_wins_over_a_folder_of_that_name(tmp_path):
    _publish(tmp_path)
    (tmp_path / "team").mkdir()
    assert zoo("remote", "add", "team", tmp_path / "configured").code == 0
    r = zoo("push", "tiny@1.0.0", "--to", "team", cwd=tmp_path)
    assert r.code == 0, r.text
    assert (tmp_path / "configured" / "models" / "tiny").is_dir()
    assert not any((tmp_path / "team").iterdir())
    r = zoo("push", "tiny@1.0.0", "--to", "./team", cwd=tmp_path)  # the folder, written as a path
    assert r.code == 0 and (tmp_path / "team" / "models" / "tiny").is_dir(), r.text


def test_named_remotes_are_the_users_whichever_zoo_home(tmp_path):
    config = Path(os.environ["ZOO_CONFIG_DIR"])
    home_a, home_b = {"ZOO_HOME": str(tmp_path / "a")}, {"ZOO_HOME": str(tmp_path / "b")}
    r = zoo("remote", "add", "team", tmp_path / "team-zoo", env=home_a)
    assert r.code == 0 and str(config / "remotes.json") in r.out, r.text
    assert not (tmp_path / "a" / "remotes.json").exists()
    r = zoo("remote", "list", "--json", env=home_b)
    assert [(x["name"], x["url"]) for x in json.loads(r.out)] == [("team", str(tmp_path / "team-zoo"))]
    # the same definition again (a set-up script run twice) is fine; another one is refused
    assert zoo("remote", "add", "team", tmp_path / "team-zoo", env=home_b).code == 0
    r = zoo("remote", "add", "team", tmp_path / "elsewhere", env=home_b)
    assert r.code == 2 and "already exists" in r.err


def test_remotes_kept_in_a_zoo_home_are_still_read_and_the_users_win(tmp_path):
    old_home = tmp_path / "old-home"
    old_home.mkdir()
    legacy = {"schema_version": 1, "remotes": [{"name": "old", "url": str(tmp_path / "old-zoo")},
                                               {"name": "team", "url": str(tmp_path / "stale")}]}
    (old_home / "remotes.json").write_text(json.dumps(legacy))
    env = {"ZOO_HOME": str(old_home)}
    r = zoo("remote", "add", "team", tmp_path / "current", env=env)  # this zoo defines it already
    assert r.code == 2 and f"already exists, at {tmp_path / 'stale'}" in r.err, r.text
    assert zoo("remote", "add", "team", tmp_path / "current").code == 0  # added while another ZOO_HOME is set
    r = zoo("remote", "list", "--json", env=env)
    assert [(x["name"], x["url"]) for x in json.loads(r.out)] == [("team", str(tmp_path / "current")),
                                                                  ("old", str(tmp_path / "old-zoo"))]
    assert zoo("remote", "list", "--json").out.count('"name"') == 1  # another ZOO_HOME: the user's only
    r = zoo("remote", "list", env=env)  # says where each comes from
    assert f"note: team kept in {os.environ['ZOO_CONFIG_DIR']}/remotes.json" in r.err, r.err
    assert f"note: old kept in {old_home / 'remotes.json'}" in r.err
    assert zoo("remote", "remove", "team", env=env).code == 0  # from both files: the stale one does not come back
    assert [x["name"] for x in json.loads(zoo("remote", "list", "--json", env=env).out)] == ["old"]
    assert "team" not in (old_home / "remotes.json").read_text()


def test_a_project_config_cannot_define_or_redirect_a_named_remote(tmp_path):
    """A project's .zoo/config.yaml may name a remote run cache, never define or shadow a remote name."""
    project = tmp_path / "project"
    (project / ".zoo").mkdir(parents=True)
    (project / ".zoo" / "config.yaml").write_text(
        "schema_version: 1\ncache: {remote: team}\nremotes: {team: /tmp/evil}\n")
    assert zoo("remote", "add", "team", tmp_path / "team-zoo").code == 0
    r = zoo("cache", "status", "--json", cwd=project)
    assert r.code == 2 and "unknown setting remotes" in json.loads(r.out)["error"]["message"], r.text
    (project / ".zoo" / "config.yaml").write_text("schema_version: 1\ncache: {remote: team}\n")
    r = zoo("cache", "status", "--json", cwd=project)
    assert r.code == 0, r.text
    assert json.loads(r.out)["remote"] == f"{tmp_path / 'team-zoo'}/run-cache"


def test_a_zoo_opened_by_its_folder_sees_the_users_remotes_and_its_own_first(tmp_path):
    from zoo.errors import InvalidInput
    from zoo.registry import api

    _publish(tmp_path)
    assert zoo("remote", "add", "team", tmp_path / "team-zoo").code == 0
    assert zoo("push", "tiny@1.0.0", "--to", "team").code == 0
    other = LocalZoo(tmp_path / "other")  # not $ZOO_HOME's
    assert [m.name for m in api.list_models(remote="team", zoo=other)] == ["tiny"]
    api.remote_add("team", str(tmp_path / "its-own"), zoo=other, replace=True)  # into its own remotes.json
    assert api.remote_list(zoo=other)[0]["url"] == str(tmp_path / "its-own")
    assert json.loads(zoo("remote", "list", "--json").out)[0]["url"] == str(tmp_path / "team-zoo")  # untouched
    api.remote_remove("team", zoo=other)
    assert api.remote_list(zoo=other)[0]["url"] == str(tmp_path / "team-zoo")  # the user's again
    import pytest

    with pytest.raises(InvalidInput, match="is defined in"):
        api.remote_remove("team", zoo=other)  # never the user's config through another zoo


def test_the_site_of_a_folder_remote_is_built_and_published_to_a_folder(tmp_path):
    _publish(tmp_path)
    assert zoo("push", "tiny@1.0.0", "--to", tmp_path / "shared").code == 0
    r = zoo("site", "build", "-o", tmp_path / "site", "--remote", tmp_path / "shared", "--json")
    assert r.code == 0, r.text
    assert json.loads(r.out)["models"] == 1
    r = zoo("site", "publish", tmp_path / "site", "--to", "./shared", "--json", cwd=tmp_path)
    assert r.code == 0, r.text
    assert (tmp_path / "shared" / "site" / "index.html").is_file()
