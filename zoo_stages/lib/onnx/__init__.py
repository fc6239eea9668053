"""ONNX files: `onnx_io` (the one load, serialise, save and check; protobuf's limit), `onnx_fields`
(read and rewrite a model's top-level fields without parsing its graph), `model_info` (ports,
opset, precision), `graph_order` (topological order), `portability` (portable ONNX and the runtime
a build needs), `reference_run` (onnx's reference evaluator, test vectors against it), `export_io`
(what export does to its files: normalise, stamp, check, describe).

Modules here import `onnx` (the library) absolutely; this package is `zoo_stages.lib.onnx`.
"""
