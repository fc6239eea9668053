"""Cache keys (zoo/engine/keys.py): every part that determines a stage's outputs is in its key, and nothing
else. Each config field of every kind, the kind and its version, the matrix values, the upstream
digests, the code (the kind's module, the modules it imports — see test_import_closure.py — and
files its config names), the tool versions, the declared recipe-wide values, and, only for the
kinds that declare them, recipe identity and ancestor keys. Keys are computed in-process from the real planner and recipe loader."""

from __future__ import annotations

import pytest

from cli_helpers import write_recipe
from zoo.stage import KIND_EPOCH
from zoo.engine import keys, kind_loader, planner
from zoo.engine.cache import Cache
from zoo.errors import InvalidInput
from zoo.engine.hashing import digest_json
from zoo.engine.recipe import load

HEAD = "schema_version: 1\nname: keys\nversion: 0.1.0\n"
WIDE = ("task: image-classification\nmodel: {arch: lenet5, num_classes: 10, task: image-classification}\n"
        "data: {source: digits, image_size: 8, channels: 1}\n")


def _parts(folder, text: str, stage: str, inputs=None, ancestors=None, head=HEAD) -> dict:
    dag = planner.build(load(write_recipe(folder, head + text)))
    node = dag.nodes[stage]
    return keys.key_parts(dag.recipe, node, inputs if inputs is not None else {}, Cache(folder / "c").ensure().hashes,
                          ancestors)


def _key(folder, text: str, stage: str, **kw) -> str:
    return keys.key_of(_parts(folder, text, stage, **kw))


# every config field of the test kinds, each with another valid value
FIELDS = {
    "writer": {"text": ("a", "b"), "repeat": (1, 2)},
    "concat": {"sep": ("+", "|")},
    "blob": {"size_mb": (1, 2), "seed": (0, 1), "transform": (False, True)},
    "picky": {"mode": ("a", "c"), "option": (1, 2)},
    "sleeper": {"seconds": (1.0, 2.0), "marker": ("", "m")},
    "filler": {"size_mb": (64, 65), "swallow": (False, True)},
    "reader": {"read": ([], ["task"])},
    "failing": {"message": ("boom", "bang"), "gate": (False, True)},
}


@pytest.mark.parametrize("kind", sorted(FIELDS))
def test_every_config_field_enters_the_key(tmp_path, kind):
    config_fields = set(kind_loader.get(kind).Config.model_fields)
    assert set(FIELDS[kind]) == config_fields, "a field of the kind is missing from FIELDS"
    text = WIDE + f"stages:\n  s:\n    kind: {kind}\n    config: CONFIG\n"
    base = {f: v[0] for f, v in FIELDS[kind].items()}
    parts = _parts(tmp_path, text.replace("CONFIG", repr(base).replace("'", '"')), "s")
    assert parts["config"] == base  # every field, with its value, defaults included
    for field, (_, other) in FIELDS[kind].items():
        changed = dict(base, **{field: other})
        key = _key(tmp_path, text.replace("CONFIG", repr(changed).replace("'", '"')), "s")
        assert key != keys.key_of(parts), f"{kind}.{field} is not in the key"


def test_an_omitted_default_and_the_same_value_given_have_one_key(tmp_path):
    given = _key(tmp_path, "stages:\n  s: {kind: writer, config: {text: hello, repeat: 1}}\n", "s")
    assert given == _key(tmp_path, "stages:\n  s: {kind: writer}\n", "s")


OMITTED_WHEN_UNSET = {"export": {"generation"}, "verify": {"generation"}, "quantize": {"weight_only"}}


