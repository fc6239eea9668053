"""Recipe-wide fields and cache keys: a kind's key holds exactly the `model:`/`data:`/`task:` values
its `shared` declares, its context holds only those, and a rerun's reason names the field.

Engine behaviour is tested with the `reader` test kind (tests/plugins), the built-in kinds by
computing their keys directly (nothing is trained).
"""

from __future__ import annotations

import json

import pytest
import yaml
from pydantic import TypeAdapter

import zoo
from cli_helpers import RecordingExecutor, table_rows, write_recipe, zoo as zoo_cli
from zoo.engine import keys, kind_loader, lockfile, planner
from zoo.engine.cache import Cache
from zoo.errors import RecipeError
from zoo.engine.executors import ProcessExecutor
from zoo.engine.recipe import load
from zoo_stages.sections.model import InputSpec, PretrainedSpec

READER = """\
schema_version: 1
name: reader
version: 0.1.0
task: image-classification
model: {arch: lenet5, num_classes: 10, task: image-classification}
data: {source: digits, image_size: 8, channels: 1}
stages:
  r:
    kind: reader
  w:
    kind: writer
    needs: []
"""


def _reader_output(result) -> dict:
    r = next(s for s in result.stages if s.id == "r")
    cache = Cache(result.cache_dir)
    return json.loads(cache.output_paths(cache.lookup(r.key))["data"].read_text())


def _reason(result, sid: str) -> str:
    return "; ".join(str(x) for x in next(s for s in result.stages if s.id == sid).reasons)


# ---------------------------------------------------------------------------------------------
# the engine, with the `reader` test kind (declares data.image_size, model.num_classes, task)


def test_a_declared_field_change_reruns_the_stage_and_the_reason_names_it(tmp_path):
    # the invariant: a declared recipe-wide field is in the key (removing `shared` from the key
    # parts keeps `r` cached here), and plan/status/run name it with its old and new values
    recipe = write_recipe(tmp_path, READER)
    assert zoo.run(recipe).ok
    recipe.write_text(READER.replace("image_size: 8", "image_size: 16"))

    plan = zoo.plan(recipe)
    assert {s.id: s.state for s in plan.stages} == {"r": "will run", "w": "cached"}
    assert _reason(plan, "r") == "config changed: data.image_size: 8 → 16"

    cli = zoo_cli("status", recipe, "--why")
    assert cli.code == 0, cli.text
    assert ["r", "will run", "config changed: data.image_size: 8 → 16"] in table_rows(cli.out)
    cli = zoo_cli("plan", recipe)
    assert cli.code == 0 and "data.image_size: 8 → 16" in cli.text, cli.text

    executor = RecordingExecutor()
    result = zoo.run(recipe, executor=executor)
    assert executor.submitted == ["r"]
    assert _reason(result, "r") == "config changed: data.image_size: 8 → 16"
    assert _reader_output(result)["shared"]["data"] == {"image_size": 16}


@pytest.mark.parametrize("edit", [("task: image-classification}", "task: object-detection}"),  # model.task
                                  ("channels: 1", "channels: 3"),
                                  ("arch: lenet5", "arch: alexnet"),
                                  ("source: digits", "source: npz, path: none.npz")],
                         ids=["model.task", "data.channels", "model.arch", "data.source"])
def test_an_undeclared_field_change_keeps_the_stage_cached(tmp_path, edit):
    recipe = write_recipe(tmp_path, READER)
    (tmp_path / "none.npz").write_bytes(b"")  # data.path must exist to validate; the reader never opens it
    first = zoo.run(recipe)
    assert first.ok
    recipe.write_text(READER.replace(*edit))
    assert recipe.read_text() != READER
    executor = RecordingExecutor()
    result = zoo.run(recipe, executor=executor)
    assert result.ok and executor.submitted == []
    assert {s.id: s.key for s in result.stages} == {s.id: s.key for s in first.stages}


def test_the_top_level_task_is_a_declarable_section(tmp_path):
    recipe = write_recipe(tmp_path, READER)
    zoo.run(recipe)
    recipe.write_text(READER.replace("task: image-classification\nmodel", "task: object-detection\nmodel"))
    plan = zoo.plan(recipe)
    assert _reason(plan, "r") == "config changed: task: image-classification → object-detection"


def test_the_worker_context_holds_only_the_declared_fields(tmp_path):
    result = zoo.run(write_recipe(tmp_path, READER), executor=ProcessExecutor(1))
    assert result.ok
    assert _reader_output(result)["shared"] == {"data": {"image_size": 8}, "model": {"num_classes": 10},
                                                "task": "image-classification"}


