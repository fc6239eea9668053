"""Helpers shared by the built-in kinds, one job per module.

- data and models: `datasets` (the recipe's dataset, fixed split), `archs` (torch.nn
  architectures), `checkpoints` (safetensors save, weights_only load);
- ONNX: `onnxutil` (load/save, sessions, timing), `onnx_fields` (read and rewrite a model's
  top-level fields without parsing its graph), `model_info` (ports, opset, precision), `convert`
  (fp16, ORT format), `provenance` (stamps, in-toto statement); the wire-level walker, the
  external-data check and file writes are zoo's shared infrastructure (`zoo.onnxwire`, `zoo.pathsafety`,
  `zoo.files`);
- quantize: `quant_settings` (presets, candidates), `quant_select` (auto's choice),
  `quant_ops` (blockwise linear layers, calibration reader);
- verify and deploy: `gates`, `vectors` (ONNX Model Zoo test vectors), `verify_report`,
  `conversion_check`, `release_folder` (the release folder's completeness check), `modelcard`.

Every helper a kind imports (inside ``run()`` too), directly or through another helper, enters
the kind's cache keys (zoo.engine.import_closure), so editing one reruns the stages that use it.
"""
