"""The lockfile (zoo/engine/lockfile.py) and the lock a run writes (zoo/engine/frozen.py `merged_lock`): YAML with a
schema version and sorted keys, records grouped by platform class; what `--frozen` compares (the
record's identity and outputs, not metrics or host, and never a key or code: a record holds neither); unreadable files are a RecipeError; an unchanged lock is not
rewritten; schema 1 and 2 files (one flat `stages:` map) are read, each record filed under the
class of the host it records. The platform names here are plain strings: no detection is involved."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cli_helpers import write_recipe
from zoo.engine import frozen, keys, lockfile, planner
from zoo.errors import RecipeError
from zoo.engine.hashing import digest_json
from zoo.engine.recipe import load

P = "x86-64-avx2"  # a platform class, as a string: the lock only files records under it
Q = "arm64-dotprod"
PARTS = {"schema": 2, "kind": "writer", "kind_version": "1", "config": {"text": "x"},
         "shared": {"data": {"n": (1, 2)}}, "matrix": {"b": "fp32"}, "inputs": {"up": {"data": "i" * 64}},
         "files": {"user.py": "u" * 64}, "tools": {"numpy": "2.0"}, "code": {"kind:m": "c" * 64}, "epoch": 1}


def record(tag="k", outputs=None, metrics=None, host=None, **extra) -> lockfile.StageLock:
    """A record built from PARTS; `tag` is its config's text (records with other tags differ)."""
    return lockfile.StageLock.from_parts(dict(PARTS, config={"text": tag}, **extra), outputs or {"data": "o" * 64},
                                         metrics or {}, host)


def test_a_record_holds_every_part_of_the_key_but_the_code():
    r = record(metrics={"acc": 0.5, "n": 3, "name": "a", "ok": True, "none": None, "table": [1, 2], "d": {"x": 1}},
               host={"cpu": "x"}, recipe={"name": "r"}, lineage={"a": "1"})
    assert (r.kind, r.kind_version, r.config, r.matrix, r.inputs, r.files, r.tools) == (
        "writer", "1", {"text": "k"}, {"b": "fp32"}, {"up": {"data": "i" * 64}}, {"user.py": "u" * 64},
        {"numpy": "2.0"})
    assert r.config_digest == digest_json({"text": "k"})
    assert "key" not in r.to_json() and "code" not in r.to_json() and "epoch" not in r.to_json()
    # the identity the lock, the cache entries and the stamps share: the key's parts less the code
    assert r.identity() == keys.record_digest(dict(PARTS, config={"text": "k"}, recipe={"name": "r"}, lineage={"a": "1"}))
    assert r.identity() == keys.record_digest(dict(PARTS, config={"text": "k"}, recipe={"name": "r"}, lineage={"a": "1"},
                                                   code={"kind:m": "other"}, epoch=99))
    assert r.identity() != record("other").identity()
    # read back from its YAML (empty fields left out) it is the same record
    for parts in (dict(PARTS, files={}), dict(PARTS, files={}, shared=None, matrix={})):
        made = lockfile.StageLock.from_parts(parts, {"data": "o" * 64}, {})
        assert "files" not in made.to_json()
        assert lockfile.record_identity(made.to_json()) == made.identity() == keys.record_digest(parts)
    assert r.shared == {"data": {"n": [1, 2]}} and type(r.shared["data"]["n"]) is list  # plain YAML data
    assert r.metrics == {"acc": 0.5, "n": 3, "name": "a", "none": None, "ok": True}  # scalars only, sorted
    assert list(r.metrics) == sorted(r.metrics)
    assert (r.recipe, r.lineage, r.host) == ({"name": "r"}, {"a": "1"}, {"cpu": "x"})
    plain = record()
    assert (plain.recipe, plain.lineage, plain.host) == ({}, {}, {})


def test_to_json_leaves_out_only_the_empty_optional_fields():
    data = record().to_json()
    assert "recipe" not in data and "lineage" not in data and "host" not in data and "shared_digest" not in data
    assert data["shared"] == {"data": {"n": [1, 2]}} and data["metrics"] == {}
    full = record(host={"cpu": "x"}, recipe={"name": "r"}, lineage={"a": "1"}).to_json()
    assert full["host"] == {"cpu": "x"} and full["recipe"] == {"name": "r"} and full["lineage"] == {"a": "1"}
    old = lockfile.StageLock(**{**record().to_json(), "shared": None, "shared_digest": "s" * 64})
    assert old.to_json()["shared_digest"] == "s" * 64 and "shared" not in old.to_json()