@pytest.mark.parametrize("name", ["model.task", "data.channels", "data.source"])
def test_reading_an_undeclared_field_fails_the_stage_and_names_it(tmp_path, name):
    # absent is not enough: `.get("task", default)` would hand the kind a value outside its key
    recipe = write_recipe(tmp_path, READER.replace("kind: reader", f"kind: reader\n    config: {{read: [{name}]}}"))
    result = zoo.run(recipe, executor=ProcessExecutor(1))
    assert not result.ok
    r = next(s for s in result.stages if s.id == "r")
    assert r.state == "failed"
    assert f"`{name}`" in r.error.message and "shared" in r.error.message, r.error


def test_reading_declared_fields_through_the_context_works(tmp_path):
    recipe = write_recipe(tmp_path, READER.replace("kind: reader", "kind: reader\n    config: {read: [data.image_size, task]}"))
    result = zoo.run(recipe, executor=ProcessExecutor(1))
    assert result.ok
    assert _reader_output(result)["read"] == {"data.image_size": 8, "task": "image-classification"}


def test_an_undeclared_section_is_refused_too(tmp_path):
    # the writer declares nothing: the whole `data` section is out of its reach
    recipe = write_recipe(tmp_path, READER)
    dag = planner.build(load(recipe))
    view = keys.shared_sections(dag.recipe, dag.nodes["w"])
    assert dict(view) == {}
    with pytest.raises(LookupError, match="`data`"):
        view.get("data")
    with pytest.raises(LookupError, match="`data`"):
        view["data"]


# ---------------------------------------------------------------------------------------------
# the lockfile: values, not only a digest; older lockfiles still read


def test_the_lockfile_records_the_declared_values(tmp_path):
    recipe = write_recipe(tmp_path, READER)
    zoo.run(recipe)
    raw = yaml.safe_load(lockfile.lock_path(recipe).read_text())
    assert raw["schema_version"] == lockfile.LOCK_SCHEMA_VERSION == 4
    (stages,) = raw["platforms"].values()
    assert stages["r"]["shared"] == {"data": {"image_size": 8}, "model": {"num_classes": 10},
                                     "task": "image-classification"}
    assert stages["w"]["shared"] == {}


def _as_version_1(lock_file) -> None:
    """Rewrite a lockfile the way a version 1 zoo wrote it: a digest of the shared values only."""
    from zoo.engine.hashing import digest_json

    raw = yaml.safe_load(lock_file.read_text())
    (stages,) = raw.pop("platforms").values()  # one flat map, as before platform classes
    raw["schema_version"], raw["stages"] = 1, stages
    for stage in raw["stages"].values():
        stage["shared_digest"] = digest_json(stage.pop("shared"))
    lock_file.write_text(yaml.safe_dump(raw, sort_keys=True))


def test_a_version_1_lockfile_is_still_read_and_explained(tmp_path):
    recipe = write_recipe(tmp_path, READER)
    zoo.run(recipe)
    _as_version_1(lockfile.lock_path(recipe))
    lock = lockfile.read(lockfile.lock_path(recipe))
    (records,) = lock.platforms.values()  # filed under the class of the host each record names
    assert records["r"].shared is None and len(records["r"].shared_digest) == 64

    assert {s.state for s in zoo.plan(recipe).stages} == {"cached"}
    recipe.write_text(READER.replace("image_size: 8", "image_size: 16"))
    reason = _reason(zoo.plan(recipe), "r")
    assert reason.startswith("config changed: recipe-wide sections") and "older zoo" in reason

    # the next run writes the current version, the values of the stages it kept included
    assert zoo.run(recipe).ok
    raw = yaml.safe_load(lockfile.lock_path(recipe).read_text())
    assert raw["schema_version"] == 4
    (stages,) = raw["platforms"].values()
    assert stages["w"]["shared"] == {} and "shared_digest" not in stages["w"]
    assert stages["r"]["shared"]["data"] == {"image_size": 16}


def test_a_lockfile_from_a_newer_zoo_is_refused_clearly(tmp_path):
    recipe = write_recipe(tmp_path, READER)
    zoo.run(recipe)
    lock_file = lockfile.lock_path(recipe)
    lock_file.write_text(lock_file.read_text().replace("schema_version: 4", "schema_version: 5"))
    with pytest.raises(RecipeError, match="unsupported schema_version 5"):
        lockfile.read(lock_file)


