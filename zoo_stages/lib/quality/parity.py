"""How a candidate model's outputs compare with a reference's: one rule set for every kind.

Outputs are compared by name (``{output name: array}``, as `onnx_run.run` returns them), with a
rule chosen by element type:

- floating-point outputs (any width; compared in float64): an element passes when
  ``|got - ref| <= atol + rtol * |ref|`` (NaN never passes). Figures: max-abs, max-rel (over
  elements where ref != 0), mean-abs, per-sample cosine similarity (axis 0 = samples; mean and
  smallest; NaN for a sample with non-finite values, so no summary of it looks good) and, for
  (samples, classes) outputs, the share of samples whose argmax agrees (top-1 agreement);
- integer, boolean and string outputs (labels, ids, masks): exact. Figures: the number and share
  of elements that differ; it passes when that share is at most ``Tolerance.mismatch`` (0 by
  default). A label one class off is a mismatch however close the numbers are.

An output missing from the candidate, or with another shape, or a float output against an exact
one, fails with a note. `Tolerance` is the default for every output, ``overrides`` replace it
for named ones. The `ParityReport` prints as a table (`table`), stores as JSON (`to_json`), gives
flat figures for a manifest (`metrics`) and raises GateFailed with the table (`require`).

numpy is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from zoo.errors import GateFailed

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """What one output may differ by: ``atol + rtol * |ref|`` per float element; the share of
    elements of an exact (integer, boolean, string) output allowed to differ."""

    atol: float = 0.0
    rtol: float = 0.0
    mismatch: float = 0.0

    def describe(self, exact: bool) -> str:
        if exact:
            return "exact" if self.mismatch == 0 else f"<= {self.mismatch:g} differ"
        return f"<= {self.atol:g} + {self.rtol:g}*|ref|"


@dataclass(frozen=True)
class OutputParity:
    """How one output of the candidate compares with the reference's."""

    name: str
    dtype: str  # the reference's element type
    shape: tuple[int, ...]  # the reference's shape
    exact: bool  # compared element for element (integer, boolean, string outputs)
    tolerance: Tolerance
    elements: int
    violations: int  # float elements outside the tolerance, or exact elements that differ
    note: str | None = None  # why the output could not be compared (missing, shape, element type)
    # floating-point outputs
    max_abs: float | None = None
    max_rel: float | None = None
    mean_abs: float | None = None
    cosine: float | None = None  # mean per-sample cosine similarity
    cosine_min: float | None = None
    top1_agreement: float | None = None  # (samples, classes) outputs only
    worst_excess: float | None = None  # max of |got - ref| - (atol + rtol*|ref|); > 0 means failed

    @property
    def mismatch_fraction(self) -> float:
        return self.violations / self.elements if self.elements else 0.0

    @property
    def passed(self) -> bool:
        if self.note is not None:
            return False
        if self.exact:
            return self.mismatch_fraction <= self.tolerance.mismatch
        return self.violations == 0

    def to_json(self) -> dict[str, Any]:
        """The record a kind stores: non-finite figures become None (JSON has no NaN)."""
        out: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "passed": self.passed}
        if self.exact:
            out.update(exact=True, mismatches=self.violations, elements=self.elements,
                       mismatch_fraction=self.mismatch_fraction, tolerance=self.tolerance.mismatch)
        else:
            out.update(max_abs=self.max_abs, max_rel=self.max_rel, mean_abs=self.mean_abs, cosine=self.cosine,
                       cosine_min=self.cosine_min, violations=self.violations, elements=self.elements,
                       atol=self.tolerance.atol, rtol=self.tolerance.rtol)
            if self.top1_agreement is not None:
                out["top1_agreement"] = self.top1_agreement
        if self.note is not None:
            out["note"] = self.note
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in out.items()}


