"""What `zoo validate` checks of a planned recipe beyond its schema, and every run before its first stage.

`zoo.engine.pipeline.load` calls `check` on the DAG it plans, so validate, plan and run share it.
The recipe parser already ran each section's `check` (zoo/section.py: data files, the exporter of
the model…); this adds what only the wired stages tell:

- every upstream stage a stage's config names (`StageKind.stage_references`: deploy's
  ``builds.NAME.from``, verify's ``builds``, ``model_from``) is among its `needs`: the stage reads it
  by id (`Inputs.stage`), so a stage missing from `needs:` would fail only after the stages before
  it ran. The error is at the line of that field, and says which `needs:` to extend;
- what each stage's kind can tell from the files that exist now (`StageKind.preflight`: export
  reads an imported ONNX file's ports, without onnx, against ``model.inputs``), its
  `zoo.errors.FieldError` placed at the recipe's field.

The engine knows no kind: the references come from the kinds' hook.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from zoo.engine.yamlpos import dotted

if TYPE_CHECKING:
    from zoo.engine.planner import Dag, Node


def check(dag: "Dag") -> None:
    """RecipeError at the first config field that names a stage its stage does not need, then at the
    first field a kind's preflight refuses."""
    from zoo.engine import kind_loader

    for node in dag.nodes.values():
        references = kind_loader.get(node.kind)().stage_references(node.instance.config) or {}
        for path, stage_id in references.items():
            if stage_id not in node.needs:
                _refuse(dag, node, tuple(path), stage_id)
    for node in dag.nodes.values():
        _kind_preflight(dag, node)


def _kind_preflight(dag: "Dag", node: "Node") -> None:
    """The kind's own `preflight`, its FieldError placed at the recipe's field."""
    from zoo.engine import keys, kind_loader
    from zoo.errors import FieldError

    try:
        kind_loader.get(node.kind)().preflight(node.instance.config, keys.key_context(dag.recipe, node))
    except FieldError as e:
        field = tuple(e.field)
        where = ("stages", node.instance.base_id, *field) if field[:1] == ("config",) else field
        raise dag.recipe.located.error(where, e.message, hint=e.hint) from None


def _refuse(dag: "Dag", node: "Node", path: tuple, stage_id: str) -> None:
    recipe = dag.recipe
    sid = node.instance.base_id
    where = ("stages", sid, "config", *path)
    field = dotted(path)
    needs = ", ".join(node.needs) or "nothing"
    if stage_id in dag.nodes or stage_id in recipe.instances:
        if stage_id in recipe.instances and stage_id not in dag.nodes:  # a matrix stage: name one instance
            instances = ", ".join(i.id for i in recipe.instances[stage_id])
            raise recipe.located.error(where, f"{field}: {stage_id!r} is a matrix stage; name one of its instances",
                                       hint=f"its instances: {instances}")
        upstream = {stage_id} | set(dag.ancestors(stage_id))
        if sid in upstream or any(n.startswith(sid + "[") for n in upstream):
            raise recipe.located.error(where, f"{field}: stage {sid!r} cannot read {stage_id!r}, which runs after it",
                                       hint=f"name a stage {sid!r} needs ({needs})")
        raise recipe.located.error(where, f"{field}: stage {sid!r} reads stage {stage_id!r} but does not need it "
                                          f"(its needs: {needs})",
                                   hint=f"add {stage_id!r} to `needs:` of stage {sid!r}: "
                                        f"needs: [{', '.join([*_written_needs(dag, sid), stage_id])}]")
    close = difflib.get_close_matches(stage_id, list(dag.nodes), n=1)
    raise recipe.located.error(where, f"{field}: {stage_id!r} is not a stage of this recipe"
                                      + (f" — did you mean {close[0]!r}?" if close else ""),
                               hint=f"stages: {', '.join(dag.nodes)}")


def _written_needs(dag: "Dag", sid: str) -> list[str]:
    """The stage's needs as the recipe writes them (the stage before it when it writes none)."""
    spec = dag.recipe.spec.stages[sid]
    if spec.needs is not None:
        return list(spec.needs)
    ids = list(dag.recipe.instances)
    at = ids.index(sid)
    return [ids[at - 1]] if at else []
