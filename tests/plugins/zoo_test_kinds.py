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


class Parent(StageKind):
    """Reads the recipe's `model.from` parent as train and export do: the engine resolves it
    (zoo/engine/parents.py) and hands it over in `references`; its pin and ONNX file are the kind's
    dependencies. Writes what it read: the pinned description and the sha256 of the file it found."""

    name = "parent"
    shared = ("model.from", "model.build")
    outputs = ("data",)

    def dependencies(self, config, ctx):
        found = ctx.references.get("model.from")
        return list(found.files) if found else []

    def run(self, inputs, config, context):
        import hashlib

        found = context.references["model.from"]
        out = context.output_path("data.txt")
        out.write_text(f"{found.ref} {found.build} {found.license} {list(found.outputs)} {found.sha256} "
                       f"{hashlib.sha256(found.path.read_bytes()).hexdigest()}")
        context.metrics["parent_path"] = str(found.path)
        return {"data": out}


class TreeConfig(KindConfig):
    folder: str
    notes: str = ""  # a single file, besides the folder


class Tree(StageKind):
    """Writes every file of a folder (and `notes`) in the recipe's project: path and bytes, sorted.
    Both enter the key (user data); `recipe_dir` (a metric) says where the stage found them."""

    name = "tree"
    Config = TreeConfig
    outputs = ("data",)

    def dependencies(self, config, ctx):
        return [ctx.resolve(config.folder)] + ([ctx.resolve(config.notes)] if config.notes else [])

    def run(self, inputs, config, context):
        root = context.resolve(config.folder)
        parts = [f"{p.relative_to(root).as_posix()}:{p.read_text()}" for p in sorted(root.rglob("*")) if p.is_file()]
        if config.notes:
            parts.append(context.resolve(config.notes).read_text())
        out = context.output_path("data.txt")
        out.write_text("\n".join(parts))
        context.metrics["recipe_dir"] = str(context.recipe.dir)
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
    text: bool = False  # random hex text (for stages downstream that read text)


class Noisy(StageKind):
    """Nondeterministic on purpose (fresh random values on every run), for `zoo repro` tests."""

    name = "noisy"
    Config = NoisyConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        if config.text:
            out = context.output_path("data.txt")
            out.write_text(os.urandom(8).hex())
            return {"data": out}
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


class KernelsConfig(KindConfig):
    drift: float = 1e-6  # how far (relative) another platform class's values move


def _kernels_base():
    from zoo_stages.lib.quality.numeric_outputs import NumericOutputs

    return NumericOutputs


class Kernels(_kernels_base(), StageKind):
    """Float results that depend on the CPU's platform class, as torch's and onnxruntime's kernels'
    do (a stand-in for their rounding: each class moves the values by its own fraction of `drift`);
    judges equivalence as the built-in kinds do (zoo_stages.lib.quality.equivalence)."""

    name = "kernels"
    Config = KernelsConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        import zlib

        import numpy as np

        from zoo import host

        shift = (zlib.crc32(host.platform_class().encode()) % 997 + 1) / 997  # in (0, 1], one per class
        values = np.linspace(0.5, 2.0, 16, dtype="float64") * (1.0 + config.drift * shift)
        out = context.output_path("arrays")
        out.mkdir()
        np.save(out / "values.npy", values.astype("float32"))  # .npy: no zip timestamps, so deterministic
        np.save(out / "labels.npy", np.arange(16, dtype="int64"))
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


# --- kinds that use the engine's after-run hooks, as deploy and verify do (tests/test_kind_hooks.py) ---

from zoo.stage import PUBLISHED, Column, GateOutcome, ReportTable, published_manifest  # noqa: E402


class InspectorConfig(KindConfig):
    minimum: int = 0  # the gate: the upstream `data` holds at least this many characters
    enforce: bool = True  # False: record a failing gate without failing the stage (advisory)


class Inspector(StageKind):
    """Gate-like: checks the upstream text's length, records the checks in its own metric format,
    and tells the engine about them through `gates` and `report`."""

    name = "inspector"
    Config = InspectorConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        text = Path(inputs.one("data")).read_text()
        passed = len(text) >= config.minimum
        context.metrics["checks"] = [{"check": f"chars >= {config.minimum}", "measured": len(text), "ok": passed},
                                     {"check": "text is utf-8", "measured": 1, "ok": True, "builtin": True}]
        if not passed and config.enforce:
            raise GateFailed(f"only {len(text)} characters", table=f"chars >= {config.minimum}  {len(text)}  NOT OK")
        out = context.output_path("checked.txt")
        out.write_text(text)
        return {"data": out}

    def gates(self, metrics):
        return [GateOutcome(c["check"], c["measured"], c["ok"], implicit=bool(c.get("builtin")))
                for c in metrics.get("checks") or []]

    def report(self, stage_id, metrics, effects):
        rows = tuple((g.gate, g.value, "ok" if g.passed else "NOT OK") for g in self.gates(metrics) if not g.implicit)
        columns = (Column("check"), Column("measured", align="right", format="d"), Column("verdict"))
        return [ReportTable(f"checks ({stage_id})", columns, rows)]