def test_the_builtin_kinds_put_every_config_field_in_the_key(tmp_path):
    from test_shared_fields import BUILTIN

    (tmp_path / "data.npz").write_bytes(b"x")
    dag = planner.build(load(write_recipe(tmp_path, BUILTIN)))
    hashes = Cache(tmp_path / "c").ensure().hashes
    for nid, node in dag.nodes.items():
        parts = keys.key_parts(dag.recipe, node, {}, hashes, {})
        cls = kind_loader.get(node.kind)
        names = {f.alias or name for name, f in cls.Config.model_fields.items()}
        # fields added after lockfiles recorded these configs enter the record only where set (their
        # defaults are the kind's code, in its key), so the shipped records stay as they were
        unset = OMITTED_WHEN_UNSET.get(node.kind, set())
        assert set(parts["config"]) | unset == names and not set(parts["config"]) & unset, nid
        assert parts["config"] == node.instance.config.model_dump(mode="json", by_alias=True)
        for name in unset:
            given = cls.Config.model_validate({name: {}, **({"mode": "weight_only"} if node.kind == "quantize" else {})})
            assert name in given.model_dump(mode="json", by_alias=True), (nid, name)


def test_the_key_is_a_digest_of_every_part(tmp_path):
    parts = _parts(tmp_path, WIDE + "stages:\n  s: {kind: reader}\n", "s", inputs={"up": {"data": "d" * 64}})
    assert set(parts) == {"schema", "kind", "kind_version", "config", "shared", "matrix", "inputs", "files", "tools",
                          "code", "epoch"}
    assert parts["schema"] == keys.KEY_SCHEMA_VERSION == 2
    assert parts["epoch"] == KIND_EPOCH
    assert parts["kind"] == "reader" and parts["kind_version"] == str(kind_loader.get("reader").version)
    assert parts["inputs"] == {"up": {"data": "d" * 64}}
    assert parts["shared"] == {"data": {"image_size": 8}, "model": {"num_classes": 10}, "task": "image-classification"}
    assert keys.key_of(parts) == digest_json(parts)
    for name in parts:  # each part changes the key
        other = dict(parts, **{name: {"changed": name}})
        assert keys.key_of(other) != keys.key_of(parts), name
        # and each part but the code changes the record the lockfile keeps
        if name not in ("code", "epoch", "schema"):
            assert keys.record_digest(other) != keys.record_digest(parts), name
        else:
            assert keys.record_digest(other) == keys.record_digest(parts), name


def test_the_shared_values_enter_the_key_whole_or_by_field(tmp_path):
    base = WIDE + "stages:\n  s: {kind: reader}\n"
    key = _key(tmp_path, base, "s")
    assert _key(tmp_path, base.replace("image_size: 8", "image_size: 16"), "s") != key  # data:
    assert _key(tmp_path, base.replace("num_classes: 10", "num_classes: 11"), "s") != key  # model:
    assert _key(tmp_path, base.replace("task: image-classification\nmodel", "task: object-detection\nmodel"), "s") != key
    # undeclared fields stay out
    assert _key(tmp_path, base.replace("channels: 1", "channels: 3"), "s") == key
    assert _key(tmp_path, base.replace("arch: lenet5", "arch: resnet18"), "s") == key


def test_the_kind_and_its_version_enter_the_key(tmp_path, monkeypatch):
    text = "stages:\n  s: {kind: concat}\n"
    key = _key(tmp_path, text, "s")
    monkeypatch.setattr(kind_loader.get("concat"), "version", "2")
    assert _key(tmp_path, text, "s") != key
    monkeypatch.undo()
    assert _key(tmp_path, text, "s") == key
    # same config (sep), another kind: another key
    parts = _parts(tmp_path, text, "s")
    assert keys.key_of(dict(parts, kind="writer")) != key


def test_matrix_values_and_inputs_enter_the_key(tmp_path):
    text = "stages:\n  s: {kind: concat, matrix: {build: [fp32, int8]}}\n"
    assert _key(tmp_path, text, "s[fp32]") != _key(tmp_path, text, "s[int8]")
    assert _parts(tmp_path, text, "s[int8]")["matrix"] == {"build": "int8"}
    one = _key(tmp_path, text, "s[fp32]", inputs={"up": {"data": "a" * 64}})
    assert one != _key(tmp_path, text, "s[fp32]", inputs={"up": {"data": "b" * 64}})
    assert one != _key(tmp_path, text, "s[fp32]", inputs={"other": {"data": "a" * 64}})


