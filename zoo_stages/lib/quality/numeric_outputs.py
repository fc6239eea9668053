"""The `equivalence` hook of the built-in kinds: outputs judged file by file (zoo_stages/lib/quality/equivalence.py).

A mixin of its own, apart from the judging code, because a kind imports it at module level and a
kind's cache key holds the code its module imports: the judge runs only under `zoo repro --check`
and computes no output byte, so it must not be in any key. The closure does not follow imports
inside a method called ``equivalence`` (zoo.engine.import_closure.UNKEYED_HOOKS); this module
imports nothing of the judge at module level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from zoo.stage import Equivalence, EquivalenceContext


class NumericOutputs:
    """Mixin for a kind whose outputs are judged file by file (the built-in kinds)."""

    derived_files: tuple[str, ...] = ()  # glob patterns (file names) of files not compared

    def equivalence(self, locked: Mapping[str, Path], rebuilt: Mapping[str, Path], config: Any,
                    context: EquivalenceContext | None) -> Equivalence:
        from zoo_stages.lib.quality import equivalence as judge

        quality = context.quality_tolerance if context is not None else judge.QUALITY_TOLERANCE
        return judge.compare_outputs(locked, rebuilt, tolerance=judge.MODEL_TOLERANCE, derived=self.derived_files,
                                     quality_tolerance=quality)
