"""Stage kinds for the engine tests: registered through the `zoo.stages` entry-point group,
exactly as a third-party package would (see the .dist-info folder beside this file)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from zoo.errors import GateFailed
from zoo.stage import KindConfig, StageKind


class WriterConfig(KindConfig):
    text: str = "hello"
    repeat: int = 1


class Writer(StageKind):
    """Writes `text` * `repeat` to data.txt."""

    name = "writer"
    version = "1"
    Config = WriterConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        out = context.output_path("data.txt")
        out.write_text(config.text * config.repeat)
        context.metrics["chars"] = len(config.text) * config.repeat
        context.metrics["pid"] = os.getpid()
        print(f"writer wrote {out.name}")  # goes to the stage log
        return {"data": out}


class ConcatConfig(KindConfig):
    sep: str = "+"


class Concat(StageKind):
    """Concatenates every upstream `data` output, in needs order."""

    name = "concat"
    Config = ConcatConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        parts = [Path(p).read_text() for p in inputs.all("data").values()]
        out = context.output_path("data.txt")
        out.write_text(config.sep.join(parts))
        return {"data": out}


class FailingConfig(KindConfig):
    message: str = "boom"
    gate: bool = False


class Failing(StageKind):
    name = "failing"
    Config = FailingConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        print("about to fail")
        if config.gate:
            raise GateFailed(config.message, table="metric  value  gate\naccuracy 0.5 >= 0.9 FAIL")
        raise RuntimeError(config.message)


class SleeperConfig(KindConfig):
    seconds: float = 1.0
    marker: str = ""


class Sleeper(StageKind):
    """Sleeps, optionally touching `marker` when it starts (so tests know it is running)."""

    name = "sleeper"
    Config = SleeperConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        if config.marker:
            context.resolve(config.marker).write_text(str(os.getpid()))
        out = context.output_path("data.txt")
        with open(out, "w") as f:
            f.write("partial")
            f.flush()
            time.sleep(config.seconds)
            f.write(" complete")
        return {"data": out}


class ScriptConfig(KindConfig):
    file: str


class Script(StageKind):
    """Copies a user file; the file's digest enters the cache key (user code)."""

    name = "script"
    Config = ScriptConfig
    outputs = ("data",)

    def dependencies(self, config, ctx):
        return [ctx.resolve(config.file)]

    def run(self, inputs, config, context):
        out = context.output_path("data.txt")
        out.write_text(context.resolve(config.file).read_text())
        return {"data": out}


class BlobConfig(KindConfig):
    size_mb: int = 1
    seed: int = 0
    transform: bool = False


class Blob(StageKind):
    """Writes a deterministic pseudo-random blob, or transforms the upstream blob (benchmarks)."""

    name = "blob"
    Config = BlobConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        import random

        out = context.output_path("blob.bin")
        upstream = inputs.maybe("data")
        with open(out, "wb") as dst:
            if upstream is not None and config.transform:
                with open(upstream, "rb") as src:
                    for chunk in iter(lambda: src.read(1 << 20), b""):
                        dst.write(chunk[::-1])
            else:
                rng = random.Random(config.seed)
                for _ in range(config.size_mb):
                    dst.write(rng.randbytes(1 << 20))
        return {"data": out}


class NoisyConfig(KindConfig):
    onnx: bool = False


class Noisy(StageKind):
    """Nondeterministic on purpose (fresh random values on every run), for `zoo repro` tests."""

    name = "noisy"
    Config = NoisyConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        if not config.onnx:
            out = context.output_path("data.bin")
            out.write_bytes(os.urandom(16))
            return {"data": out}
        import numpy as np
        import onnx
        from onnx import TensorProto, helper, numpy_helper

        weights = numpy_helper.from_array(np.random.default_rng().standard_normal((4, 4)).astype("float32"), "w")
        graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")], "noisy",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [weights])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 13
        out = context.output_path("model.onnx")
        onnx.save(model, str(out))
        return {"data": out}


class Stamp(StageKind):
    """Writes the recipe version and its ancestors' lock records (recipe_fields + lineage)."""

    name = "stamp"
    outputs = ("data",)
    recipe_fields = ("name", "version")
    lineage = True

    def run(self, inputs, config, context):
        import json

        out = context.output_path("stamp.json")
        out.write_text(json.dumps({"version": context.recipe.version, "lineage": dict(context.lineage)}, sort_keys=True))
        return {"data": out}


from pydantic import model_validator  # noqa: E402


class PickyConfig(KindConfig):
    mode: str = "a"
    option: int = 1

    @model_validator(mode="after")
    def _option_only_in_mode_a(self):
        # like quantize's "calibration does not apply to mode: dynamic": depends on what was *given*
        if self.mode == "b" and "option" in self.model_fields_set:
            raise ValueError("option does not apply to mode: b")
        return self


class Picky(StageKind):
    name = "picky"
    Config = PickyConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        out = context.output_path("mode.txt")
        out.write_text(config.mode)
        return {"data": out}


class SlowCopyConfig(KindConfig):
    seconds: float = 1.0
    marker: str = ""


class SlowCopy(StageKind):
    """Touches `marker` (its pid), sleeps, then copies the upstream `data` (or writes its own).

    While it sleeps, its workspace in the cache's tmp/ and the upstream's out/ files are in use:
    what `zoo gc` must leave alone."""

    name = "slowcopy"
    Config = SlowCopyConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        if config.marker:
            context.resolve(config.marker).write_text(str(os.getpid()))
        out = context.output_path("data.txt")
        out.write_text("partial")
        time.sleep(config.seconds)
        upstream = inputs.maybe("data")
        out.write_text((Path(upstream).read_text() if upstream is not None else "") + " copied")
        return {"data": out}


class FillerConfig(KindConfig):
    size_mb: int = 64
    swallow: bool = False


class Filler(StageKind):
    """Writes `size_mb` MiB into its output. With `swallow`, it ignores the write error (as C++
    code that writes a model may) and fails later on the truncated file, like onnx does."""

    name = "filler"
    Config = FillerConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        out = context.output_path("blob.bin")
        chunk = b"\xab" * (1 << 20)
        try:
            with open(out, "wb") as f:
                for _ in range(config.size_mb):
                    f.write(chunk)
        except OSError:
            if not config.swallow:
                raise
        if out.stat().st_size != config.size_mb << 20:
            raise ValueError("[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Protobuf parsing failed (Wire format was corrupt)")


class ReaderConfig(KindConfig):
    read: list[str] = []  # dotted recipe-wide names to read through context.shared ("model.task")


class Reader(StageKind):
    """Declares a few recipe-wide fields; writes what its context holds of them, and reads `read`."""

    name = "reader"
    Config = ReaderConfig
    outputs = ("data",)
    shared = ("data.image_size", "model.num_classes", "task")

    def run(self, inputs, config, context):
        import json

        read = {}
        for name in config.read:
            section, _, field = name.partition(".")
            value = context.shared.get(section)
            read[name] = value.get(field) if field else value
        out = context.output_path("shared.json")
        out.write_text(json.dumps({"shared": context.shared, "read": read}, sort_keys=True))
        return {"data": out}