@dataclass(frozen=True)
class ParityReport:
    """Every output's comparison, in the reference's output order."""

    tolerance: Tolerance
    samples: int
    outputs: list[OutputParity] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def output(self, name: str) -> OutputParity:
        return next(o for o in self.outputs if o.name == name)

    def _floats(self, attr: str) -> list[float]:
        return [getattr(o, attr) for o in self.outputs if getattr(o, attr) is not None]

    @property
    def max_abs(self) -> float:
        """The largest absolute difference over float outputs (0 without any)."""
        return max(self._floats("max_abs"), default=0.0)

    @property
    def max_rel(self) -> float:
        return max(self._floats("max_rel"), default=0.0)

    @property
    def mean_abs(self) -> float:
        return max(self._floats("mean_abs"), default=0.0)

    @property
    def cosine(self) -> float:
        """The lowest mean per-sample cosine over float outputs (1 without any; NaN propagates)."""
        values = self._floats("cosine")
        return _nan_min(values) if values else 1.0

    @property
    def cosine_min(self) -> float:
        values = self._floats("cosine_min")
        return _nan_min(values) if values else 1.0

    @property
    def top1_agreement(self) -> float | None:
        """Top-1 agreement of the first (samples, classes) output, None without one."""
        values = self._floats("top1_agreement")
        return values[0] if values else None

    def metrics(self, prefix: str = "parity_") -> dict[str, float | int]:
        """Flat figures for a manifest: max_abs, mean_abs, cosine, top-1 agreement, tolerances, samples."""
        out: dict[str, float | int] = {
            f"{prefix}max_abs": _finite(self.max_abs),
            f"{prefix}mean_abs": _finite(self.mean_abs),
            f"{prefix}cosine": _finite(self.cosine),
            f"{prefix}atol": self.tolerance.atol,
            f"{prefix}rtol": self.tolerance.rtol,
            f"{prefix}samples": self.samples,
        }
        if self.top1_agreement is not None:
            out[f"{prefix}top1_agreement"] = self.top1_agreement
        return out

    def to_json(self) -> dict[str, Any]:
        """The report a kind stores: verdict, samples, default tolerance, one record per output."""
        return {"passed": self.passed, "samples": self.samples, "atol": self.tolerance.atol,
                "rtol": self.tolerance.rtol, "outputs": {o.name: o.to_json() for o in self.outputs}}

    def table(self) -> str:
        """A fixed-width text table, one row per output."""
        rows = [("output", "dtype", "shape", "rule", "max_abs", "max_rel", "cosine", "top1", "violations", "result")]
        for o in self.outputs:
            rows.append((o.name, o.dtype, "x".join(map(str, o.shape)) or "scalar", o.tolerance.describe(o.exact),
                         _fmt(o.max_abs), _fmt(o.max_rel), _fmt(o.cosine, ".6f"), _fmt(o.top1_agreement, ".4f"),
                         f"{o.violations}/{o.elements}",
                         "PASS" if o.passed else "FAIL" + (f" ({o.note})" if o.note else "")))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        lines.append(f"float outputs: |got - ref| <= atol + rtol * |ref|; integer, boolean and string outputs: "
                     f"exact; {self.samples} samples")
        return "\n".join(lines)

    def require(self, message: str, *, hint: str | None = None) -> None:
        """Raise GateFailed(`message`, with the table) unless every output passed."""
        if not self.passed:
            raise GateFailed(message, table=self.table(), hint=hint)


def _fmt(value: float | None, spec: str = ".3g") -> str:
    return "-" if value is None else format(value, spec)


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else float("inf")


def _nan_min(values: list[float]) -> float:
    return float("nan") if any(math.isnan(v) for v in values) else min(values)


def is_exact(dtype: "np.dtype") -> bool:
    """Whether outputs of this element type are compared exactly (everything but floating point)."""
    import numpy as np

    return not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating))


