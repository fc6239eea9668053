"""Mark as skipped, in a cosmic-ray session, the mutants no test could ever tell apart.

    python scripts/mutation_filter.py SESSION CONFIG

- mutants inside a type annotation of a module with ``from __future__ import annotations``
  (function signatures, and variable annotations outside pydantic models): the annotation is a
  string Python never evaluates, so ``dict | None`` turned into ``dict - None`` changes nothing;
- mutants by the operators the config's ``[cosmic-ray.filters.operators-filter]
  exclude-operators`` names (regular expressions), each with its reason in docs/mutation.md.

scripts/mutation.sh runs it after `cosmic-ray init`; skipped mutants are counted apart.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from cosmic_ray.config import load_config
from cosmic_ray.work_db import use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult

PYDANTIC_BASES = {"BaseModel", "KindConfig"}


def annotation_spans(source: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions, as (line, column), of the annotations Python never evaluates."""
    tree = ast.parse(source)
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
               and any(a.name == "annotations" for a in n.names) for n in tree.body):
        return []
    spans = []

    def add(node):
        if node is not None:
            spans.append(((node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)))

    def visit(node, in_model=False):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg):
                    if arg is not None:
                        add(arg.annotation)
                add(child.returns)
                visit(child, False)
            elif isinstance(child, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in child.bases}
                visit(child, bool(bases & PYDANTIC_BASES))
            elif isinstance(child, ast.AnnAssign) and not in_model:  # pydantic evaluates its fields'
                add(child.annotation)
            else:
                visit(child, in_model)

    visit(tree)
    return spans


def main(session: str, config_path: str) -> int:
    config = load_config(config_path)
    excluded = config.sub("filters", "operators-filter").get("exclude-operators", ())
    pattern = re.compile("|".join(f"(?:{e})" for e in excluded)) if excluded else None
    spans: dict[Path, list] = {}
    skipped = {"annotation": 0, "operator": 0}
    with use_db(session) as db:
        for item in list(db.pending_work_items):
            for m in item.mutations:
                path = Path(m.module_path)
                if path not in spans:
                    spans[path] = annotation_spans(path.read_text(encoding="utf-8"))
                why = None
                if any(s <= tuple(m.start_pos) and tuple(m.end_pos) <= e for s, e in spans[path]):
                    why = "annotation"
                elif pattern is not None and pattern.match(m.operator_name):
                    why = "operator"
                if why:
                    skipped[why] += 1
                    db.set_result(item.job_id, WorkResult(output=f"skipped: {why}", worker_outcome=WorkerOutcome.SKIPPED))
                    break
    print(f"   skipped {skipped['annotation']} mutants in annotations, {skipped['operator']} by excluded operators")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
