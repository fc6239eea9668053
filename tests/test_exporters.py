"""The exporter registry (zoo/engine/exporter_loader.py, zoo_stages/exporters/): every framework
exporter is a `zoo.exporters` entry point, zoo's own win over a plugin's names, a third-party
exporter registers the same way, a missing extra names the pip install to run, `zoo exporters`
lists them, and a recipe's `model:` section is checked by its framework's exporter at load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import entry_points

import pytest
from typer.testing import CliRunner

from zoo.engine import exporter_loader
from zoo.engine.recipe import load as load_recipe
from zoo.errors import ExitCode, MissingExtra, RecipeError
from zoo_stages import exporters
from zoo_stages.exporters.base import Exporter

from conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _declared() -> dict[str, str]:
    return PYPROJECT["project"]["entry-points"]["zoo.exporters"]


def test_the_builtin_exporters_are_the_entry_points_of_zoos_distribution():
    builtin = {name: e.target for name, e in exporter_loader.entries().items() if e.builtin}
    assert builtin == _declared()
    assert {name: f"{cls.__module__}:{cls.__name__}" for name, cls in exporters.BUILTIN.items()} == _declared()


@pytest.mark.parametrize("name", sorted(_declared()))
def test_every_builtin_exporter_declares_the_contract(name):
    cls = exporter_loader.get(name)
    assert issubclass(cls, Exporter) and cls.name == name and cls.summary
    assert cls.extra in PYPROJECT["project"]["optional-dependencies"]  # the extra the hint names exists
    assert cls.modules and cls.installed()  # the suite's environment installs every built-in extra (./dev)
    cls.require()


@pytest.mark.parametrize("name", sorted(_declared()))
def test_a_missing_extra_names_the_pip_install_hidden_module_stand_in(name, monkeypatch):
    """Stand-in: the exporter's first module is hidden from the import system."""
    cls = exporter_loader.get(name)
    _hide(monkeypatch, cls.modules[0])
    assert not cls.installed() and cls.missing_modules() == [cls.modules[0]]
    with pytest.raises(MissingExtra) as err:
        cls.require()
    assert err.value.exit_code == ExitCode.INVALID
    assert f"pip install 'zoo-onnx[{cls.extra}]'" in err.value.hint and cls.modules[0] in err.value.message


def test_export_refuses_a_framework_whose_extra_is_missing_hidden_module_stand_in(monkeypatch):
    """Stand-in: xgboost hidden from the import system; export fails before touching the checkpoint."""
    from zoo_stages.export import _exporter

    _hide(monkeypatch, "xgboost")

    class Context:
        shared = {"model": {"framework": "xgboost"}}

    with pytest.raises(MissingExtra, match="xgboost") as err:
        _exporter(Context())
    assert "pip install 'zoo-onnx[xgboost]'" in err.value.hint
    assert type(_exporter(type("C", (), {"shared": {"model": {"arch": "mlp"}}})())).__name__ == "TorchExporter"


def test_zoo_exporters_lists_them_with_their_extra_hidden_module_stand_in(monkeypatch):
    """Stand-in: lightgbm hidden from the import system."""
    from zoo.cli.main import app

    _hide(monkeypatch, "lightgbm")
    result = CliRunner().invoke(app, ["exporters", "--json"])
    assert result.exit_code == 0, result.output
    import json

    rows = {r["framework"]: r for r in json.loads(result.output)}
    assert set(rows) >= set(_declared())
    assert rows["lightgbm"]["installed"] is False and rows["lightgbm"]["install"] == "pip install 'zoo-onnx[lightgbm]'"
    assert rows["sklearn"]["installed"] is True and rows["sklearn"]["origin"] == "built-in"


