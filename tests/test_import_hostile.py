"""`zoo import` fed a stranger's text: a Hub card that tries to inject YAML into the generated
recipe, and source paths that try to leave the repo (olah, a real Hub mirror, on 127.0.0.1,
through the real `zoo` CLI).

The generated recipe is written by PyYAML's emitter (its comment header too), so no value can add
a section; a card's license must be a one-line license identifier, else it is dropped with a
warning and the version claims none. A source path with '..', '.', an empty part, an absolute
part, a backslash or a control character is refused (exit 2) before the Hub is asked.
"""

from __future__ import annotations

import json

import pytest
import yaml

from cli_helpers import zoo
from test_import import _git_repo, _tiny_bytes, _version_file
from zoo.registry.store import LocalZoo
from registry_servers import olah_server
from zoo.release import import_source
from zoo.release.import_source import ImportSource
from zoo.release.importer import RECIPE_FILE, recipe_text

INJECTED = "mit\ndata: {source: csv, path: /etc/passwd, label: root}"
RECIPE_SECTIONS = {"schema_version", "name", "version", "description", "license", "task", "stages"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """olah serving the git repos under ``mirrors/models``."""
    work = tmp_path_factory.mktemp("hub")
    with olah_server(work / "mirrors", work / "olah") as url:
        yield url, work / "mirrors" / "models"


@pytest.fixture
def hub_env(hub, tmp_path):
    return {"HF_ENDPOINT": hub[0], "HF_HUB_OFFLINE": "0", "HF_HOME": str(tmp_path / "hf-home")}


@pytest.mark.slow
def test_a_card_whose_license_holds_yaml_adds_no_section_to_the_generated_recipe(hub, hub_env, tmp_path):
    card = "---\n" + yaml.safe_dump({"license": INJECTED}) + "---\n# a model\n"
    _git_repo(hub[1], "acme/injector", {"model.onnx": _tiny_bytes(tmp_path), "README.md": card.encode()})
    result = zoo("import", "hf://acme/injector/model.onnx", "--json", env=hub_env)
    assert result.code == 0, result.text
    assert "Traceback" not in result.err
    # the license is not an identifier: dropped, said once, on stderr, naming the repo
    [warning] = [line for line in result.err.splitlines() if line.startswith("warning:")]
    assert "acme/injector@" in warning and "not a license identifier" in warning and "unspecified" in warning
    generated = json.loads(result.out)["recipe"]
    for text in (open(generated).read(), _version_file(LocalZoo(), "injector@1.0.0", RECIPE_FILE).decode()):
        recipe = yaml.safe_load(text)
        assert set(recipe) == RECIPE_SECTIONS, set(recipe)
        assert "data" not in recipe and recipe["license"] == "unspecified"
        assert "/etc/passwd" not in text
    manifest = LocalZoo().resolve("injector@1.0.0")
    assert manifest.license == "unspecified" and "license" not in manifest.extra["import"]


def test_every_value_in_a_generated_recipe_is_emitted_so_none_starts_a_section():
    """The emitter's half alone (a license that reached the recipe however it came): the comment
    header and the body quote it, and the text reads back as exactly the document."""
    hostile = ImportSource(text="x", form="url", location="https://h/m.onnx", sha256="b" * 64, name="m",
                           version="1.0.0", license=INJECTED + "\u2028x: 1\r\nlabel: y",
                           weights_url="https://h/w.pth\ndata: {path: /etc/shadow}")
    text = recipe_text(hostile, "m", "1.0.0")
    recipe = yaml.safe_load(text)
    assert set(recipe) == RECIPE_SECTIONS and recipe["license"] == hostile.license
    assert not [line for line in text.splitlines() if line.startswith(("data:", "label:", "x:"))]


@pytest.mark.parametrize("license_, kept", [
    ("mit", "mit"), ("apache-2.0", "apache-2.0"), (["mit", "cc-by-4.0"], "mit AND cc-by-4.0"),
    ("GPL-2.0-only WITH Classpath-exception-2.0", "GPL-2.0-only WITH Classpath-exception-2.0"),
    (INJECTED, None), ("mit\n", None), ("a" * 300, None), ({"name": "mit"}, None), (42, None),
    ("MIT License (see LICENSE)", None), ([], None),
])
def test_a_cards_license_is_kept_only_as_a_license_identifier(license_, kept, capsys):
    assert import_source.card_license({"license": license_}, "o/r@abc") == kept
    assert ("warning: o/r@abc" in capsys.readouterr().err) == (kept is None and license_ != [])


@pytest.mark.parametrize("source, why", [
    ("hf://org/repo/../../x.onnx", "'.' or '..' part"),
    ("hf://org/repo@main/../x.onnx", "'.' or '..' part"),
    ("hf://org/repo/onnx/./model.onnx", "'.' or '..' part"),
    ("hf://org/repo/onnx//model.onnx", "empty part"),
    ("hf://org/repo/onnx/", "empty part"),
    ("hf://org/repo//etc/passwd.onnx", "is absolute"),
    ("hf://org/repo/onnx\\..\\model.onnx", "backslash"),
    ("hf://org/repo/model\n.onnx", "control character"),
    ("hf://../repo/model.onnx", "owner '..'"),
    ("hf://org/re..po/model.onnx", "repo name"),
    ("hf://org/repo@../../x/model.onnx", "revision '..'"),
    ("hf://org/repo@-x/model.onnx", "revision"),
])
def test_a_hub_source_whose_path_leaves_the_repo_is_refused_naming_the_form(hub_env, source, why):
    result = zoo("import", source, env=hub_env)
    assert result.code == 2, result.text
    assert "Traceback" not in result.err and why in result.err
    assert repr(source) in result.err and "hf://ORG/REPO[@REV]/PATH" in result.err
    assert LocalZoo().list() == []


@pytest.mark.parametrize("source, why", [
    ("https://host/models/../../etc/x.onnx#sha256=" + "a" * 64, "'.' or '..' part"),
    ("https://host/models\\..\\x.onnx#sha256=" + "a" * 64, "backslash"),
    ("https://host/m.onnx\n.x#sha256=" + "a" * 64, "control character"),
])
def test_a_url_source_that_does_not_name_one_file_is_refused(source, why):
    result = zoo("import", source)
    assert result.code == 2, result.text
    assert "Traceback" not in result.err and why in result.err