def test_write_read_round_trip_sorted_with_schema_version(tmp_path):
    path = tmp_path / "r.lock"
    lock = lockfile.Lock(recipe={"name": "r", "version": "1", "digest": "d"},
                         platforms={Q: {"a": record("q")},
                                    P: {"b": record("b"), "a": record("a", host={"cpu": "x"})}})
    assert lockfile.write(path, lock) is True
    text = path.read_text()
    assert text.startswith("# Written by `zoo run`; do not edit.")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"
    data = yaml.safe_load(body)
    assert data["schema_version"] == lockfile.LOCK_SCHEMA_VERSION == 4
    assert list(data["platforms"]) == [Q, P] and set(data["platforms"][P]) == {"a", "b"}
    assert text.index(f"  {Q}:") < text.index(f"  {P}:")
    assert text.index("    a:") < text.index("    b:")
    # every mapping's keys sorted (a record's fields too), text as it is (no escapes): clean diffs
    assert (text.index("\n      config:") < text.index("\n      files:") < text.index("\n      inputs:")
            < text.index("\n      kind:"))
    assert yaml.safe_dump(data, sort_keys=True, default_flow_style=False, width=120, allow_unicode=True) == body
    unicode = lockfile.Lock(recipe={"name": "modèle"})
    lockfile.write(tmp_path / "u.lock", unicode)
    assert "name: modèle" in (tmp_path / "u.lock").read_text(encoding="utf-8")
    back = lockfile.read(path)
    assert back.recipe == lock.recipe and back.platforms == lock.platforms
    assert back.record("a", Q).config == {"text": "q"} and back.record("a", P).config == {"text": "a"}
    assert back.record("b", Q) is None
    assert back.of_stage("a") == {Q: lock.platforms[Q]["a"], P: lock.platforms[P]["a"]}
    assert back.reference("b", Q) is back.record("b", P)  # another class's record explains a rerun
    assert back.stage_ids() == {"a", "b"}
    assert back.identities() == {record("q").identity(), record("a").identity(), record("b").identity()}
    assert lockfile.write(path, back) is False  # unchanged: not rewritten
    back.record("a", P).metrics = {"acc": 1.0}
    assert lockfile.write(path, back) is True and lockfile.read(path).record("a", P).metrics == {"acc": 1.0}
    # a change whose text sorts after the old text (here: the old text is a prefix of the new) is
    # written too: "unchanged" means equal, not "not greater"
    back.platforms[P]["c"] = record("c")
    assert lockfile.write(path, back) is True and lockfile.read(path).record("c", P) is not None
    assert lockfile.lock_path(Path("recipes/x.yaml")) == Path("recipes/x.lock")


def test_a_missing_lockfile_is_none(tmp_path):
    assert lockfile.read(tmp_path / "none.lock") is None


@pytest.mark.parametrize("text", [
    "schema_version: 5\nplatforms: {}\n",  # from a newer zoo
    "schema_version: 3\nplatforms: [1]\n",
    "schema_version: 3\nplatforms: {p: [1]}\n",
    "schema_version: 3\nplatforms: {p: {a: {kind: writer}}}\n",
    "stages: {}\n",  # no version
    "schema_version: 2\nstages: {a: {kind: writer}}\n",  # a record missing fields
    "schema_version: 2\nstages: {a: {nosuch: 1}}\n",
    "schema_version: 2\nstages: [1, 2]\n",
    "- a list\n",
    "schema_version: [unclosed\n",
    "[" * 5000 + "]" * 5000 + "\n",
])
def test_an_unreadable_lockfile_is_a_recipe_error_with_a_hint(tmp_path, text):
    path = tmp_path / "r.lock"
    path.write_text(text)
    with pytest.raises(RecipeError) as e:
        lockfile.read(path)
    assert "unreadable lockfile" in e.value.message and "delete r.lock" in e.value.hint


def test_every_readable_schema_version_is_read(tmp_path):
    for version in (1, 2, 3, 4):
        path = tmp_path / f"v{version}.lock"
        path.write_text(f"schema_version: {version}\nrecipe: {{name: r}}\n")
        lock = lockfile.read(path)
        assert lock.platforms == {} and lock.recipe == {"name": "r"}
    (tmp_path / "empty.lock").write_text("schema_version: 2\n")
    assert lockfile.read(tmp_path / "empty.lock").recipe == {}


def test_a_flat_version_2_lock_files_each_record_under_its_hosts_class(tmp_path):
    avx2 = {"machine": "x86_64", "cpu": "old", "features": ["avx", "avx2", "fma", "sse4_1"]}
    arm = {"machine": "aarch64", "cpu": "graviton2", "features": ["asimd", "asimddp"]}
    stages = {"a": record("a", host=avx2).to_json(), "b": record("b", host=arm).to_json(),
              "c": record("c").to_json()}  # no host: written by a zoo older than host records
    path = tmp_path / "v2.lock"
    path.write_text(yaml.safe_dump({"schema_version": 2, "recipe": {"name": "r"}, "stages": stages}))
    lock = lockfile.read(path)
    assert lock.platforms == {"x86-64-avx2": {"a": lockfile.StageLock(**stages["a"])},
                              "arm64-dotprod": {"b": lockfile.StageLock(**stages["b"])},
                              "unknown": {"c": lockfile.StageLock(**stages["c"])}}
    # written back as schema 3, the same records under the same classes
    lockfile.write(path, lock)
    assert yaml.safe_load(path.read_text())["schema_version"] == 4 and lockfile.read(path) == lock