def test_zoo_exporters_imports_no_framework():
    code = ("import sys; from zoo.cli.main import app; from typer.testing import CliRunner;"
            "r = CliRunner().invoke(app, ['exporters']); assert r.exit_code == 0, r.output;"
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'sklearn', 'lightgbm', 'xgboost', 'skl2onnx',"
            " 'onnxmltools', 'keras', 'jax', 'jax2onnx', 'flax') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


def test_a_third_party_exporter_registers_through_an_entry_point(tmp_path, monkeypatch):
    """A stand-in third-party distribution (a .dist-info on sys.path) declares an exporter of its
    own and one named `torch`: torch stays zoo's, the other is listed, loaded and asked about
    recipes, and its missing module is reported as a missing extra."""
    info = tmp_path / "acme_exporters-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-exporters\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[zoo.exporters]\nacme = acme_exporters:AcmeExporter\n"
                                           "torch = acme_exporters:AcmeExporter\n")
    (tmp_path / "acme_exporters.py").write_text(textwrap.dedent("""
        from zoo_stages.exporters.base import Exporter, ModelFieldError

        class AcmeExporter(Exporter):
            name = "acme"
            extra = "acme"
            modules = ("acme_runtime_not_installed",)
            summary = "Acme models"

            @classmethod
            def check_model(cls, model):
                if model.get("estimator") != "rocket":
                    raise ModelFieldError(("estimator",), "acme fits rockets only", hint="estimator: rocket")

            def export(self, job):
                raise AssertionError("not exported in this test")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    exporter_loader.clear_cache()
    try:
        assert [ep.value for ep in entry_points(group=exporter_loader.ENTRY_POINT_GROUP, name="acme")]
        acme = exporter_loader.entry("acme")
        assert acme.distribution == "acme-exporters" and not acme.builtin
        assert exporter_loader.entry("torch").builtin
        assert exporter_loader.get("torch") is exporters.BUILTIN["torch"]
        cls = exporter_loader.get("acme")
        assert cls.name == "acme" and not cls.installed()
        with pytest.raises(MissingExtra, match="acme_runtime_not_installed"):
            cls.require()

        recipe = tmp_path / "r.yaml"
        recipe.write_text(_RECIPE.format(model="framework: acme\n  estimator: rocket"))
        assert load_recipe(recipe).spec.model.framework == "acme"
        recipe.write_text(_RECIPE.format(model="framework: acme\n  estimator: boat"))
        with pytest.raises(RecipeError, match=r"r\.yaml:6:14: acme fits rockets only"):
            load_recipe(recipe)
    finally:
        exporter_loader.clear_cache()


_RECIPE = """schema_version: 1
name: r
version: 1.0.0
model:
  {model}
stages:
  train: {{}}
task: tabular-classification
"""  # no data and an estimator no rule names: train reads a task the recipe must give


@pytest.mark.parametrize("model, line, message", [
    ("framework: sklearn\n  estimator: GradientBoostingClasifier", 6, "did you mean 'GradientBoostingClassifier'"),
    ("framework: xgboost\n  estimator: XGBClasifier", 6, "did you mean 'XGBClassifier'"),
    ("framework: lightgbm", 5, "needs `model.estimator`"),
    ("framework: sklaern\n  estimator: Ridge", 5, "did you mean 'sklearn'"),
    ("framework: sklearn\n  estimator: Ridge\n  arch: mlp", 7, "model.arch is a torch setting"),
    ("arch: mlp\n  estimator: Ridge", 6, "not to torch models"),
    ("framework: transformers\n  architecture: DistilBertForSequenceClasification", 6,
     "did you mean 'DistilBertForSequenceClassification'"),
    ("framework: transformers\n  config: {dim: 64}", 5, "needs `model.architecture`"),
    ("framework: transformers\n  architecture: BertModel\n  arch: mlp", 7, "does not apply to framework transformers"),
    ("arch: mlp\n  architecture: BertModel", 6, "applies to framework transformers, not torch"),
    ("framework: sklearn\n  estimator: Ridge\n  config: {a: 1}", 7, "applies to framework transformers, not sklearn"),
    ("framework: jax", 5, "needs `model.entry: file.py:function`"),
    ("framework: keras\n  entry: m.py:build", 6, "keeps the architecture in its checkpoint"),
    ("framework: keras\n  estimator: Ridge", 6, "does not apply to framework keras"),
    ("framework: jax\n  entry: m.py:apply\n  arch: mlp", 7, "model.arch does not apply to framework jax"),
])
def test_the_model_section_is_checked_by_its_frameworks_exporter(tmp_path, model, line, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(_RECIPE.format(model=model))
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe)
    assert f"r.yaml:{line}:" in str(err.value) and message in f"{err.value} {err.value.hint}"


def _hide(monkeypatch, module: str) -> None:
    """Hide `module` (and its submodules) from the import system for the rest of the test."""

    class Hide:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == module or name.startswith(module + "."):
                raise ModuleNotFoundError(f"No module named {name!r} (hidden by the test)", name=name)
            return None

    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [Hide(), *sys.meta_path])
