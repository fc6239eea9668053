"""The wheel a user installs holds every module and data file of the source tree.

`pyproject.toml` lists zoo's packages by hand: a new subpackage left out of that list, or a data
folder setuptools does not know as a package, works in this editable checkout and is missing (or,
in later setuptools, dropped) from `pip install zoo-onnx`."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("zoo", "zoo_stages")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[set[str], str, str]:
    """(names in the wheel, pip's and setuptools' output, its entry_points.txt); built from a copy of what the wheel is
    made of, since setuptools writes build/ and *.egg-info beside the sources."""
    out = tmp_path_factory.mktemp("wheel")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for top in SHIPPED:
        shutil.copytree(REPO / top, source / top, ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                           "--no-input", "-w", str(out), str(source)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = out.glob("*.whl")
    with zipfile.ZipFile(path) as z:
        entry_points = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        return set(z.namelist()), proc.stdout + proc.stderr, z.read(entry_points).decode()


def _source_files(suffixes: tuple[str, ...]) -> set[str]:
    found = set()
    for top in SHIPPED:
        for p in (REPO / top).rglob("*"):
            if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts:
                found.add(p.relative_to(REPO).as_posix())
    return found


def test_every_module_is_in_the_wheel(wheel):
    names, *_ = wheel
    missing = sorted(_source_files((".py",)) - names)
    assert not missing, f"modules missing from the wheel (add their package to pyproject.toml): {missing}"


def test_the_data_files_are_in_the_wheel(wheel):
    """The weights catalogs and the web catalog's assets (`zoo site build` copies them)."""
    names, *_ = wheel
    data = _source_files((".json", ".css", ".js", ".svg")) | {"zoo/py.typed"}
    assert data - names == set()
    assert any(n.startswith("zoo/catalogs/") for n in names) and "zoo/site/assets/site.css" in names


def test_setuptools_finds_no_unlisted_package(wheel):
    _, log, _ = wheel
    assert "absent from the `packages` configuration" not in log, \
        [line for line in log.splitlines() if "absent from" in line]


def test_the_wheel_registers_the_built_in_kinds_exporters_and_sections(wheel):
    """The recipe parser finds `model:`, `data:` and `task:` only through the `zoo.sections` group."""
    import configparser
    import tomllib

    *_, text = wheel
    registered = configparser.ConfigParser(delimiters=("=",))
    registered.read_string(text)
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    for group in ("zoo.stages", "zoo.exporters", "zoo.sections"):
        assert dict(registered[group]) == declared[group], group
    assert set(declared["zoo.sections"]) == {"model", "data", "task"}
