"""Whether a build is portable ONNX that any runtime may run, and what runtime it needs otherwise.

A build is portable when
- every node (of the graph, of the subgraphs in If/Loop/Scan attributes, of the model-local
  functions its nodes call) is in a standard ONNX operator-set domain (`STANDARD_DOMAINS`);
- `onnx.checker` with ``full_check`` accepts it (`onnx_io.check_model`);
- its test vectors, whose outputs onnxruntime computed, give the same outputs under ONNX's
  reference evaluator (`reference_run.check_vectors`).

`assess` answers all three in a `PortabilityReport` (deploy records ``portable`` and the reason in
the manifest); `runtime_requirement` is the runtime a build's operators need (``onnx``, or the
onnxruntime it was checked with). The graph is read without its external data's weights
(`onnx_io.load_graph`). onnx is imported inside functions so importing this module is cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from zoo_stages.lib.quality.parity import Tolerance
from zoo_stages.lib.onnx.reference_run import DEFAULT_BATCH, DEFAULT_TOLERANCE, ReferenceCheck

if TYPE_CHECKING:
    import onnx

# The operator-set domains of the ONNX standard: the default one (spelt "" or "ai.onnx") and the
# traditional-ML one. "ai.onnx.preview.training" (Adam, Adagrad, Momentum, Gradient) is left out:
# a preview, training-only domain that onnxruntime's inference builds do not register ("is not a
# registered function/op", onnxruntime 1.32), so a model using it runs under the reference
# evaluator alone.
STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})

ORT_SUFFIX = ".ort"


def nonstandard_domains(model: "onnx.ModelProto | Path | str") -> list[str]:
    """The sorted operator domains outside `STANDARD_DOMAINS` that running the model needs.

    Every node counts: the graph's, those of subgraphs held in attributes (If branches, Loop and
    Scan bodies), at any depth. A node that calls a model-local function (a FunctionProto of
    ``model.functions``, matched by domain, name and overload as onnx does) needs the domains of
    the function's body instead of the function's own domain, which names no operator set. A path
    is read without its external data (`onnx_io.load_graph`).
    """
    if not _is_proto(model):
        from zoo_stages.lib.onnx import onnx_io

        model = onnx_io.load_graph(Path(model))
    functions = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    found: set[str] = set()
    expanded: set[tuple[str, str, str]] = set()  # functions already walked (onnx forbids recursion; no loops here)

    def walk(nodes: Any) -> None:
        for node in nodes:
            key = (node.domain, node.op_type, getattr(node, "overload", ""))
            if key in functions:
                if key not in expanded:
                    expanded.add(key)
                    walk(functions[key].node)
            elif node.domain not in STANDARD_DOMAINS:
                found.add(node.domain)
            for attr in node.attribute:
                if attr.HasField("g"):
                    walk(attr.g.node)
                for graph in attr.graphs:
                    walk(graph.node)

    walk(model.graph.node)
    return sorted(found)


def _is_proto(model: Any) -> bool:
    return hasattr(model, "graph") and hasattr(model, "functions")


def onnxruntime_requirement() -> str:
    """``onnxruntime>=MAJOR.MINOR`` of the installed onnxruntime: the one version a build needing
    onnxruntime is known to run on (it was checked with it; older releases may lack its
    operators, ORT-format version or kernels, and nothing checked them)."""
    from importlib import metadata

    major, minor = metadata.version("onnxruntime").split(".")[:2]
    return f"onnxruntime>={major}.{minor}"


def runtime_requirement(path: Path) -> str:
    """The runtime the build at `path` needs: ``onnx`` for a model whose operators are all in
    standard domains (any runtime implementing its opsets may run it), else
    `onnxruntime_requirement()` (onnxruntime's own operators: com.microsoft, MatMulNBits...), as
    for an ORT-format file (``.ort``), which only onnxruntime reads.

    This is what the operators need; whether the build was shown to run elsewhere is `assess`.
    """
    path = Path(path)
    if path.suffix.lower() == ORT_SUFFIX:
        return onnxruntime_requirement()
    return "onnx" if not nonstandard_domains(path) else onnxruntime_requirement()


@dataclass(frozen=True)
class PortabilityReport:
    """Whether a build is portable ONNX, and why not.

    `checker_error` is None when ``onnx.checker`` (full check) accepted the build;
    `reference` is None when its vectors were not run under the reference evaluator (an earlier
    test already failed, and the evaluator is slow).
    """

    runtime: str  # runtime_requirement
    nonstandard_domains: tuple[str, ...]
    checker_error: str | None
    reference: ReferenceCheck | None
    format: str = "onnx"  # or "ort": onnxruntime's own format, which nothing else reads

    @property
    def standard_domains(self) -> bool:
        return not self.nonstandard_domains

    @property
    def checker_passed(self) -> bool:
        return self.checker_error is None

    @property
    def portable(self) -> bool:
        return (self.format == "onnx" and self.standard_domains and self.checker_passed
                and self.reference is not None and self.reference.passed)

    @property
    def reason(self) -> str:
        """Why the build is portable or not, in one line."""
        if self.format != "onnx":
            return f"{self.format.upper()} format, which only onnxruntime reads"
        if self.nonstandard_domains:
            return f"operators outside the standard ONNX domains: {', '.join(self.nonstandard_domains)}"
        if self.checker_error is not None:
            return f"onnx.checker (full check) refuses it: {self.checker_error}"
        if self.reference is None:
            return "not run under onnx's reference evaluator"
        if not self.reference.passed:
            return f"onnx's reference evaluator: {self.reference.detail}"
        return f"standard ONNX, checker passed, reference evaluator: {self.reference.detail}"

    def to_json(self) -> dict[str, Any]:
        """The record deploy stores in the manifest."""
        return {"portable": self.portable, "runtime": self.runtime, "reason": self.reason, "format": self.format,
                "nonstandard_domains": list(self.nonstandard_domains), "checker_passed": self.checker_passed,
                "reference": None if self.reference is None else self.reference.to_json()}


def assess(path: Path, set_dirs: Sequence[Path], *, scratch: Path, quantized: bool | None = None,
           tolerance: Tolerance = DEFAULT_TOLERANCE, batch_size: int | None = DEFAULT_BATCH) -> PortabilityReport:
    """The `PortabilityReport` of the build at `path` with its test vector sets `set_dirs`.

    The tests run cheapest first and stop at the first that fails: domains, then the checker
    (on a copy under `scratch` when the external data is hard-linked: `onnx_io.check_model`),
    then the vectors under the reference evaluator (`reference_run.check_vectors`, with
    `tolerance`; `quantized` None: judged by the model's ops, `equivalence.is_quantized`).
    An ORT-format file is not ONNX: not portable, without running anything.
    """
    from zoo_stages.lib.onnx import onnx_io
    from zoo_stages.lib.onnx.reference_run import check_vectors

    path = Path(path)
    if path.suffix.lower() == ORT_SUFFIX:
        return PortabilityReport(runtime=onnxruntime_requirement(), nonstandard_domains=(), checker_error=None,
                                 reference=None, format="ort")
    domains = tuple(nonstandard_domains(path))
    runtime = "onnx" if not domains else onnxruntime_requirement()
    if domains:
        return PortabilityReport(runtime=runtime, nonstandard_domains=domains, checker_error=None, reference=None)
    why = onnx_io.checker_error(path, scratch)  # a missing or unsafe external data file raises: no verdict
    if why is not None:
        return PortabilityReport(runtime=runtime, nonstandard_domains=(), checker_error=why, reference=None)
    if quantized is None:
        from zoo_stages.lib.quality.equivalence import is_quantized

        quantized = is_quantized(path)
    check = check_vectors(path, set_dirs, quantized=quantized, tolerance=tolerance, batch_size=batch_size)
    return PortabilityReport(runtime=runtime, nonstandard_domains=(), checker_error=None, reference=check)
