"""Helpers shared by the built-in kinds, one job per module.

- data and models: `datasets` (the recipe's dataset, fixed split), `archs` (torch.nn
  architectures), `checkpoints` (safetensors save, weights_only load);
- ONNX: `onnx_io` (safe load, deterministic save, IR cap, opsets and domains a graph uses),
  `ort_session` (the one onnxruntime session builder: threads, deterministic compute, one error
  for a model that will not load), `onnx_run` (the one batched runner over named inputs and
  outputs), `parity` (the one output comparison: per output, exact for integers), `timing`
  (latency, throughput), `host_info` (the host figures were measured on), `onnx_fields` (read and
  rewrite a model's top-level fields without parsing its graph), `model_info` (ports, opset,
  precision), `convert` (fp16, ORT format), `provenance` (stamps, in-toto statement); the
  wire-level walker, the external-data check and file writes are zoo's shared infrastructure
  (`zoo.onnxwire`, `zoo.pathsafety`, `zoo.files`);
- tasks: `tasks` (the recipe's task kinds, the output their metrics read, classification and
  regression metrics), `classification` (top-1 accuracy of scores, for deploy's conversion check);
- quantize: `quant_settings` (presets, candidates), `quant_select` (auto's choice),
  `quant_ops` (blockwise linear layers, calibration reader);
- verify and deploy: `gates`, `vectors` (ONNX Model Zoo test vectors), `verify_report`,
  `conversion_check`, `release_folder` (the release folder's completeness check), `modelcard`.

Every helper a kind imports (inside ``run()`` too), directly or through another helper, enters
the kind's cache keys (zoo.engine.import_closure), so editing one reruns the stages that use it.
"""
