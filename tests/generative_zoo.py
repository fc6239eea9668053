"""A generative version in a local zoo, published the way a release folder is: onnxruntime-genai's
build of a tiny Llama (tests/decoder_models.py) as build files — model.onnx with its external
data, genai_config.json, tokenizer.json and tokenizer_config.json side by side — under a
zoo.manifest, with the generation metrics a verify stage records."""

from __future__ import annotations

import shutil
from pathlib import Path

from zoo.manifest import Build, Manifest, Port, file_ref
from zoo.registry.staging import write_manifest
from zoo.registry.store import LocalZoo

NAME, VERSION = "tiny-llama", "1.0.0"
REF = f"{NAME}@{VERSION}"
SIDECARS = ("model.onnx.data", "genai_config.json", "tokenizer.json", "tokenizer_config.json")
# what verify records for a text-generation build (zoo_stages/verify.py, issue #35)
METRICS = {
    "cpu-fp32": {"perplexity": 498.123, "greedy_matched_tokens": 16.0, "greedy_agreement": 1.0,
                 "greedy_exact_match": 1.0, "latency_prefill_ms": 0.912, "latency_p50_ms": 0.2375,
                 "throughput_tokens_per_s": 4210.5},
    "cpu-int4": {"perplexity": 512.5, "perplexity_increase": 0.0289, "greedy_matched_tokens": 15.0,
                 "greedy_agreement": 0.9375, "greedy_exact_match": 0.75, "latency_prefill_ms": 0.701,
                 "latency_p50_ms": 0.1634, "throughput_tokens_per_s": 6120.0},
}


def ports(build: Path) -> tuple[list[Port], list[Port]]:
    """The model's inputs and outputs as a manifest records them (read with onnxruntime)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(build / "model.onnx"), providers=["CPUExecutionProvider"])
    dtype = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(float16)": "float16"}
    as_port = lambda a: Port(name=a.name, dtype=dtype.get(a.type, a.type), shape=list(a.shape))
    return [as_port(a) for a in session.get_inputs()], [as_port(a) for a in session.get_outputs()]


def staging_of(builds: dict[str, Path], staging: Path, *, name: str = NAME, version: str = VERSION,
               sidecars: tuple[str, ...] = SIDECARS, metrics: dict | None = None) -> Path:
    """A staging folder holding each build's files under builds/BUILD/, with its manifest."""
    entries = {}
    for build_name, folder in builds.items():
        target = staging / "builds" / build_name
        target.mkdir(parents=True, exist_ok=True)
        for file in ("model.onnx", *sidecars):
            if (folder / file).exists():
                shutil.copyfile(folder / file, target / file)
        inputs, outputs = ports(folder)
        entries[build_name] = Build(
            name=build_name, file=file_ref(staging, f"builds/{build_name}/model.onnx"),
            precision="int4" if "int4" in build_name else "fp32", runtime="onnxruntime>=1.32", verified=True,
            inputs=inputs, outputs=outputs, metrics=(metrics if metrics is not None else METRICS).get(build_name, {}),
            extra_files=[file_ref(staging, f"builds/{build_name}/{f}") for f in sidecars if (target / f).exists()])
    write_manifest(staging, Manifest(name=name, version=version, task="text-generation", license="MIT",
                                     description="a tiny random Llama for the tests", builds=entries))
    return staging


def publish(builds: dict[str, Path], staging: Path, zoo: LocalZoo | None = None, **kw) -> LocalZoo:
    """`staging_of` published into `zoo` (default: the local zoo ZOO_HOME names)."""
    zoo = zoo or LocalZoo()
    zoo.publish(staging_of(builds, staging, **kw))
    return zoo
