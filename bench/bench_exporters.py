"""Each exporter: zoo's export stage against calling its converter directly, in one run.

For every recipe of those frameworks (a torch MLP, zoo's default framework, exported with torch's
dynamo exporter; scikit-learn, LightGBM, XGBoost estimators and Keras and JAX/Flax MLPs trained by
the recipe's entry functions, all on breast-cancer; a transformers DistilBERT on languages.csv,
where the direct script calls torch.onnx on the Hugging Face model with the same names, axes and
opset and compares with transformers' forward) the train stage runs once; then, alternating,
`zoo run RECIPE export --force` (the export stage alone, train cached: the CLI, the engine, a
worker process, conversion, checks, the parity gate and the cache commit) and a plain script that
loads the same checkpoint with the framework, calls the converter (`torch.onnx.export(...,
dynamo=True)` / skl2onnx / onnxmltools / Keras' `model.export(format="onnx")` on the JAX backend /
jax2onnx / torch.onnx), saves the model and compares onnxruntime with the framework on the same
held-out rows (a table's standardised with the train split's statistics, as zoo's train stage feeds them).
Both run as fresh processes, so both pay their imports. Printed: medians of wall time, zoo's
overhead against the script, and the parity each one measured (max-abs difference of the
probabilities or logits, label mismatches). zoo's torch gate compares 8 seeded random inputs,
not held-out rows: for torch the script also reports its parity on those same inputs. Goal:
overhead ≤ 10% of the script's time plus 1 s. Figures only: nothing is asserted.

    .venv/bin/python bench/bench_exporters.py [--repeat 5] [--only torch,sklearn,lightgbm,xgboost,transformers,keras,jax]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

RECIPES = {"torch": "tabular-mlp", "sklearn": "sklearn-gbdt-breast-cancer", "lightgbm": "lightgbm-breast-cancer",
           "xgboost": "xgboost-breast-cancer", "transformers": "transformers-distilbert-languages",
           "keras": "keras-mlp-breast-cancer", "jax": "jax-mlp-breast-cancer"}

DIRECT = r'''
import sys, time, json
started = time.perf_counter()
import numpy as np, onnxruntime as ort
framework, checkpoint, features_path, target = sys.argv[1:5]
entry = sys.argv[5] if len(sys.argv) > 5 else ""  # jax: the forward function's file; transformers: config.json
x = np.load(features_path)
if framework == "torch":  # sys.argv[5]: the MLP's widths and zoo's opset, as JSON
    import torch
    from safetensors.torch import load_file
    from zoo_stages.lib.models.archs import mlp  # only the network's definition: a plain torch.nn.Module
    shape = json.loads(entry)
    model = mlp(x.shape[1], tuple(shape["hidden"]), shape["num_classes"])
    model.load_state_dict(load_file(checkpoint))
    model.eval()
    t0 = time.perf_counter()
    # batch 2 in the example: torch.export specialises sizes 0 and 1; below opset 18 torch converts down itself
    torch.onnx.export(model, (torch.from_numpy(x[:2].copy()),), target, dynamo=True, opset_version=shape["opset"],
                      input_names=["features"], output_names=["logits"],
                      dynamic_shapes=({0: torch.export.Dim("batch")},))
    convert = time.perf_counter() - t0
    session = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
    gate = np.random.default_rng(0).random((8, x.shape[1]), dtype=np.float32)  # zoo's gate inputs (parity seed 0)
    with torch.no_grad():
        ref, ref_gate = (model(torch.from_numpy(a)).numpy() for a in (x, gate))
    got, = session.run(None, {"features": x})
    got_gate, = session.run(None, {"features": gate})
    print(json.dumps({"convert_s": convert, "max_abs": float(np.abs(got - ref).max()),
                      "label_mismatches": int((got.argmax(1) != ref.argmax(1)).sum()),
                      "gate_max_abs": float(np.abs(got_gate - ref_gate).max()),
                      "inside_s": time.perf_counter() - started}))
    sys.exit(0)
if framework == "transformers":
    import torch, transformers
    from safetensors.torch import load_file
    feeds = {k: x[k] for k in x.files}
    config = transformers.DistilBertConfig.from_json_file(sys.argv[5])
    config._attn_implementation = sys.argv[6] if len(sys.argv) > 6 else "eager"  # not kept in the JSON
    model = transformers.DistilBertForSequenceClassification(config)
    model.load_state_dict(load_file(checkpoint))
    model.eval()
    class Named(torch.nn.Module):  # positional inputs -> the logits tensor
        def __init__(self, m):
            super().__init__()
            self.m = m
        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).logits
    t0 = time.perf_counter()
    axes = {0: "batch", 1: "sequence"}
    example = tuple(torch.from_numpy(feeds[k][:2].copy()) for k in ("input_ids", "attention_mask"))
    # eval first: the exporter restores the wrapper's mode afterwards, recursively, so a wrapper left in
    # training mode would put the model back into training (dropout on) for the reference forward
    torch.onnx.export(Named(model).eval(), example, target, dynamo=False, opset_version=17, do_constant_folding=True,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "logits": {0: "batch"}})
    convert = time.perf_counter() - t0
    with torch.no_grad():
        ref = model(**{k: torch.from_numpy(v.copy()) for k, v in feeds.items()}).logits.numpy()
    session = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
    got, = session.run(None, feeds)
    print(json.dumps({"convert_s": convert, "max_abs": float(np.abs(got - ref).max()),
                      "label_mismatches": int((got.argmax(1) != ref.argmax(1)).sum()),
                      "inside_s": time.perf_counter() - started}))
    sys.exit(0)
if framework == "sklearn":
    import skops.io
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    model = skops.io.load(checkpoint, trusted=skops.io.get_untrusted_types(file=checkpoint))
    t0 = time.perf_counter()
    onx = to_onnx(model, initial_types=[("features", FloatTensorType([None, x.shape[1]]))],
                  target_opset={"": 17, "ai.onnx.ml": 3}, options={id(model): {"zipmap": False}})
    proba = model.predict_proba(x)
elif framework == "lightgbm":
    import lightgbm, onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType
    model = lightgbm.Booster(model_file=checkpoint)
    t0 = time.perf_counter()
    onx = onnxmltools.convert_lightgbm(model, initial_types=[("features", FloatTensorType([None, x.shape[1]]))],
                                       target_opset=15, zipmap=False)
    p = model.predict(x)
    proba = np.stack([1 - p, p], axis=1)
elif framework == "keras":
    import os
    os.environ["KERAS_BACKEND"] = "jax"  # Keras' ONNX export through jax2onnx, as zoo does
    import keras
    model = keras.saving.load_model(checkpoint, safe_mode=True, compile=False)
    t0 = time.perf_counter()
    model.export(target, format="onnx", verbose=False, opset_version=17,
                 input_signature=[keras.InputSpec(shape=(None, x.shape[1]), dtype="float32", name="features")])
    onx = None  # Keras wrote the file
    proba = np.asarray(model(x, training=False))
elif framework == "jax":
    import importlib.util, jax, jax.numpy as jnp
    from jax2onnx import to_onnx
    from safetensors.numpy import load_file
    spec = importlib.util.spec_from_file_location("entry", entry)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    params = {}
    for path, array in load_file(checkpoint).items():
        *parents, leaf = path.split("/")
        node = params
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = jnp.asarray(array)
    t0 = time.perf_counter()
    onx = to_onnx(lambda features: module.apply(params, features), opset=17, input_names=["features"],
                  inputs=[jax.ShapeDtypeStruct(("batch", x.shape[1]), jnp.float32)])
    proba = np.asarray(jax.jit(module.apply)(params, x))
else:
    import xgboost, onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType
    model = xgboost.XGBClassifier()
    model.load_model(checkpoint)
    t0 = time.perf_counter()
    onx = onnxmltools.convert_xgboost(model, initial_types=[("features", FloatTensorType([None, x.shape[1]]))],
                                      target_opset=15)
    proba = model.predict_proba(x)
convert = time.perf_counter() - t0
if onx is not None:
    open(target, "wb").write(onx.SerializeToString())
session = ort.InferenceSession(target, providers=["CPUExecutionProvider"])
outputs = session.run(None, {session.get_inputs()[0].name: x})
label, got = outputs if len(outputs) == 2 else (outputs[0].argmax(axis=1), outputs[0])  # estimators: label first
print(json.dumps({"convert_s": convert, "max_abs": float(np.abs(got - proba).max()),
                  "label_mismatches": int((label != proba.argmax(axis=1)).sum()),
                  "inside_s": time.perf_counter() - started}))
'''


def zoo(*args, env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "zoo", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True)
    return time.perf_counter() - started, proc


def prepare(framework: str, work: Path) -> dict:
    """A copy of the recipe's train and export stages, run once; the held-out features as .npy;
    the checkpoint for the direct script."""
    import numpy as np

    from zoo_stages.lib.data import datasets

    base = work / framework
    shutil.copytree(REPO / "recipes" / "data", base / "data")
    shutil.copytree(REPO / "recipes" / "entries", base / "entries")
    recipe = base / f"{RECIPES[framework]}.yaml"
    spec = yaml.safe_load((REPO / "recipes" / recipe.name).read_text())
    spec["stages"] = {k: v for k, v in spec["stages"].items() if k in ("train", "export")}  # export is measured
    recipe.write_text(yaml.safe_dump(spec, sort_keys=False))
    env = {**os.environ, "ZOO_CACHE_DIR": str(base / "cache"), "ZOO_HOME": str(base / "home")}
    _, proc = zoo("run", recipe, env=env, cwd=base)
    if proc.returncode:
        raise SystemExit(f"{proc.args}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    # the direct script's checkpoint: the same fit in this process (train's bytes are reproducible)
    from zoo.engine.recipe import load
    from zoo.stage import Inputs, RecipeInfo, StageContext
    from zoo_stages.train import Train

    spec = load(recipe).spec
    shared = {"model": spec.model.model_dump(mode="json"), "data": spec.data.model_dump(mode="json"), "task": spec.task}
    info = RecipeInfo(name=spec.name, version=spec.version, description="", license="", path=recipe, digest="")
    ctx = StageContext(stage_id="train", out_dir=base / "train", work_dir=base / "train-work", recipe=info,
                       shared=shared, matrix={}, threads=1)
    config = Train.Config.model_validate(yaml.safe_load(recipe.read_text())["stages"]["train"].get("config") or {})
    checkpoint = Train().run(Inputs([]), config, ctx)["checkpoint"]
    held_out = datasets.load_split(shared["data"], base, "val")
    extra = []
    if framework == "transformers":  # the same rows zoo's gate compares (the first 256), and the model's config
        from zoo_stages.exporters.transformers import PARITY_ROWS
        from zoo_stages.lib.models import archs, hf_models

        features = base / "held_out.npz"
        np.savez(features, **{k: np.asarray(v[:PARITY_ROWS], dtype=np.int64) for k, v in held_out.features.items()})
        sizes = archs.data_sizes(shared["model"], shared["data"], base)
        config = hf_models.config_for(shared["model"], base, num_labels=shared["model"]["num_classes"],
                                      vocab_size=sizes["vocab_size"])
        (base / "config.json").write_text(config.to_json_string())
        extra = [base / "config.json"]
    else:
        features = base / "held_out.npy"
        np.save(features, np.asarray(next(iter(held_out.features.values())), dtype=np.float32))
    (base / "direct.py").write_text(DIRECT)
    if spec.model.entry:  # jax: the forward function's file
        extra = [base / spec.model.entry.partition(":")[0]]
    if framework == "torch":  # the MLP's widths (the data gives its input width) and the opset zoo exports at
        from zoo_stages.exporters.torch import DYNAMO_MIN_OPSET
        from zoo_stages.lib.models.archs import MLP_HIDDEN

        export_config = yaml.safe_load(recipe.read_text())["stages"]["export"].get("config") or {}
        extra = [json.dumps({"hidden": list(shared["model"].get("hidden") or MLP_HIDDEN),
                             "num_classes": shared["model"]["num_classes"],
                             "opset": export_config.get("opset") or DYNAMO_MIN_OPSET})]
    return {"base": base, "recipe": recipe, "env": env, "checkpoint": checkpoint, "features": features,
            "extra": extra}


def run_zoo(case: dict) -> dict:
    wall, proc = zoo("run", case["recipe"], "export", "--force", "--json", env=case["env"], cwd=case["base"])
    if proc.returncode:
        raise SystemExit(f"{proc.args}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    export = next(s for s in json.loads(proc.stdout)["stages"] if s["id"] == "export")
    parity = export["metrics"]["parity"]["outputs"]
    if "logits" in parity:  # torch, transformers: labels are the logits' argmax (torch's gate: 8 random inputs)
        logits = parity["logits"]
        return {"wall": wall, "stage": export["duration_s"], "max_abs": logits["max_abs"],
                "label_mismatches": round((1 - logits["top1_agreement"]) * logits["shape"][0])}
    labels = parity.get("label") or parity["argmax(probabilities)"]  # estimators output labels; MLPs' are argmaxes
    return {"wall": wall, "stage": export["duration_s"], "max_abs": parity["probabilities"]["max_abs"],
            "label_mismatches": labels["mismatches"]}


def run_direct(framework: str, case: dict) -> dict:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, str(case["base"] / "direct.py"), framework, str(case["checkpoint"]),
                           str(case["features"]), str(case["base"] / "direct.onnx"), *map(str, case["extra"])],
                          capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"{proc.args}: exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return {"wall": wall, **json.loads(proc.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", default=",".join(RECIPES))
    args = parser.parse_args()
    from bench_quantize import host_line

    print(host_line())
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    rows, notes = [], []
    with tempfile.TemporaryDirectory(prefix="bench-exporters-") as tmp:
        for framework in args.only.split(","):
            case = prepare(framework, Path(tmp))
            zoo_runs, direct_runs = [], []
            for _ in range(args.repeat):  # alternate, so load changes hit both alike
                zoo_runs.append(run_zoo(case))
                direct_runs.append(run_direct(framework, case))
            z = statistics.median(r["wall"] for r in zoo_runs)
            d = statistics.median(r["wall"] for r in direct_runs)
            goal = 0.10 * d + 1.0
            rows.append([framework, f"{z:.2f}", f"{statistics.median(r['stage'] for r in zoo_runs):.2f}", f"{d:.2f}",
                         f"{statistics.median(r['convert_s'] for r in direct_runs):.3f}", f"{z - d:+.2f}",
                         f"{goal:.2f}", "MET" if z - d <= goal else "NOT met",
                         f"{zoo_runs[-1]['max_abs']:.2g} / {zoo_runs[-1]['label_mismatches']}",
                         f"{direct_runs[-1]['max_abs']:.2g} / {direct_runs[-1]['label_mismatches']}"])
            single = ", ".join(f"{a['wall'] - b['wall']:+.2f}" for a, b in zip(zoo_runs, direct_runs))
            notes.append(f"{framework}: single-run overheads {single}; load average now {os.getloadavg()[0]:.2f}")
            # zoo's worker ends with os._exit, skipping Python's finalisation; a plain script pays it
            outside = statistics.median(r["wall"] - r["inside_s"] for r in direct_runs)
            notes.append(f"{framework}: the direct script spends {outside:.2f} s outside its own code (interpreter "
                         f"start and finalisation); overhead against it without that: {z - d + outside:+.2f}")
            if "gate_max_abs" in direct_runs[-1]:  # torch: zoo's gate runs random inputs, not the held-out rows
                notes.append(f"{framework}: the direct export on zoo's gate inputs (8 seeded random rows): max_abs "
                             f"{direct_runs[-1]['gate_max_abs']:.2g}")
    print(f"load average after: {os.getloadavg()[0]:.2f}; medians of {args.repeat} runs, seconds")
    header = ["exporter", "zoo run export", "stage", "direct script", "converter call", "overhead", "goal ≤",
              "goal", "zoo parity (max_abs / label diffs)", "direct parity"]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
