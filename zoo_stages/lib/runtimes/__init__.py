"""Running models: `ort_session` (the one onnxruntime session builder), `onnx_run` (the one batched
runner over named inputs and outputs), `timing` (latency, throughput) with `step_log` (progress
lines of timed loops) and `host_info` (what figures were measured on), `convert` (float16, ORT
format), `openvino_build`, `tensorrt_build`, `transformer_fusion` (onnxruntime's transformer
optimizer)."""
