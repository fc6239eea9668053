"""Mark as skipped the mutants of a cosmic-ray session that sit inside a function's annotations.

    python scripts/mutation_skip_annotations.py mutation/AREA.sqlite

In a module with ``from __future__ import annotations`` the annotations of a function's
parameters and return value are strings that nothing evaluates at run time (zoo never calls
``typing.get_type_hints`` on its functions), so a mutant there (``Path | None`` turned into
``Path - None``) is equivalent by construction: cosmic-ray makes eleven of them per ``|`` and
no test could ever kill one. Class-level annotations are left alone: pydantic evaluates those.
Run by scripts/mutation.sh right after `cosmic-ray init`; the skipped mutants are counted
apart in the report (``cr-report`` shows them as skipped, not as survivors).
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from pathlib import Path

from cosmic_ray.work_db import use_db
from cosmic_ray.work_item import WorkerOutcome, WorkResult


@cache
def annotation_spans(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions, (row 1-based, column 0-based), of every function annotation
    that is never evaluated: none unless the module has `from __future__ import annotations`."""
    tree = ast.parse(Path(module).read_text())
    postponed = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                    and any(a.name == "annotations" for a in n.names) for n in tree.body)
    if not postponed:
        return []
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, [a.vararg, a.kwarg])]
            for ann in [p.annotation for p in params] + [node.returns]:
                if ann is not None:
                    spans.append(((ann.lineno, ann.col_offset), (ann.end_lineno, ann.end_col_offset)))
    return spans


def main(session: str) -> int:
    skipped = 0
    with use_db(session) as db:
        for item in list(db.pending_work_items):
            for m in item.mutations:
                start, end = tuple(m.start_pos), tuple(m.end_pos)
                if any(a <= start and end <= b for a, b in annotation_spans(str(m.module_path))):
                    db.set_result(item.job_id, WorkResult(output="inside an unevaluated annotation (equivalent)",
                                                          worker_outcome=WorkerOutcome.SKIPPED))
                    skipped += 1
                    break
    print(f"   {skipped} mutants inside unevaluated annotations skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