def compare(reference: Mapping[str, Any], candidate: Mapping[str, Any], *, tolerance: Tolerance = Tolerance(),
            overrides: Mapping[str, Tolerance] | None = None, samples: int | None = None) -> ParityReport:
    """Compare every output of `reference` with the same-named output of `candidate`.

    `tolerance` applies to every output, `overrides` to the named ones; `samples` is the number
    of samples the report claims (default: the first dimension of the first reference output).
    """
    import numpy as np

    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(reference))
    if unknown:
        from zoo.errors import InvalidInput

        raise InvalidInput(f"parity tolerances name output(s) {', '.join(unknown)}, which the model does not have",
                           hint=f"its outputs are {', '.join(reference)}")
    outputs = [_compare_one(name, np.asarray(ref), candidate.get(name), overrides.get(name, tolerance))
               for name, ref in reference.items()]
    if samples is None:
        first = np.asarray(next(iter(reference.values()))) if reference else np.zeros(())
        samples = int(first.shape[0]) if first.ndim > 0 else 1
    return ParityReport(tolerance=tolerance, samples=int(samples), outputs=outputs)


def _compare_one(name: str, ref: "np.ndarray", got: Any, tol: Tolerance) -> OutputParity:
    import numpy as np

    exact = is_exact(ref.dtype)
    base = dict(name=name, dtype=str(ref.dtype), shape=tuple(int(d) for d in ref.shape), exact=exact, tolerance=tol,
                elements=int(ref.size))
    failed_floats = {} if exact else dict(max_abs=math.inf, max_rel=math.inf, mean_abs=math.inf, cosine=0.0,
                                          cosine_min=0.0, worst_excess=math.inf)
    if got is None:
        return OutputParity(**base, violations=int(ref.size), note="missing", **failed_floats)
    got = np.asarray(got)
    if got.shape != ref.shape:
        return OutputParity(**base, violations=int(ref.size), note=f"shape {list(got.shape)}", **failed_floats)
    if is_exact(got.dtype) != exact:
        return OutputParity(**base, violations=int(ref.size), note=f"element type {got.dtype}", **failed_floats)
    if exact:
        return OutputParity(**base, violations=int(np.count_nonzero(ref != got)))
    return OutputParity(**base, **_float_figures(ref, got, tol))


def _float_figures(ref: "np.ndarray", got: "np.ndarray", tol: Tolerance) -> dict[str, Any]:
    import numpy as np

    r = ref.astype(np.float64)
    g = got.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):  # non-finite values are handled below
        diff = np.abs(g - r)
        diff = np.where(np.isnan(diff), np.inf, diff)  # NaN anywhere is as far off as it gets
        excess = diff - (tol.atol + tol.rtol * np.abs(r))
        nonzero = np.abs(r) > 0
        max_rel = float((diff[nonzero] / np.abs(r[nonzero])).max()) if nonzero.any() else 0.0
        cos = _per_sample_cosine(r, g)
    top1 = None
    if ref.ndim == 2 and ref.shape[1] > 1 and ref.shape[0] > 0:
        top1 = float(np.mean(np.argmax(r, axis=1) == np.argmax(g, axis=1)))
    return dict(
        max_abs=float(diff.max()) if diff.size else 0.0,
        max_rel=max_rel,
        mean_abs=float(diff.mean()) if diff.size else 0.0,
        cosine=float(cos.mean()) if cos.size else 1.0,
        cosine_min=float(cos.min()) if cos.size else 1.0,
        top1_agreement=top1,
        violations=int(np.count_nonzero(~(excess <= 0))),
        worst_excess=float(excess.max()) if excess.size else 0.0,
    )


def _per_sample_cosine(r: "np.ndarray", g: "np.ndarray") -> "np.ndarray":
    """Cosine similarity of each sample (axis 0) of `g` with `r`; a scalar output is one sample."""
    import numpy as np

    rows = len(r) if r.ndim > 0 else 1
    r = r.reshape(rows, -1)
    g = g.reshape(rows, -1)
    dot = (r * g).sum(axis=1)
    norms = np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1)
    # two all-zero vectors are identical; a zero vector against a non-zero one has cosine 0
    both_zero = (np.abs(r).sum(axis=1) == 0) & (np.abs(g).sum(axis=1) == 0)
    cos = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), np.where(both_zero, 1.0, 0.0))
    finite = np.isfinite(r).all(axis=1) & np.isfinite(g).all(axis=1)
    return np.where(finite, cos, np.nan)
