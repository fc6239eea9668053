"""A kind's cache key holds the code of every project module it imports (zoo/engine/import_closure.py).

The defect this fixes: kinds listed their helpers by hand (`code_modules`), and the zoo modules
they import (zoo.host, zoo.sources, zoo.engine.cache, zoo.onnxwire…) entered no key, so editing
one reran nothing. Now the key follows the real imports, read from the source: editing a module
a kind imports (at any depth, inside functions too) changes its key; editing one it does not
import changes nothing. Built-in kinds are checked on a temporary copy of zoo's source, plugin
kinds on a stand-in third-party distribution (a package and a .dist-info on sys.path).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import zoo
from cli_helpers import write_recipe
from conftest import PLUGINS, REPO
from zoo.engine import import_closure, keys, kind_loader, planner
from zoo.engine.cache import Cache
from zoo.errors import InvalidInput
from zoo.engine.hashing import StatCache
from zoo.engine.recipe import load

# ---------------------------------------------------------------------------------------------
# a stand-in third-party distribution


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


PLUGIN = {
    "ikplug/__init__.py": "",
    "ikplug/kind.py": """\
        from typing import TYPE_CHECKING

        from zoo.stage import StageKind
        from . import shared                       # relative, module level

        if TYPE_CHECKING:
            from ikplug import typing_only          # never runs


        class Deep(StageKind):
            name = "ikdeep"
            outputs = ("data",)

            def run(self, inputs, config, context):
                from ikplug.helpers import deep    # inside run(), like the heavy imports of kinds
                out = context.output_path("data.txt")
                out.write_text(deep.text() + shared.SEP)
                return {"data": out}
        """,
    "ikplug/shared.py": "SEP = '+'\n",
    "ikplug/helpers/__init__.py": "",
    "ikplug/helpers/deep.py": """\
        def text():
            from ..leaf import WORD                # two levels up, inside a function
            return WORD
        """,
    "ikplug/leaf.py": "WORD = 'one'\n",
    "ikplug/unrelated.py": "X = 1\n",
    "ikplug/typing_only.py": "Y = 1\n",
    "ikplug-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: ikplug\nVersion: 1.0\n",
    "ikplug-1.0.dist-info/entry_points.txt": "[zoo.stages]\nikdeep = ikplug.kind:Deep\n",
}


@pytest.fixture
def plugin(tmp_path, monkeypatch) -> Path:
    """The root of the stand-in distribution `ikplug` (on sys.path, its kind registered)."""
    root = tmp_path / "site"
    _write(root, PLUGIN)
    monkeypatch.syspath_prepend(str(root))
    kind_loader.clear_cache()
    yield root
    for name in [m for m in sys.modules if m == "ikplug" or m.startswith("ikplug.")]:
        del sys.modules[name]


def _touch(path: Path, text: str) -> None:
    """Rewrite a file so that its stat changes even on a coarse-mtime file system."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _code(folder: Path, stage: str) -> dict[str, str]:
    dag = planner.build(load(folder / "recipe.yaml"))
    return keys.code_digests(dag.nodes[stage].kind, Cache(folder / "c").ensure().hashes)


# ---------------------------------------------------------------------------------------------
# the closure


def test_the_closure_follows_every_kind_of_import_and_nothing_outside_the_project(plugin):
    found = import_closure.closure(["ikplug.kind"], ["ikplug"])
    assert list(found) == ["ikplug", "ikplug.helpers", "ikplug.helpers.deep", "ikplug.kind", "ikplug.leaf",
                           "ikplug.shared"]
    assert found["ikplug.helpers.deep"] == plugin / "ikplug" / "helpers" / "deep.py"
    assert found["ikplug"] == plugin / "ikplug" / "__init__.py"  # a package's __init__ runs on import
    # zoo is not ikplug's project: `from zoo.stage import …` is not followed
    assert not any(name.startswith("zoo") for name in found)
    assert "ikplug" not in sys.modules and "ikplug.kind" not in sys.modules  # read, never imported