# --- merged_lock: the lock a run writes ---------------------------------------------------------

def _dag(tmp_path, stages="  a: {kind: writer}\n  b: {kind: concat}\n"):
    return planner.build(load(write_recipe(tmp_path, "schema_version: 1\nname: m\nversion: 0.3.0\nstages:\n" + stages)))


def test_merged_lock_drops_removed_stages_and_takes_new_records(tmp_path):
    dag = _dag(tmp_path)
    previous = lockfile.Lock(recipe={}, platforms={P: {"a": record("1"), "gone": record("2")},
                                                   Q: {"gone": record("4")}})
    merged = frozen.merged_lock(dag, previous, {P: {"b": record("3")}})
    assert set(merged.platforms) == {P}  # Q held only the dropped stage: no empty class is kept
    assert set(merged.records(P)) == {"a", "b"} and merged.record("a", P).config == {"text": "1"}
    assert merged.recipe == {"name": "m", "version": "0.3.0", "digest": dag.recipe.digest}
    assert set(frozen.merged_lock(dag, None, {P: {"a": record()}}).records(P)) == {"a"}


def test_merged_lock_adds_a_platforms_records_without_touching_the_others(tmp_path):
    dag = _dag(tmp_path)
    mine = {"a": record("1"), "b": record("2")}
    previous = lockfile.Lock(recipe={}, platforms={P: dict(mine)})
    theirs = {"a": record("1", outputs={"data": "q" * 64}), "b": record("5")}
    merged = frozen.merged_lock(dag, previous, {Q: theirs})
    assert merged.records(P) == mine and all(merged.record(s, P) is mine[s] for s in mine)
    assert merged.records(Q) == theirs
    # the same stage's record is replaced only within its own class
    again = frozen.merged_lock(dag, merged, {Q: {"b": record("6")}})
    assert again.record("b", Q).config == {"text": "6"} and again.record("b", P) is mine["b"]


def test_merged_lock_keeps_a_record_with_the_same_identity_and_outputs(tmp_path):
    dag = _dag(tmp_path)
    old = record("1", metrics={"t": 1.0}, host={"cpu": "old"})
    previous = lockfile.Lock(recipe={}, platforms={P: {"a": old}})
    same = frozen.merged_lock(dag, previous, {P: {"a": record("1", metrics={"t": 2.0}, host={"cpu": "new"})}})
    assert same.record("a", P) is old  # a reproduction is no lockfile diff
    recoded = lockfile.StageLock.from_parts(dict(PARTS, config={"text": "1"}, code={"kind:m": "new"}, epoch=2),
                                            {"data": "o" * 64}, {"t": 3.0})
    assert frozen.merged_lock(dag, previous, {P: {"a": recoded}}).record("a", P) is old  # code moved no byte
    rekeyed = record("9")
    assert frozen.merged_lock(dag, previous, {P: {"a": rekeyed}}).record("a", P) is rekeyed
    rebytes = record("1", outputs={"data": "z" * 64})
    assert frozen.merged_lock(dag, previous, {P: {"a": rebytes}}).record("a", P) is rebytes


def test_merged_lock_replaces_a_record_of_an_older_schema(tmp_path):
    """Records of lockfiles before schema 4 held a key and code digests, and tools with zoo's own
    version: they match no record this zoo makes, so a run replaces them."""
    dag = _dag(tmp_path)
    old = {k: v for k, v in record("1").to_json().items() if k != "files"}
    v3 = lockfile.StageLock.read({**old, "key": "k" * 64, "code": {"kind:m": "c" * 64, "data/x.csv": "d" * 64}})
    assert v3.files == {"data/x.csv": "d" * 64} and v3.key == "k" * 64  # its files: its code less the kind's
    assert "key" not in v3.to_json() and "code" not in v3.to_json()
    new = record("1")
    assert frozen.merged_lock(dag, lockfile.Lock(recipe={}, platforms={P: {"a": v3}}), {P: {"a": new}}).record("a", P) is new
    v1 = lockfile.StageLock(**{**record("1").to_json(), "shared": None, "shared_digest": "s" * 64})
    new = record("1")
    assert frozen.merged_lock(dag, lockfile.Lock(recipe={}, platforms={P: {"a": v1}}), {P: {"a": new}}).record("a", P) is new