NOTICE = "NOTICE.txt"


class ShipperConfig(KindConfig):
    publish: bool = True
    false_notice: bool = False  # write a NOTICE.txt that does not match the build (check_release refuses it)


class Shipper(StageKind):
    """Publish-like: writes the upstream `data` as the recipe's version (one build, plus a version-level
    NOTICE.txt naming each build file's sha256) into its release folder and declares it; the engine
    publishes it to the local zoo, as it does deploy's. Tells the engine which output is the release,
    which files it must carry and how to check them, and reports the published version's files."""

    name = "shipper"
    Config = ShipperConfig
    outputs = ("release",)
    recipe_fields = ("name", "version")
    release_files = (NOTICE,)

    def run(self, inputs, config, context):
        from zoo.manifest import MANIFEST_FILE, Build, Manifest, file_ref

        folder = context.output_path("release")
        payload = folder / "builds" / "data" / "model.ort"
        payload.parent.mkdir(parents=True)
        payload.write_bytes(Path(inputs.one("data")).read_bytes())
        build = Build(name="data", file=file_ref(folder, payload), format="ort")
        listed = {f.path: ("0" * 64 if config.false_notice else f.sha256) for f in build.all_files()}
        notice = folder / NOTICE
        notice.write_text("shipped by the test shipper\n" + "".join(f"{p} {sha}\n" for p, sha in listed.items()))
        manifest = Manifest(name=context.recipe.name, version=context.recipe.version, builds={"data": build},
                            files=[file_ref(folder, notice)])
        (folder / MANIFEST_FILE).write_text(manifest.model_dump_json(indent=2))
        return {"release": folder}

    def report(self, stage_id, metrics, effects):
        tables = []
        for effect in (e for e in effects if e.kind == PUBLISHED):
            manifest = published_manifest(effect)
            rows = tuple((f.path, f.size) for f in manifest.all_files())
            tables.append(ReportTable(f"contents of {effect.ref}", (Column("file"), Column("size", "right", "size")), rows))
        return tables

    def release_output(self, config):
        return "release" if config.publish else None

    def check_release(self, manifest, read):
        listed = dict(line.split(" ") for line in read(NOTICE).decode().splitlines()[1:])
        files = {f.path: f.sha256 for b in manifest.builds.values() for f in b.all_files()}
        return [] if listed == files else [f"{NOTICE} does not list the build files with their sha256"]


# --- a stage that behaves like a long training, for the progress and Ctrl-C tests (tests/test_progress.py) ---

class TickerConfig(KindConfig):
    epochs: int = 3
    seconds: float = 0.2  # per epoch
    scratch_mb: int = 0  # written to its work dir first: the temporary files a Ctrl-C must not leave behind
    marker: str = ""  # written (its pid) once the scratch file is there
    go: str = ""  # a file it waits for before its last epoch (so a test reads its output while it runs)
    fail: bool = False


class Ticker(StageKind):
    """Logs one line per epoch as train does (``epoch 2/3: train_loss 0.5000 train_accuracy 0.6667``,
    through `context.log`) and prints a line per epoch, as a custom `entry` would."""

    name = "ticker"
    Config = TickerConfig
    outputs = ("data",)

    def run(self, inputs, config, context):
        if config.scratch_mb:
            with open(context.work_dir / "scratch.bin", "wb") as f:
                for _ in range(config.scratch_mb):
                    f.write(b"\0" * (1 << 20))
        if config.marker:
            context.resolve(config.marker).write_text(str(os.getpid()))
        for epoch in range(1, config.epochs + 1):
            if epoch == config.epochs and config.go:
                while not context.resolve(config.go).exists():
                    time.sleep(0.05)
            time.sleep(config.seconds)
            print(f"entry says: finished epoch {epoch}", flush=True)
            context.log.info("epoch %d/%d: train_loss %.4f train_accuracy %.4f", epoch, config.epochs,
                             1 / epoch, epoch / config.epochs)
        if config.fail:
            raise RuntimeError("ticker failed on purpose")
        out = context.output_path("data.txt")
        out.write_text(str(config.epochs))
        return {"data": out}