def test_import_forms_resolve_to_modules_not_attributes(tmp_path, monkeypatch):
    _write(tmp_path, {
        "ikforms/__init__.py": "from .a import thing\n",
        "ikforms/a.py": "import ikforms.b.c as c\nfrom ikforms.b import d, not_a_module\nthing = 1\n",
        "ikforms/b/__init__.py": "",
        "ikforms/b/c.py": "from . import *\n",
        "ikforms/b/d.py": "try:\n    import json\nexcept ImportError:\n    from ikforms import e\n",
        "ikforms/e.py": "",
        "ikforms/f.py": "",  # imported by no one
        "ikforms/g.py": "def __getattr__(name):\n    from ikforms import f\n    return f\n",
    })
    monkeypatch.syspath_prepend(str(tmp_path))
    assert list(import_closure.closure(["ikforms"], [])) == ["ikforms", "ikforms.a", "ikforms.b", "ikforms.b.c",
                                                            "ikforms.b.d", "ikforms.e"]
    # a module-level __getattr__ (PEP 562) runs only for missing attributes: not followed
    assert list(import_closure.closure(["ikforms.g"], [])) == ["ikforms", "ikforms.a", "ikforms.b", "ikforms.b.c",
                                                              "ikforms.b.d", "ikforms.e", "ikforms.g"]
    with pytest.raises(LookupError, match="ikforms.nope"):
        import_closure.closure(["ikforms.nope"], [])


def test_parsed_imports_are_remembered_by_file_version_across_processes(plugin, tmp_path, monkeypatch):
    parsed = []
    real = import_closure.parse_statements
    monkeypatch.setattr(import_closure, "parse_statements", lambda src, name: parsed.append(name) or real(src, name))
    monkeypatch.setattr(import_closure, "_parsed", {})
    db = tmp_path / "memo.sqlite"
    first = import_closure.closure(["ikplug.kind"], ["ikplug"], StatCache(db))
    assert len(parsed) == len(first)
    monkeypatch.setattr(import_closure, "_parsed", {})  # another process: only the SQLite memo is left
    assert import_closure.closure(["ikplug.kind"], ["ikplug"], StatCache(db)) == first
    assert len(parsed) == len(first)
    # a new import in an edited file is seen: the file's new version is parsed again
    _touch(plugin / "ikplug" / "leaf.py", "from ikplug import unrelated\nWORD = 'one'\n")
    assert "ikplug.unrelated" in import_closure.closure(["ikplug.kind"], ["ikplug"], StatCache(db))
    assert sorted(parsed[len(first):]) == [str(plugin / "ikplug" / "leaf.py"), str(plugin / "ikplug" / "unrelated.py")]


def test_stage_keys_on_a_fresh_run_cache_reuse_the_users_code_memo(tmp_path, monkeypatch):
    """A new project (a machine taking stages from a remote cache, a CI job) starts with an empty
    run cache, but zoo's own modules were parsed before: the user's code memo holds them."""
    from zoo.engine import keys

    parsed = []
    real = import_closure.parse_statements
    monkeypatch.setattr(import_closure, "parse_statements", lambda src, name: parsed.append(name) or real(src, name))
    monkeypatch.setattr(import_closure, "_parsed", {})
    monkeypatch.setattr(import_closure, "_code_memos", {})
    first = keys.module_files("deploy")
    assert len(parsed) == len(first) > 20 and import_closure.code_memo_path().is_file()
    # another process in another project: only the user's memo is left, and nothing is parsed again
    monkeypatch.setattr(import_closure, "_parsed", {})
    monkeypatch.setattr(import_closure, "_code_memos", {})
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "another-project" / "cache"))
    assert keys.module_files("deploy") == first
    assert len(parsed) == len(first)
    # a memo in another place (another user) parses again
    monkeypatch.setattr(import_closure, "_parsed", {})
    monkeypatch.setenv("ZOO_CODE_MEMO", str(tmp_path / "other-user.sqlite"))
    assert keys.module_files("deploy") == first
    assert len(parsed) == 2 * len(first)


# ---------------------------------------------------------------------------------------------
# keys