def test_code_enters_the_key_the_kind_module_and_user_files(tmp_path):
    (tmp_path / "user.txt").write_text("one")
    text = "stages:\n  s: {kind: script, config: {file: user.txt}}\n"
    parts = _parts(tmp_path, text, "s")
    assert set(parts["code"]) == {"kind:zoo_test_kinds"} and set(parts["files"]) == {"user.txt"}
    assert parts["code"]["kind:zoo_test_kinds"] == keys.StatCache(None).digest(keys.module_files("script")["zoo_test_kinds"])
    (tmp_path / "user.txt").write_text("two")
    assert _key(tmp_path, text, "s") != keys.key_of(parts)
    # a file outside the recipe folder (and outside zoo's own folders) is labelled by its absolute path
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("x")
    try:
        files = _parts(tmp_path, f"stages:\n  s: {{kind: script, config: {{file: {outside}}}}}\n", "s")["files"]
        assert str(outside.resolve()) in files
    finally:
        outside.unlink()
    files = keys.watched_files(load(tmp_path / "recipe.yaml"), planner.build(load(tmp_path / "recipe.yaml")).nodes["s"])
    assert outside.resolve() in files and keys.module_files("script")["zoo_test_kinds"] in files


def test_files_in_zoo_home_or_the_cache_have_the_same_label_on_every_machine(tmp_path, monkeypatch):
    """Two machines keep ZOO_HOME and the run cache at other paths: a `model.from` parent in the
    zoo, or a DVC pin in the cache, must give both the same key (the remote run cache shares them)."""
    labels = []
    for machine in ("a", "b"):
        home, cache, project = tmp_path / machine / "home", tmp_path / machine / "cache", tmp_path / machine / "proj"
        monkeypatch.setenv("ZOO_HOME", str(home))
        monkeypatch.setenv("ZOO_CACHE_DIR", str(cache))
        labels.append((keys.dependency_label(home / "blobs" / "ab" / "cd", project),
                       keys.dependency_label(cache / "dvc" / "pins" / "x" / "t.csv.json", project),
                       keys.dependency_label(project / "data" / "t.csv", project)))
    assert labels[0] == labels[1] == ("zoo-home:blobs/ab/cd", "cache:dvc/pins/x/t.csv.json", "data/t.csv")


def test_a_folder_dependency_is_watched_with_every_file_in_it(tmp_path):
    (tmp_path / "tree" / "sub").mkdir(parents=True)
    (tmp_path / "tree" / "sub" / "f.txt").write_text("x")
    recipe = load(write_recipe(tmp_path, HEAD + "stages:\n  s: {kind: script, config: {file: tree}}\n"))
    files = keys.watched_files(recipe, planner.build(recipe).nodes["s"])
    assert (tmp_path / "tree" / "sub" / "f.txt").resolve() in files and (tmp_path / "tree").resolve() in files


def test_the_tools_a_stage_uses_enter_the_key_and_zoo_itself_does_not(tmp_path, monkeypatch):
    cls = kind_loader.get("concat")
    monkeypatch.setattr(cls, "tools", ("pyyaml", "no-such-dist-zz"))
    tools = _parts(tmp_path, "stages:\n  s: {kind: concat}\n", "s")["tools"]
    assert list(tools) == sorted(["pyyaml", "no-such-dist-zz"])  # not zoo-onnx: zoo's version is in no key
    assert tools["no-such-dist-zz"] == "absent" and tools["pyyaml"] not in ("absent", "")
    assert keys.tool_versions(()) == {}
    assert keys.tool_versions(("pyyaml", "pyyaml")) == {"pyyaml": keys.tool_version("pyyaml")}
    # a kind that narrows its tools for the recipe: only those enter
    monkeypatch.setattr(cls, "tools_used", lambda self, config, ctx: ("pyyaml",))
    assert list(_parts(tmp_path, "stages:\n  s: {kind: concat}\n", "s")["tools"]) == ["pyyaml"]


