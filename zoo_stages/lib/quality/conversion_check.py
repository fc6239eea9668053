"""What deploy runs a build on, and how a converted build is checked against its source.

Inputs, in order of preference:
1. the recipe's held-out split, bound to the model's inputs by name (`onnx_run.bind`): parity
   and the task's metrics on the very samples verify evaluated, so the figures are comparable;
2. verify's test inputs (of the build's verified name, then the reference, then any build);
3. fixed random values (seed 0), with a warning.

A conversion (fp16, ORT format) passes when every float output is within ``atol + rtol * |ref|``
of its source's on the CPU and every integer output is equal (`zoo_stages.lib.quality.parity`);
the task's metrics (`zoo_stages.lib.quality.tasks`) are added when labels are known.

numpy and onnxruntime are imported inside methods so importing this module is cheap.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping

from zoo.errors import InvalidInput, StageFailed
from zoo_stages.lib.quality.verify_report import VerifyOutputs
from zoo_stages.lib.release.vectors import find_sets, read_tensors


# samples per onnxruntime run when a build is compared with its source
BATCH_SIZE = 64


class ConversionCheck:
    """Inputs for the builds of one release and the parity of its conversions."""

    def __init__(self, verify: VerifyOutputs, *, data_spec: Mapping[str, Any] | None, recipe_dir: Path,
                 task: str, parity_samples: int | None, vector_samples: int,
                 log: logging.Logger | logging.LoggerAdapter):
        self.verify = verify
        self.data_spec = data_spec
        self.recipe_dir = recipe_dir
        self.task = task
        self.parity_samples = parity_samples
        self.vector_samples = vector_samples
        self.log = log
        self._heldout: tuple[Any, Any] | None | bool = False  # False: not loaded yet

    def heldout(self) -> Any:
        """The recipe's held-out `Split`, or None without a data section (loaded once)."""
        if self._heldout is False:
            self._heldout = None
            if self.data_spec:
                from zoo_stages.lib.data.datasets import load_split

                self._heldout = load_split(dict(self.data_spec), self.recipe_dir, "val")
        return self._heldout  # type: ignore[return-value]

    def _heldout_feeds(self, session: Any, samples: int) -> tuple[dict[str, Any], Any] | None:
        """(feeds, labels) of the first `samples` held-out samples bound to the session's inputs,
        or None when there is no data or it does not fit the model (another input source is used)."""
        from zoo_stages.lib.runtimes import onnx_run

        split = self.heldout()
        if split is None:
            return None
        split = split.head(min(len(split), samples))
        try:
            feeds = onnx_run.prepare(session, onnx_run.bind(session, split.features), where="the held-out split")
        except InvalidInput:  # e.g. a build whose inputs differ from the data's: fall back to vectors
            return None
        return feeds, split.labels

    def parity(self, name: str, vname: str | None, source: Path, candidate: Path, *, atol: float,
               rtol: float, run_candidate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
               ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """Compare `candidate` with `source` (onnxruntime on the CPU); also the task's metrics when
        labels are known. `run_candidate` runs the candidate on other feeds than onnxruntime's CPU
        session (OpenVINO, a GPU provider): ``feeds -> {output name: array}``.

        Returns (parity, metric figures, the inputs used)."""
        from zoo_stages.lib.quality import tasks
        from zoo_stages.lib.runtimes import onnx_run, ort_session
        from zoo_stages.lib.quality import parity as paritylib

        src_sess = ort_session.make_session(source)
        if run_candidate is None:
            cand_sess = ort_session.make_session(candidate)
            run_candidate = lambda feeds: onnx_run.run(cand_sess, feeds, batch_size=BATCH_SIZE)  # noqa: E731
        # by default the very samples verify evaluated, so the figures are comparable
        split = self.heldout()
        wanted = self.parity_samples or self.verify.eval_samples or (len(split) if split is not None else 0)
        bound = self._heldout_feeds(src_sess, wanted) if split is not None else None
        if bound is not None:
            (feeds, labels), origin = bound, "held-out split"
        else:
            (feeds, origin), labels = self.inputs_for(name, vname, src_sess), None
        ref = onnx_run.run(src_sess, feeds, batch_size=BATCH_SIZE)
        got = run_candidate(feeds)
        parity = paritylib.compare(ref, got, tolerance=paritylib.Tolerance(atol=atol, rtol=rtol))
        self.log.info("deploy: %s parity on %s (%d samples): max |diff| %.3g", name, origin,
                      parity.samples, parity.max_abs)
        figures: dict[str, Any] = {}
        kind = tasks.kind_of(self.task or "generic")
        primary = tasks.primary_metric(kind)
        if labels is not None and primary is not None:
            specs = onnx_run.output_specs(src_sess)  # a conversion keeps the source's output names and types
            preferred = self.verify.metric_outputs.get("scores")
            output = tasks.scores_output(specs, preferred if preferred in {o.name for o in specs} else None, kind=kind)
            label = tasks.label_output(specs) if kind == "classification" else None
            mine = tasks.evaluate(kind, got, labels, output, label_output=label)
            theirs = tasks.evaluate(kind, ref, labels, output, label_output=label)
            metric = primary[0]
            if metric in mine and metric in theirs:
                figures = dict(mine)
                figures[f"{tasks.comparison_name(metric)}_vs_source"] = tasks.compare(metric, theirs[metric],
                                                                                      mine[metric])
                figures[f"{metric}_samples"] = int(len(labels))
                if len(labels) == self.verify.eval_samples:
                    change = tasks.compare(metric, self.verify.reference_metric(metric), mine[metric])
                    if change is not None:
                        figures[tasks.comparison_name(metric)] = change
        return parity, figures, feeds

    def replay_status(self, name: str, source: Path, candidate: Path, feeds: dict[str, Any], *, atol: float,
                      rtol: float) -> str:
        """Whether a Runtime-style ORT model also works with its saved optimizations replayed.

        The build's parity gate uses the default loading (no replay), which always works; replay
        is opt-in on the device and some onnxruntime versions cannot replay some records, so the
        outcome is recorded (and shown on the card) rather than failing the release.
        """
        from zoo_stages.lib.runtimes import onnx_run, ort_session
        from zoo_stages.lib.quality import parity as paritylib

        try:
            session = ort_session.make_session(candidate, runtime_optimizations=True)
            got = onnx_run.run(session, feeds, batch_size=BATCH_SIZE)
        except (StageFailed, InvalidInput) as e:  # the load (InvalidInput) or the run (StageFailed) failed
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.log.warning("deploy: %s: onnxruntime cannot replay the saved runtime optimizations: %s",
                             name, first)
            return f"fails: {first}"
        ref = onnx_run.run(ort_session.make_session(source), feeds, batch_size=BATCH_SIZE)
        parity = paritylib.compare(ref, got, tolerance=paritylib.Tolerance(atol=atol, rtol=rtol))
        return "ok" if parity.passed else f"outputs differ: max |diff| {parity.max_abs:.3g}"

    def inputs_for(self, name: str, vname: str | None, session: Any) -> tuple[dict[str, Any], str]:
        """Inputs to feed a model without verified vectors, and where they come from: verify's test
        inputs (of `vname`, then the reference build, then any build), else held-out samples, else
        fixed random values."""
        import numpy as np

        from zoo_stages.lib.onnx.model_info import numpy_dtype, session_ports

        ports, _ = session_ports(session)
        verify = self.verify
        candidates = [vname, verify.reference, *sorted(verify.builds or {})]
        if verify.vectors is not None and verify.vectors.is_dir():
            candidates += sorted(p.name for p in verify.vectors.iterdir() if p.is_dir())
        for cand in dict.fromkeys(c for c in candidates if c):
            vdir = verify.vector_dir(cand)
            if vdir is None:
                continue
            arrays = read_tensors(find_sets(vdir)[0], "input")
            if len(arrays) == len(ports) and all(
                    a.dtype == numpy_dtype(p.dtype) and a.ndim == len(p.shape) for a, p in zip(arrays, ports)):
                return {p.name: a for p, a in zip(ports, arrays)}, f"verify's test inputs of {cand}"
        bound = self._heldout_feeds(session, self.vector_samples)
        if bound is not None:
            return bound[0], "held-out split"
        rng = np.random.default_rng(0)
        feeds = {}
        for p in ports:
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in p.shape]
            if p.shape and not isinstance(p.shape[0], int):
                shape[0] = self.vector_samples
            dtype = numpy_dtype(p.dtype)
            feeds[p.name] = (rng.random(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                             else np.zeros(shape, dtype=dtype))
        self.log.warning("deploy: %s: no test inputs from verify or data; using fixed random inputs", name)
        return feeds, "fixed random inputs (seed 0)"
