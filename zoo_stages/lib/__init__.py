"""Helpers shared by the built-in kinds, grouped by concern, one job per module:

- `onnx/`: ONNX files in and out (`onnx_io`: the one load, save and check), their fields, ports,
  order, portability, the reference evaluator, export's normalising;
- `runtimes/`: onnxruntime sessions and runs, timings and where they were measured, device
  conversions (float16, ORT format, OpenVINO, TensorRT), transformer fusions;
- `models/`: the networks and estimators train and export build, checkpoints, fine-tuning;
- `data/`: the recipe's dataset (`datasets`, the API the kinds import) and its parts;
- `quality/`: parity, task metrics, gates, equivalence across platform classes;
- `release/`: provenance, model card, the release folder, test vectors;
- `quantization/`: quantize's presets, selection and operators.

The wire-level walker, the external-data check and file writes are zoo's shared infrastructure
(`zoo.onnxwire`, `zoo.pathsafety`, `zoo.files`).

Every helper a kind imports (inside ``run()`` too), directly or through another helper, enters
the kind's cache keys (zoo.engine.import_closure), so editing one reruns the stages that use it.
"""