def test_editing_a_module_a_plugin_kind_imports_changes_its_key_and_no_other_edit_does(plugin, tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    write_recipe(folder, "schema_version: 1\nname: ik\nversion: 0.1.0\nstages:\n  s: {kind: ikdeep}\n")
    code = _code(folder, "s")
    assert sorted(code) == ["kind:ikplug", "kind:ikplug.helpers", "kind:ikplug.helpers.deep", "kind:ikplug.kind",
                            "kind:ikplug.leaf", "kind:ikplug.shared"]
    for unrelated in ("unrelated.py", "typing_only.py"):
        _touch(plugin / "ikplug" / unrelated, "X = 2\n")
        assert _code(folder, "s") == code, unrelated
    _touch(plugin / "ikplug" / "leaf.py", "WORD = 'two'\n")  # reached only through a function's relative import
    changed = _code(folder, "s")
    assert [m for m in code if changed[m] != code[m]] == ["kind:ikplug.leaf"]


def test_imports_inside_an_equivalence_hook_enter_no_key():
    """`equivalence` judges rebuilt outputs under `zoo repro --check` and makes none: what it imports
    is not in the key (import_closure.UNKEYED_HOOKS); the same import in any other function is."""
    source = b"""
class Kind:
    def equivalence(self, locked, rebuilt, config, context):
        from pkg import judge
        import pkg.judge_more
    def run(self):
        from pkg import maker
def equivalence():
    from pkg import judged_too
"""
    names = {n for _, n, _ in import_closure.parse_statements(source)} | {
        f"{n}.{a}" for _, n, names in import_closure.parse_statements(source) for a in names or ()}
    assert "pkg.maker" in names
    assert not {"pkg.judge", "pkg.judge_more", "pkg.judged_too"} & names


def test_an_edit_to_an_imported_module_reruns_the_stage_and_says_which(plugin, tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    recipe = write_recipe(folder, "schema_version: 1\nname: ik\nversion: 0.1.0\nstages:\n  s: {kind: ikdeep}\n")
    assert (zoo.run(recipe).stages[0].outputs) and zoo.plan(recipe).stages[0].state == "cached"
    _touch(plugin / "ikplug" / "unrelated.py", "X = 3\n")
    assert zoo.plan(recipe).stages[0].state == "cached"
    _touch(plugin / "ikplug" / "helpers" / "deep.py", "def text():\n    from ..leaf import WORD\n    return WORD * 2\n")
    report = zoo.plan(recipe).stages[0]
    assert report.state == "will run" and str(report.reasons[0]) == "code changed: ikplug.helpers.deep"


def test_a_kind_shipped_without_source_is_refused(tmp_path, monkeypatch):
    """A stand-in distribution ships its kind as bytecode only (kind.pyc, which Python imports):
    its code cannot be read, so no key is made rather than one that misses the code."""
    import py_compile

    _write(tmp_path, {"iknosrc/__init__.py": "",
                      "iknosrc/kind.py": "from zoo.stage import StageKind\n\nclass Kind(StageKind):\n    name = 'iknosrc'\n",
                      "iknosrc-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: iknosrc\nVersion: 1.0\n",
                      "iknosrc-1.0.dist-info/entry_points.txt": "[zoo.stages]\niknosrc = iknosrc.kind:Kind\n"})
    py_compile.compile(str(tmp_path / "iknosrc" / "kind.py"), cfile=str(tmp_path / "iknosrc" / "kind.pyc"))
    (tmp_path / "iknosrc" / "kind.py").unlink()
    monkeypatch.syspath_prepend(str(tmp_path))
    kind_loader.clear_cache()
    try:
        assert kind_loader.get("iknosrc").name == "iknosrc"  # it imports and would run
        with pytest.raises(InvalidInput, match="kind 'iknosrc': no source file for module 'iknosrc.kind'"):
            keys.module_files("iknosrc")
    finally:
        for name in ("iknosrc.kind", "iknosrc"):
            sys.modules.pop(name, None)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_zoos_plumbing_is_in_no_key_and_a_kinds_own_code_is_in_its_own(tmp_path):
    """On a temporary copy of zoo's source (first on PYTHONPATH, so it shadows the checkout): a
    comment in the registry, the file layer, the runner, the downloader, the CLI or zoo/sources.py
    (which export imports) changes no key; one in a module of export's own package
    (zoo_stages/exporters/base.py) changes export's key and not train's, which does not import it."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "zoo", src / "zoo", ignore=ignore)
    shutil.copytree(REPO / "zoo_stages", src / "zoo_stages", ignore=ignore)
    work = tmp_path / "work"
    work.mkdir()
    (work / "m.onnx").write_bytes(b"an ONNX file, passed through")
    write_recipe(work, "schema_version: 1\nname: ik\nversion: 0.1.0\n"
                       "model: {arch: lenet5, num_classes: 10}\ndata: {source: digits, image_size: 8, channels: 1}\n"
                       "stages:\n  train: {}\n"
                       f"  export: {{needs: [], config: {{onnx: {{path: m.onnx, sha256: {_sha256(work / 'm.onnx')}}}}}}}\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), str(PLUGINS)]))

    def plan() -> dict[str, str]:
        code = "import sys, zoo.engine.keys; print(zoo.engine.keys.__file__, file=sys.stderr); from zoo.entry import main; main()"
        proc = subprocess.run([sys.executable, "-c", code, "plan", "recipe.yaml", "--json"], cwd=work, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.startswith(str(src / "zoo" / "engine" / "keys.py")), proc.stderr  # the copy runs
        return {s["id"]: s["key"] for s in json.loads(proc.stdout)["stages"]}

    before = plan()
    assert before["train"] and before["export"]
    for plumbing in ("registry/store.py", "files.py", "engine/runner.py", "download.py", "cli/main.py",
                     "cli/release_commands.py", "sources.py", "stage.py", "errors.py"):
        _touch(src / "zoo" / plumbing, (src / "zoo" / plumbing).read_text() + "\n# edited\n")
        assert plan() == before, plumbing
    own = src / "zoo_stages" / "exporters" / "base.py"
    _touch(own, own.read_text() + "\n# edited\n")
    after = plan()
    assert after["train"] == before["train"] and after["export"] != before["export"]
    # the parity check: export runs it, train only judges with it under `zoo repro --check` (its
    # `equivalence` hook, whose imports no key follows)
    parity = src / "zoo_stages" / "lib" / "quality" / "parity.py"
    _touch(parity, parity.read_text() + "\n# edited\n")
    judged = plan()
    assert judged["train"] == after["train"] and judged["export"] != after["export"]
    after = judged
    # a module zoo names as computing a kind's bytes (KEYED_ZOO_MODULES): in the keys of the kinds importing it
    wire = src / "zoo" / "onnxwire.py"
    _touch(wire, wire.read_text() + "\n# edited\n")
    assert plan()["export"] != after["export"]


# ---------------------------------------------------------------------------------------------
# module shapes and import forms the closure must resolve (each kills mutants of import_closure.py
# that the kinds' own imports never exercise: docs/mutation.md, engine-closure)

SHAPES = {
    "shp/__init__.py": "",
    "shp/kind.py": """\
        import typing
        import flags

        from shp.fast import speed                 # a compiled extension module
        from shp.ns.inner import VALUE             # a namespace subpackage (no __init__.py)
        from shp.a.b.deep import go
        import shp.broken                          # does not parse: kept, not followed
        import shp.nulls                           # holds a NUL byte: kept, not followed

        try:
            import shp.missing.deeper             # a module that does not exist: no file, no crash
        except ImportError:
            pass

        if typing.TYPE_CHECKING:                   # the attribute form never runs either
            from shp import typing_attr_only
        if flags.AAA:                              # any other condition may run
            from shp import under_aaa
        if flags.ZZZ:
            from shp import under_zzz
        if AAA:
            from shp import under_name_aaa
        if ZZZ:
            from shp import under_name_zzz


        def Load():                                # a module-level function that is not __getattr__
            from shp import loaded
        """,
    # not machine code, but what a parser would follow if it read an extension module as source
    "shp/fast" + import_closure.EXTENSION_SUFFIXES[0]: "from shp import read_from_binary\n",
    "shp/read_from_binary.py": "",
    "shp/ns/inner.py": "VALUE = 1\n",
    "shp/a/__init__.py": "",
    "shp/a/b/__init__.py": "",
    "shp/a/b/deep.py": """\
        from . import sibling                      # level 1: shp.a.b
        from .. import up_one                      # level 2: shp.a
        from ... import up_two                     # level 3: shp
        from ....other import beyond               # level 4: past the top-level package, ImportError
        from .....other import far_beyond
        """,
    "shp/a/b/sibling.py": "",
    "shp/a/up_one.py": "",
    "shp/up_two.py": "",
    "shp/other.py": "",                            # what a wrong level arithmetic would reach
    "shp/a/other.py": "",
    "shp/broken.py": "def (:\n",
    "shp/nulls.py": "X = 1\n\0\n",
    "shp/typing_attr_only.py": "",
    "shp/under_aaa.py": "",
    "shp/under_zzz.py": "",
    "shp/under_name_aaa.py": "",
    "shp/under_name_zzz.py": "",
    "shp/loaded.py": "",
    "other/__init__.py": "",                       # a second project package, reachable only wrongly
    "other/beyond.py": "",
    "other/far_beyond.py": "",
    "nsroot/mod.py": "from .sibling import X\nfrom . import up\n",  # a top-level namespace package
    "nsroot/sibling.py": "X = 1\n",
    "single.py": "from . import nothing\nfrom .other import beyond\n",  # a top-level module: no parent package
}


@pytest.fixture
def shapes(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "site"
    _write(root, SHAPES)
    (root / "shp" / "nulls.py").write_bytes(b"X = 1\n\0\n")
    monkeypatch.syspath_prepend(str(root))
    yield root


def test_every_module_shape_and_import_form_is_resolved(shapes):
    found = import_closure.closure(["shp.kind"], ["shp", "other"])
    assert set(found) == {
        "shp", "shp.a", "shp.a.b", "shp.a.b.deep", "shp.a.b.sibling", "shp.a.up_one", "shp.broken", "shp.fast",
        "shp.kind", "shp.loaded", "shp.nulls", "shp.ns.inner", "shp.under_aaa", "shp.under_name_aaa",
        "shp.under_name_zzz", "shp.under_zzz", "shp.up_two"}
    assert found["shp.fast"] == shapes / "shp" / ("fast" + import_closure.EXTENSION_SUFFIXES[0])  # hashed, not read
    assert found["shp.ns.inner"] == shapes / "shp" / "ns" / "inner.py"


def test_relative_imports_without_a_parent_package_reach_nothing(shapes):
    """A top-level module's `from . import x` and a top-level namespace package's relative imports."""
    assert import_closure.closure(["single"], ["single", "other"]) == {"single": shapes / "single.py"}
    assert import_closure.closure(["nsroot.mod"], ["nsroot"]) == {
        "nsroot.mod": shapes / "nsroot" / "mod.py", "nsroot.sibling": shapes / "nsroot" / "sibling.py"}


def test_a_corrupted_or_unwritable_code_memo_is_only_a_lost_memo(tmp_path, monkeypatch):
    """The user's code memo is a cache: garbage in its file, or a place no folder can be made
    (a file where its folder should be: unwritable even for root), costs a parse, never a wrong
    or failed key."""
    from zoo.engine import keys

    monkeypatch.setattr(import_closure, "_parsed", {})
    monkeypatch.setattr(import_closure, "_code_memos", {})
    expected = keys.module_files("deploy")
    (tmp_path / "garbage.sqlite").write_bytes(b"not a database " * 100)
    (tmp_path / "a-file").write_text("not a folder")
    for memo in (tmp_path / "garbage.sqlite", tmp_path / "a-file" / "code.sqlite"):
        monkeypatch.setenv("ZOO_CODE_MEMO", str(memo))
        monkeypatch.setattr(import_closure, "_parsed", {})
        monkeypatch.setattr(import_closure, "_code_memos", {})
        assert keys.module_files("deploy") == expected
