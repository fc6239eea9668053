"""A cloned project's `.zoo/config.yaml` is the project author's, not the user's: until the user
approves that exact file (`zoo config allow`), it may name a remote run cache to read from, but
not set credential options (which of the user's secrets zoo sends, and where) and not push. Every
command says which remote run cache it talks to and which file (or flag) chose it. Checked through
the CLI against a real wsgidav server on 127.0.0.1 that records the Authorization headers it gets."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from cli_helpers import write_recipe, zoo

SECRET = "ghp_the-users-own-token"
RECIPE = """\
schema_version: 1
name: trusted
version: 0.1.0
stages:
  a: {kind: writer, config: {text: "abc"}}
"""


@pytest.fixture(scope="module")
def recording_dav(tmp_path_factory):
    """wsgidav on 127.0.0.1 that accepts user `ci` with the secret (as the attacker's server would:
    whatever it is sent works) and records every Authorization header; yields (base URL, headers)."""
    import logging

    from wsgidav.wsgidav_app import WsgiDAVApp

    from registry_servers import _cheroot

    root = tmp_path_factory.mktemp("dav")
    app = WsgiDAVApp({
        "provider_mapping": {"/": str(root)},
        "http_authenticator": {"domain_controller": None, "accept_basic": True, "accept_digest": False,
                               "default_to_digest": False},
        "simple_dc": {"user_mapping": {"*": {"ci": {"password": SECRET}}}},
        "verbose": 0, "logging": {"enable": False, "enable_loggers": []},
        "property_manager": True, "lock_storage": True,
    })
    logging.getLogger("wsgidav").setLevel(logging.ERROR)
    headers: list[str] = []

    def recording(environ, start_response):
        headers.append(environ.get("HTTP_AUTHORIZATION", ""))
        return app(environ, start_response)

    with _cheroot(recording) as port:
        yield f"http://127.0.0.1:{port}", headers


def _project(tmp_path: Path, cache: str) -> tuple[Path, Path]:
    """A cloned project: its recipe and its `.zoo/config.yaml` holding `cache`."""
    project = tmp_path / "cloned"
    (project / ".zoo").mkdir(parents=True)
    config = project / ".zoo" / "config.yaml"
    config.write_text(f"schema_version: 1\ncache:\n{cache}")
    return write_recipe(project, RECIPE), config


def _secret_sent(headers: list[str]) -> bool:
    return any(SECRET in base64.b64decode(h.split(" ", 1)[1]).decode() for h in headers if h.startswith("Basic "))


def test_an_unapproved_project_config_cannot_send_the_users_token(tmp_path, recording_dav):
    base, headers = recording_dav
    recipe, config = _project(tmp_path, f"  remote: webdav+{base}/c\n  options:\n    user: ci\n"
                                        "    password_env: GITHUB_TOKEN\n")
    env = {"GITHUB_TOKEN": SECRET}
    headers.clear()
    for command in (["plan", recipe], ["run", recipe], ["status", recipe], ["cache", "status"]):
        got = zoo(*command, env=env, cwd=recipe.parent)
        assert got.code == 2, (command, got.text)
        error = [line for line in got.err.splitlines() if line.startswith("error:")]
        assert error == [f"error: {config}:5: cache.options.user: a project's config may not set user until you "
                         "approve the file (it decides which of your credentials zoo sends, or where)"], got.err
        assert f"zoo config allow {config}" in got.err and "Traceback" not in got.err
    assert headers == [] and not _secret_sent(headers)

    # the user reads the file and approves it: now zoo uses it, and says which remote and which file
    allowed = zoo("config", "allow", config, "--json", env=env)
    assert allowed.code == 0, allowed.text
    approval = json.loads(allowed.out)
    assert approval["sha256"] and approval["path"] == str(config)
    assert approval["sets"] == f"remote run cache webdav+{base}/c, options user=ci, password_env=GITHUB_TOKEN, pushes"
    planned = zoo("plan", recipe, "--json", env=env)
    assert planned.code == 0, planned.text
    assert planned.err == ""  # --json: the document names it (below), people's line is not printed
    assert f"remote run cache: webdav+{base}/c (from {config})" in zoo("plan", recipe, env=env).err
    out = json.loads(planned.out)
    assert (out["cache_remote"], out["cache_remote_origin"], out["cache_remote_push"]) == (f"webdav+{base}/c",
                                                                                          str(config), True)
    assert _secret_sent(headers)  # the positive control: approved, the secret is what it sends

    # a changed file is a new, unapproved file
    headers.clear()
    config.write_text(config.read_text() + "# changed upstream\n")
    again = zoo("plan", recipe, env=env)
    assert again.code == 2 and "may not set user" in again.err
    assert headers == []


def test_an_unapproved_project_config_reads_its_remote_but_pushes_nothing(tmp_path):
    remote = tmp_path / "project-remote"
    recipe, config = _project(tmp_path, f"  remote: {remote}\n  options: {{gc_grace: 60}}\n")
    ran = zoo("run", recipe, "--json")
    assert ran.code == 0, ran.text
    out = json.loads(ran.out)
    assert (out["cache_remote"], out["cache_remote_origin"], out["cache_remote_push"]) == (str(remote), str(config),
                                                                                          False)
    assert ran.err == ""  # --json: the notes and the remote are in the document
    assert f"remote run cache: {remote} (from {config}, read only)" in zoo("plan", recipe).err
    assert any("you have not approved" in n and f"zoo config allow {config}" in n for n in out["notes"])
    assert not list(remote.rglob("*.json"))  # nothing was pushed where the project chose

    pushed = zoo("cache", "push", recipe)
    assert pushed.code == 2 and f"{config}: `zoo cache push` pushes only to a remote you chose" in pushed.err
    assert not list(remote.rglob("*.json"))

    assert zoo("config", "allow", cwd=recipe.parent).code == 0  # the nearest project config
    again = zoo("run", recipe, "-f", "--json")
    assert again.code == 0 and json.loads(again.out)["cache_remote_push"] is True
    assert len(list((remote / "entries").rglob("*.json"))) == 1

    assert zoo("config", "deny", config).code == 0
    assert json.loads(zoo("plan", recipe, "--json").out)["cache_remote_push"] is False

    config.write_text("schema_version: 1\ncache: {remote: " + "[" * 100 + "]" * 100 + "}\n")
    refused = zoo("config", "allow", config)  # what zoo cannot read is not approved
    assert refused.code == 2 and "nests deeper than 64 levels" in refused.err
    assert zoo("config", "allow", tmp_path / "nowhere").code == 2


def test_the_users_own_config_and_the_flag_are_named_as_the_origin(tmp_path):
    recipe, _ = _project(tmp_path, "  remote: none\n")
    (tmp_path / "cloned" / ".zoo" / "config.yaml").unlink()
    home = Path(os.environ["ZOO_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    user_remote = tmp_path / "user-remote"
    (home / "config.yaml").write_text(f"schema_version: 1\ncache: {{remote: {user_remote}}}\n")
    ran = zoo("run", recipe, "--json")
    out = json.loads(ran.out)
    assert (out["cache_remote_origin"], out["cache_remote_push"]) == (str(home / "config.yaml"), True)
    assert ran.err == ""
    assert f"remote run cache: {user_remote} (from {home / 'config.yaml'})" in zoo("plan", recipe).err
    flagged = zoo("plan", recipe, "--json", "--cache-remote", str(tmp_path / "flag-remote"))
    assert json.loads(flagged.out)["cache_remote_origin"] == "--cache-remote"
    status = zoo("cache", "status", "--json", "--remote", str(user_remote))
    assert status.code == 0, status.text
    assert json.loads(status.out)["remote_origin"] == "--remote"
    assert status.err == ""
    assert f"remote run cache: {user_remote} (from --remote)" in zoo("cache", "status", "--remote", str(user_remote)).err


def test_a_password_is_never_sent_over_plain_http_to_another_host(tmp_path, recording_dav):
    """Even the user's own config: Basic auth over http:// is readable on the way (loopback excepted)."""
    base, headers = recording_dav
    port = base.rsplit(":", 1)[1]
    recipe, config = _project(tmp_path, f"  remote: webdav+http://127.0.0.2:{port}/c\n  options: {{user: ci}}\n")
    assert zoo("config", "allow", config).code == 0
    headers.clear()
    got = zoo("plan", recipe, env={"ZOO_WEBDAV_PASSWORD": SECRET})
    assert got.code == 2, got.text
    assert f"webdav+http://127.0.0.2:{port}/c: zoo would send the password of ci ($ZOO_WEBDAV_PASSWORD) over " \
           "plain HTTP" in got.err
    assert f"use webdav+https://127.0.0.2:{port}/c" in got.err and SECRET not in got.err
    assert headers == []