def test_a_kind_declaring_an_unknown_field_is_refused():
    from zoo.errors import InvalidInput

    class Typo:
        name, shared = "typo", ("model.nmu_classes",)

    with pytest.raises(InvalidInput, match="model.nmu_classes"):
        keys.declared_fields(Typo)
    Typo.shared = ("modle",)
    with pytest.raises(InvalidInput, match="no section 'modle'"):
        keys.declared_fields(Typo)
    Typo.shared = ("task.name",)
    with pytest.raises(InvalidInput, match="task.name"):
        keys.declared_fields(Typo)


def test_the_known_sections_are_the_recipes(tmp_path):
    recipe = load(write_recipe(tmp_path, READER))
    assert set(keys.section_fields()) == set(recipe.shared())
    # a field added after lockfiles recorded its whole section is left out of the plain value while
    # unset (data.block_size: zoo_stages.sections.data._OMITTED_WHEN_UNSET), so old records stay
    from zoo_stages.sections.data import _OMITTED_WHEN_UNSET

    omitted = {"data": set(_OMITTED_WHEN_UNSET)}
    assert all(set(fields or ()) == set(recipe.shared()[name] or ()) | omitted.get(name, set())
               for name, fields in keys.section_fields().items() if isinstance(recipe.shared()[name], dict))


# ---------------------------------------------------------------------------------------------
# the built-in kinds: every declared field changes the key, every other field does not


BUILTIN = """\
schema_version: 1
name: keys
version: 1.0.0
task: image-classification
model: {arch: lenet5, num_classes: 10, input_name: input, output_name: logits, task: image-classification}
data: {source: digits, path: data.npz, image_size: 8, channels: 1, val_fraction: 0.2, split_seed: 0}
stages:
  train: {}
  export: {}
  optimize: {}
  quantize: {needs: [export]}
  verify:
    needs: [optimize, quantize]
    config: {builds: {cpu-fp32: optimize, cpu-int8: quantize}}
  deploy:
    needs: [export, optimize, quantize, verify]
    config: {builds: {cpu-fp32: {from: optimize}, cpu-int8: {from: quantize}}}
"""

# another valid value for every recipe-wide field (files they name exist in the test folder)
OTHER = {
    # model.from names a version the test publishes into the local zoo (`_publish_parent`)
    "model.from": "zoo:tiny@1.0.0", "model.build": "cpu-fp32", "model.head": "new",
    "model.arch": None, "model.entry": "net.py:build", "model.num_classes": 11, "model.input_name": "image",
    "model.output_name": "scores", "model.task": "object-detection",
    "model.inputs": {"image": InputSpec(shape=["batch", 1, 8, 8])},
    "model.hidden": [16], "model.dropout": 0.2, "model.hidden_size": 64, "model.num_layers": 3,
    "model.num_heads": 4, "model.intermediate_size": 128, "model.max_length": 64, "model.vocab_size": 500,
    "model.framework": "sklearn", "model.estimator": "Ridge", "model.params": {"alpha": 2.0},
    "model.architecture": "DistilBertForSequenceClassification", "model.config": {"dim": 32},
    # a save_pretrained folder the test writes (`_pretrained_folder`): its files enter train's key
    "model.pretrained": PretrainedSpec(path="hf", sha256={"config.json": "1" * 64, "model.safetensors": "2" * 64}),
    "data.source": "npz", "data.path": "other.npz", "data.image_size": 16, "data.channels": 3,
    "data.val_fraction": 0.3, "data.split_seed": 1, "data.limit": 100,
    # key computation reads only the data's files: these need not suit the digits source
    "data.text": "t", "data.tokenizer": {"train": {"vocab_size": 100}}, "data.max_length": 16,
    "data.token_type_ids": True, "data.block_size": 64, "data.image": {"size": [8, 6]}, "data.inputs": {"a": ["x"]}, "data.input": "x",
    "data.columns": ["x"], "data.label": "z", "data.normalize": "standard",
    "data.repo": "../elsewhere", "data.rev": "f" * 40, "data.format": "csv",  # dvc's fields (source stays digits)
    "task": "object-detection",
}

# the model: fields that shape the network, read by train and export
_BUILD = {"model.from", "model.build", "model.head", "model.arch", "model.entry", "model.num_classes", "model.hidden",
          "model.dropout", "model.hidden_size", "model.num_layers", "model.num_heads", "model.intermediate_size",
          "model.max_length", "model.vocab_size", "model.architecture", "model.config", "model.pretrained"}

