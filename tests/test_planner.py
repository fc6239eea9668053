"""The DAG (zoo/engine/planner.py): implicit and explicit needs, matrix fan-in and axis matching, instance
needs, errors that point at the YAML (unknown need, self need, cycle), topological order that keeps
file order, and the graph queries (`ancestors`, `select`). In-process, nothing runs."""

from __future__ import annotations

import pytest

from cli_helpers import write_recipe
from zoo.engine import planner
from zoo.errors import PlanError, RecipeError
from zoo.engine.recipe import load

HEAD = "schema_version: 1\nname: dag\nversion: 0.1.0\nstages:\n"


def dag_of(tmp_path, stages: str) -> planner.Dag:
    return planner.build(load(write_recipe(tmp_path, HEAD + stages)))


def needs(dag) -> dict[str, list[str]]:
    return {nid: n.needs for nid, n in dag.nodes.items()}


def test_without_needs_a_stage_needs_the_one_before_it(tmp_path):
    dag = dag_of(tmp_path, "  a: {kind: writer}\n  b: {kind: concat}\n  c: {kind: concat}\n")
    assert needs(dag) == {"a": [], "b": ["a"], "c": ["b"]}
    assert dag.order() == ["a", "b", "c"]


def test_explicit_needs_keep_declaration_order_once_each(tmp_path):
    dag = dag_of(tmp_path, "  a: {kind: writer}\n  b: {kind: writer, needs: []}\n"
                           "  c: {kind: concat, needs: [b, a, b]}\n")
    assert needs(dag) == {"a": [], "b": [], "c": ["b", "a"]}


def test_topological_order_keeps_file_order_among_ready_stages(tmp_path):
    # z is first in the file but needs y; x and y are ready first, in file order
    dag = dag_of(tmp_path, "  z: {kind: concat, needs: [y]}\n  x: {kind: writer, needs: []}\n"
                           "  y: {kind: writer, needs: []}\n  w: {kind: concat, needs: [z, x]}\n")
    assert dag.order() == ["x", "y", "z", "w"]
    # a stage comes after every stage it needs, even when those become ready in later rounds
    dag = dag_of(tmp_path, "  d: {kind: concat, needs: [c, a]}\n  c: {kind: concat, needs: [b]}\n"
                           "  b: {kind: concat, needs: [a]}\n  a: {kind: writer, needs: []}\n")
    assert dag.order() == ["a", "b", "c", "d"]


MATRIX = """\
  make:
    kind: writer
    matrix: {build: [fp32, int8]}
  check:
    kind: concat
    matrix: {build: [fp32, int8], size: [s, l]}
  other:
    kind: concat
    matrix: {device: [cpu, gpu]}
    needs: [make]
  publish:
    kind: concat
    needs: [check]
  one:
    kind: concat
    needs: ["make[int8]"]
"""


def test_matrix_needs_match_shared_axes_and_fan_in_otherwise(tmp_path):
    dag = dag_of(tmp_path, MATRIX)
    n = needs(dag)
    assert n["check[int8,l]"] == ["make[int8]"] and n["check[fp32,s]"] == ["make[fp32]"]  # the shared axis
    assert n["other[gpu]"] == ["make[fp32]", "make[int8]"]  # no shared axis: every instance
    assert n["publish"] == ["check[fp32,s]", "check[fp32,l]", "check[int8,s]", "check[int8,l]"]  # fan-in
    assert n["one"] == ["make[int8]"]  # one named instance
    assert dag.order()[:2] == ["make[fp32]", "make[int8]"]


def test_ancestors_are_transitive(tmp_path):
    dag = dag_of(tmp_path, MATRIX)
    assert dag.ancestors("publish") == ["make[fp32]", "make[int8]", "check[fp32,s]", "check[fp32,l]",
                                        "check[int8,s]", "check[int8,l]"]
    assert dag.ancestors("make[fp32]") == []
    chain = dag_of(tmp_path, "  a: {kind: writer}\n  b: {kind: concat}\n  c: {kind: concat}\n  d: {kind: concat}\n")
    assert chain.ancestors("d") == ["a", "b", "c"]


def test_select_takes_stage_ids_and_instance_ids(tmp_path):
    dag = dag_of(tmp_path, MATRIX)
    assert dag.select(["make"]) == {"make[fp32]", "make[int8]"}
    assert dag.select(["check[int8,s]", "one"]) == {"check[int8,s]", "one"}
    assert dag.select([]) == set()
    with pytest.raises(PlanError) as e:
        dag.select(["publsh"])
    assert "no stage called 'publsh'" in e.value.message and "did you mean 'publish'?" in e.value.hint
    with pytest.raises(PlanError) as e:
        dag.select(["zzzzzz"])
    assert e.value.hint.startswith("stages: make[fp32], make[int8]")


def test_an_unknown_need_points_at_it_with_a_suggestion(tmp_path):
    with pytest.raises(RecipeError) as e:
        dag_of(tmp_path, "  train: {kind: writer}\n  export: {kind: concat, needs: [train, trian]}\n")
    assert "stage 'export' needs 'trian', which is not a stage of this recipe" in e.value.message
    assert "did you mean 'train'?" in e.value.hint
    assert "in stages.export.needs.1" in e.value.message
    assert ":6:" in str(e.value) or "line 6" in str(e.value)  # the second item of line 6's needs
    with pytest.raises(RecipeError) as e:
        dag_of(tmp_path, "  train: {kind: writer}\n  export: {kind: concat, needs: [qqqqqq]}\n")
    assert e.value.hint == "stages: train, export"


@pytest.mark.parametrize("stages", [
    "  a: {kind: writer}\n  b: {kind: concat, needs: [b]}\n",
    "  a: {kind: writer, matrix: {x: [1, 2]}}\n  b: {kind: concat, needs: [a]}\n"
    "  c: {kind: concat, matrix: {x: [1, 2]}, needs: [\"c[2]\"]}\n",
])
def test_a_stage_that_needs_itself_is_refused(tmp_path, stages):
    with pytest.raises(RecipeError) as e:
        dag_of(tmp_path, stages)
    assert "needs itself" in e.value.message and "own `needs:`" in e.value.hint


def test_a_cycle_is_named_in_order(tmp_path):
    with pytest.raises(RecipeError) as e:
        dag_of(tmp_path, "  ok: {kind: writer, needs: []}\n  a: {kind: concat, needs: [c]}\n"
                         "  b: {kind: concat, needs: [a]}\n  c: {kind: concat, needs: [b, ok]}\n")
    assert "the stages form a cycle: a → c → b → a" in e.value.message
    assert "in stages.a.needs" in e.value.message  # the error points at the first stage of the cycle
    assert "form a DAG" in e.value.hint


def test_a_large_dense_dag_orders_every_stage_after_its_needs(tmp_path):
    n = 60
    text = "".join(f"  s{i}: {{kind: concat, needs: [{', '.join(f's{j}' for j in range(i))}]}}\n" for i in range(n))
    dag = dag_of(tmp_path, text.replace("needs: []", "needs: []", 1))
    order = dag.order()
    assert order == [f"s{i}" for i in range(n)]
    assert len(dag.nodes["s59"].needs) == 59


def test_a_matrix_of_one_value_matches_its_axis(tmp_path):
    dag = dag_of(tmp_path, "  make: {kind: writer, matrix: {build: [fp32]}}\n"
                           "  check: {kind: concat, matrix: {build: [fp32], size: [s, l]}}\n")
    assert needs(dag) == {"make[fp32]": [], "check[fp32,s]": ["make[fp32]"], "check[fp32,l]": ["make[fp32]"]}
