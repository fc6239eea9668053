"""Finding and loading stage kinds (zoo/engine/kind_loader.py): every kind is an entry point, zoo's own
win over third-party names, kinds load lazily."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib.metadata import entry_points

import pytest

from zoo.engine import kind_loader
from zoo.errors import UnknownKind
from zoo.stage import KindConfig, StageKind

from conftest import REPO


def _declared() -> dict[str, str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["zoo.stages"]


def test_the_builtin_kinds_are_the_entry_points_of_zoos_distribution():
    # pyproject.toml is the one list; a stale install (entry points not reinstalled) fails here
    assert {name: kind_loader.available()[name] for name in kind_loader.builtin_names()} == _declared()
    assert all(kind_loader.entry(name).distribution == kind_loader.BUILTIN_DISTRIBUTION for name in _declared())


@pytest.mark.parametrize("name", sorted(_declared()))
def test_every_builtin_kind_declares_the_contract(name):
    cls = kind_loader.get(name)
    assert issubclass(cls, StageKind) and cls.name == name
    assert issubclass(cls.Config, KindConfig)
    assert cls.Config.model_config.get("extra") == "forbid"
    assert cls.version and cls.outputs and cls.run is not StageKind.run


def test_a_builtin_name_wins_over_a_plugin_that_declares_it_too(tmp_path, monkeypatch):
    """A stand-in third-party distribution (a .dist-info on sys.path, before zoo's) declares
    `train` and a kind of its own: `train` stays zoo's, the other name is the plugin's."""
    info = tmp_path / "shadow_kinds-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shadow-kinds\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[zoo.stages]\ntrain = shadow_kinds:Train\nshadow = shadow_kinds:Shadow\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    kind_loader.clear_cache()
    assert [ep.value for ep in entry_points(group=kind_loader.ENTRY_POINT_GROUP, name="train")][0] == "shadow_kinds:Train"
    assert kind_loader.entry("train").target == "zoo_stages.train:Train" and kind_loader.entry("train").builtin
    shadow = kind_loader.entry("shadow")
    assert shadow.target == "shadow_kinds:Shadow" and shadow.distribution == "shadow-kinds" and not shadow.builtin
    assert "shadow" not in kind_loader.builtin_names() and "train" in kind_loader.builtin_names()


def test_a_kinds_project_packages_are_its_distributions():
    # zoo's kinds: both top-level packages of zoo-onnx (top_level.txt); a plugin without one: its own
    assert kind_loader.entry("train").packages() == ("zoo", "zoo_stages")
    assert kind_loader.entry("writer").packages() == ("zoo_test_kinds",)


def test_third_party_kinds_come_from_entry_points():
    available = kind_loader.available()
    assert available["writer"] == "zoo_test_kinds:Writer"
    assert "writer" not in kind_loader.builtin_names() and kind_loader.entry("writer").distribution == "zoo-test-kinds"


def test_kinds_are_loaded_lazily():
    code = ("import sys; from zoo.engine import kind_loader; names = kind_loader.available();"
            "assert 'writer' in names and 'train' in names;"
            "assert 'zoo_test_kinds' not in sys.modules and 'zoo_stages.train' not in sys.modules;"
            "kind_loader.get('writer'); assert 'zoo_test_kinds' in sys.modules; print('lazy')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and "lazy" in proc.stdout, proc.stderr


def test_unknown_kind_suggests_the_closest():
    with pytest.raises(UnknownKind) as err:
        kind_loader.get("quantise")
    assert "quantize" in (err.value.hint or "")


def test_kind_modules_and_their_code_digests_import_no_heavy_libraries():
    # reading each kind's import closure (its cache key's code) imports none of what it reads
    code = ("import sys; from zoo.engine import keys, kind_loader\n"
            "for n in kind_loader.builtin_names(): kind_loader.get(n); assert len(keys.module_files(n)) > 5\n"
            "print([m for m in ('torch', 'onnx', 'onnxruntime', 'sklearn', 'keras', 'jax', 'zoo.registry.store') "
            "if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
