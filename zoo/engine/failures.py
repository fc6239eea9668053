"""What a failed stage's error tells the user to do, and whether running it again can help.

A kind raises with what it knows; this adds what only the recipe knows, so the hint leads to the
line to change:

- a quality gate failed (`GateFailed`): each failing gate (the kind's `gates()` hook, read from
  what the stage measured before it failed), its value, and the recipe's file:line:col of the gate
  as written; the same inputs give the same verdict, so no rerun is suggested;
- a version published with other bytes (`Conflict`): versions are immutable, so the one way out
  is a new `version:` (its file:line:col) or `zoo rm NAME@VERSION` of a local copy never shared;
- a recipe field the stage found wrong (`zoo.errors.FieldError`: a data file without the column
  `data.label` names): the message is prefixed with the recipe's file:line:col of that field (of
  its section when the recipe leaves the field to its default), one line, no log needed.

`zoo.engine.pipeline.run` (the API's `zoo.api.run`) applies `explain` to every failed stage, so
the CLI, `--json` and the Python API say the same. The engine knows no kind: gates come through
`StageKind.gates`, and a gate is found in the recipe by its text, wherever the kind's config keeps it.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from zoo.errors import ExitCode

if TYPE_CHECKING:
    from zoo.engine.planner import Dag
    from zoo.engine.runner import StageReport
    from zoo.engine.worker import WorkerError
    from zoo.engine.yamlpos import Node

SAME_AGAIN = ("GateFailed", "Conflict")  # errors a rerun of the same inputs meets again
# what LocalZoo says of a version published with other content (zoo/registry/store.py)
PUBLISHED_CONFLICT = "is already published with different content"


def explain(report: "StageReport", dag: "Dag") -> "WorkerError | None":
    """The failed stage's error with a hint that names what to change in the recipe (or as it was)."""
    error = report.error
    if error is None or report.id not in dag.nodes:
        return error
    if error.field:
        pos = dag.recipe.located.where(error.field)
        return replace(error, message=f"{_shown(Path(dag.recipe.path))}:{pos.line}:{pos.col}: {error.message}")
    if error.type == "GateFailed":
        return replace(error, hint=_gate_hint(report, dag) or error.hint)
    if error.type == "Conflict" and PUBLISHED_CONFLICT in error.message:  # not a kind's own conflict
        return replace(error, hint=_conflict_hint(dag))
    return error


def retry_helps(error: "WorkerError | None") -> bool:
    """Whether `zoo run RECIPE STAGE --force` may end otherwise: not for a failed gate, a version
    conflict, or invalid input (the same recipe and inputs give the same answer)."""
    return error is None or (error.type not in SAME_AGAIN and error.exit_code != ExitCode.INVALID)


def _gate_hint(report: "StageReport", dag: "Dag") -> str | None:
    from zoo.engine import kind_loader

    node = dag.nodes[report.id]
    try:
        outcomes = kind_loader.get(node.kind)().gates(report.metrics or {}) or []
    except Exception:  # noqa: BLE001 (a kind's hook failing on partial metrics must not hide the error itself)
        outcomes = []
    failing = [g for g in outcomes if not g.passed]
    config = _child(_child(_child(dag.recipe.located.root, "stages"), node.instance.base_id), "config")
    config_path = ("stages", node.instance.base_id, "config")
    lines = []
    for g in failing:
        value = "not measured" if g.value is None else f"got {_number(g.value)}"
        found = _find_text(config, g.gate, config_path)
        if found is None and config is not None:  # the kind words the gate itself: point at the config
            found = config, config_path
        where = f", at {_place(dag, found[0])} ({'.'.join(map(str, found[1]))})" if found else ""
        lines.append(f"  {g.gate}: {value}{where}")
    if not lines:  # a gate the kind checked without reporting it (an export's parity): its config
        if config is None:
            return None
        return (f"the stage's config is at {_place(dag, config)} (stages.{node.instance.base_id}.config); "
                "the same inputs give the same verdict: change the model, or the config if its bar is wrong")
    return ("the failing gate(s), as the recipe writes them:\n" + "\n".join(lines) + "\n"
            "the same inputs give the same verdict: improve the model (training, quantization...), "
            "or change the gate in the recipe if its bar is wrong")


def _conflict_hint(dag: "Dag") -> str:
    recipe = dag.recipe
    version = _child(recipe.located.root, "version")
    at = f" ({_place(dag, version)})" if version is not None else ""
    return (f"versions are immutable: bump `version:` in the recipe{at}, or `zoo rm {recipe.name}@{recipe.version}` "
            "if that local copy was never shared, then run the recipe again")


def _child(node: "Node | None", key: str) -> "Node | None":
    from zoo.engine.yamlpos import Mapping, Scalar

    if not isinstance(node, Mapping):
        return None
    for k, v in node.value:
        if isinstance(k, Scalar) and k.value == key:
            return v
    return None


def _find_text(node: "Node | None", text: str, path: tuple) -> tuple["Node", tuple] | None:
    """The first scalar under `node` whose text is `text`, with its key path."""
    for found, where in _scalars(node, path):
        if found.value == text:
            return found, where
    return None


def _scalars(node: "Node | None", path: tuple) -> Iterator[tuple["Node", tuple]]:
    from zoo.engine.yamlpos import Mapping, Scalar, Sequence

    stack: list[tuple[Any, tuple]] = [(node, path)]
    while stack:  # depth-first, in file order, without recursion (recipes may nest deeply)
        current, where = stack.pop()
        if isinstance(current, Scalar):
            yield current, where
        elif isinstance(current, Mapping):
            stack += [(v, where + (k.value,)) for k, v in reversed(current.value)]
        elif isinstance(current, Sequence):
            stack += [(v, where + (i,)) for i, v in reversed(list(enumerate(current.value)))]


def _place(dag: "Dag", node: "Node") -> str:
    """file:line:col of `node`, the file relative to the current folder when it is inside it."""
    return f"{_shown(Path(dag.recipe.path))}:{node.line}:{node.col}"


def _shown(path: Path) -> str:
    """`path` relative to the current folder when it is inside it."""
    try:
        shown = os.path.relpath(path)
        return str(path) if shown.startswith("..") else shown
    except ValueError:  # another drive (Windows)
        return str(path)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