# what each kind reads (the issue's case: model.task is card metadata, it must not retrain)
EXPECTED = {
    "train": {"data.*", "task", *_BUILD, "model.input_name", "model.inputs", "model.framework", "model.estimator",
              "model.params"},
    # the estimator and its params reach export through the checkpoint; the framework picks its exporter
    "export": {"data.*", "task", *_BUILD, "model.input_name", "model.output_name", "model.inputs", "model.framework"},
    "optimize": {"model.inputs"},
    "quantize": {"data.*", "task", "model.inputs"},
    "verify": {"data.*", "task", "model.inputs", "model.num_classes"},
    "deploy": {"data.*", "model.task", "task"},
}


def _all_fields() -> list[str]:
    out = []
    for section, fields in keys.section_fields().items():
        out += [f"{section}.{f}" for f in fields] if fields else [section]
    return out


def _keys_with(folder, field: str | None) -> dict[str, str]:
    """Every stage's key for the BUILTIN recipe with `field` set to its OTHER value."""
    recipe = load(write_recipe(folder, BUILTIN))
    if field:
        section, _, name = field.partition(".")
        if name:
            spec = getattr(recipe.spec, section)
            attribute = {f.alias or n: n for n, f in type(spec).model_fields.items()}[name]  # model.from: from_
            # the value as the field's type holds it (a dict where a model belongs would serialise
            # with a warning); the section is not validated again: OTHER's values change one field
            value = TypeAdapter(type(spec).model_fields[attribute].annotation).validate_python(OTHER[field])
            setattr(recipe.spec, section, spec.model_copy(update={attribute: value}))
        else:
            setattr(recipe.spec, section, OTHER[field])
    dag = planner.build(recipe)
    fixed_inputs = {"in": {"model": "0" * 64}}  # the same upstream digests for every variant
    hashes = Cache(folder / "cache").ensure().hashes
    return {nid: keys.key_of(keys.key_parts(dag.recipe, node, fixed_inputs, hashes, {}))
            for nid, node in dag.nodes.items()}


def _declares(kind: str, field: str) -> bool:
    expected = EXPECTED[kind]
    return field in expected or f"{field.partition('.')[0]}.*" in expected


def test_the_fields_of_every_section_have_another_value_here():
    assert set(OTHER) == set(_all_fields())


def test_every_builtin_kind_declares_exactly_what_it_reads():
    builtin = {name for name in kind_loader.available() if kind_loader.get(name).__module__.startswith("zoo_stages.")}
    assert builtin == set(EXPECTED)
    for name in builtin:
        got = set()
        for section, fields in keys.declared_fields(kind_loader.get(name)).items():
            if fields is None:  # the whole section: `data.*`, or a plain value such as `task`
                got.add(f"{section}.*" if keys.section_fields()[section] else section)
            else:
                got |= {f"{section}.{f}" for f in fields}
        assert got == EXPECTED[name], name


def _publish_parent(folder) -> None:
    """tiny@1.0.0 in the local zoo, for `model.from` (its file enters train's and export's keys)."""
    from zoo.registry.store import LocalZoo
    from registry_servers import make_staging

    LocalZoo().publish(make_staging(folder / "parent"))


def test_a_recipe_wide_field_changes_exactly_the_keys_of_the_kinds_that_declare_it(tmp_path):
    _publish_parent(tmp_path)
    (tmp_path / "data.npz").write_bytes(b"not read: the source is digits")
    (tmp_path / "other.npz").write_bytes(b"another file")
    (tmp_path / "net.py").write_text("def build(num_classes, in_channels):\n    raise NotImplementedError\n")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"not read: keys digest the files")
    base = _keys_with(tmp_path, None)
    for field in _all_fields():
        changed = _keys_with(tmp_path, field)
        for stage, key in changed.items():
            kind = stage  # the stage ids are the kind names
            assert (key != base[stage]) == _declares(kind, field), \
                f"{field} {'should' if _declares(kind, field) else 'should not'} change the key of {kind}"


def test_model_task_leaves_train_and_export_cached_but_reruns_deploy(tmp_path):
    (tmp_path / "data.npz").write_bytes(b"x")
    base, changed = _keys_with(tmp_path, None), _keys_with(tmp_path, "model.task")
    assert changed["train"] == base["train"] and changed["export"] == base["export"]
    assert changed["deploy"] != base["deploy"]