def test_recipe_identity_and_lineage_only_for_the_kinds_that_declare_them(tmp_path):
    text = "stages:\n  a: {kind: writer}\n  s: {kind: stamp}\n"
    plain = _parts(tmp_path, text, "a", ancestors={"x": "k"})
    assert "recipe" not in plain and "lineage" not in plain
    stamp = _parts(tmp_path, text, "s", ancestors={"b": "2", "a": "1"})
    assert stamp["recipe"] == {"name": "keys", "version": "0.1.0"}
    assert stamp["lineage"] == {"a": "1", "b": "2"} and list(stamp["lineage"]) == ["a", "b"]
    assert _parts(tmp_path, text, "s", ancestors=None)["lineage"] == {}
    bumped = _key(tmp_path, text, "s", ancestors={"a": "1"}, head=HEAD.replace("0.1.0", "0.2.0"))
    assert bumped != _key(tmp_path, text, "s", ancestors={"a": "1"})
    assert _key(tmp_path, text, "s", ancestors={"a": "1"}) != _key(tmp_path, text, "s", ancestors={"a": "9"})
    assert _key(tmp_path, text, "a", head=HEAD.replace("0.1.0", "0.2.0")) == _key(tmp_path, text, "a")
    assert _key(tmp_path, text, "s", head=HEAD.replace("name: keys", "name: other")) != _key(tmp_path, text, "s")


def test_declared_fields_whole_sections_and_unknown_names(monkeypatch):
    cls = kind_loader.get("reader")
    assert keys.declared_fields(cls) == {"data": ("image_size",), "model": ("num_classes",), "task": None}
    monkeypatch.setattr(cls, "shared", ("data.channels", "data.image_size", "data.channels", "model"))
    assert keys.declared_fields(cls) == {"data": ("channels", "image_size"), "model": None}
    monkeypatch.setattr(cls, "shared", ("data", "data.channels", "model.arch"))  # the whole section wins
    assert keys.declared_fields(cls) == {"data": None, "model": ("arch",)}
    for bad in ("nosuch", "data.nosuch", "task.x"):
        monkeypatch.setattr(cls, "shared", (bad,))
        with pytest.raises(InvalidInput):
            keys.declared_fields(cls)
    # the hint names what can be declared: a section's fields, or a scalar section only as a whole
    monkeypatch.setattr(cls, "shared", ("data.nosuch",))
    with pytest.raises(InvalidInput) as e:
        keys.declared_fields(cls)
    assert "data.image_size" in e.value.hint
    monkeypatch.setattr(cls, "shared", ("task.x",))
    with pytest.raises(InvalidInput) as e:
        keys.declared_fields(cls)
    assert e.value.hint == "declare one of: only 'task' as a whole"


def test_the_context_holds_exactly_the_key_values(tmp_path, monkeypatch):
    from zoo.stage import UndeclaredField

    recipe = load(write_recipe(tmp_path, HEAD + WIDE + "stages:\n  s: {kind: reader}\n"))
    node = planner.build(recipe).nodes["s"]
    view = keys.shared_sections(recipe, node)
    assert view["data"]["image_size"] == 8 and view["task"] == "image-classification"
    with pytest.raises(UndeclaredField):
        view["data"]["channels"]
    with pytest.raises(UndeclaredField):
        view["model"]["arch"]
    monkeypatch.setattr(kind_loader.get("reader"), "shared", ("data",))
    view = keys.shared_sections(recipe, node)
    assert view["data"]["channels"] == 1  # the whole section: every field readable
    with pytest.raises(UndeclaredField):
        view["model"]
