"""The `deploy` stage kind: device builds, test vectors, model card, manifest, publish.

Packages upstream models as device builds and writes the release: `builds/<build>/model.onnx`
(or `model.ort`) with its test vectors, the model card `README.md`, provenance (`zoo.lock`,
`provenance.intoto.json`, `metadata_props` stamped into every ONNX build) and, last,
`zoo-manifest.json`. The release folder is byte-deterministic; with `publish: true` deploy declares
it as the version's release and the engine publishes it to the local zoo (`$ZOO_HOME`), with the
timings measured upstream added to the published manifest and card.

Build conversions (`builds.<name>.convert`):

- none: the upstream model ships unchanged (plus provenance metadata), with verify's metrics and
  vectors for the build of the same name (`verified_as` names another). deploy checks that the
  model is the one verify checked (by digest) and, with `check_vectors`, re-runs the vectors.
- `fp16`: onnxruntime's float16 converter with float32 inputs/outputs (Cast nodes at the edges),
  for CUDA; `op_block_list` keeps op types in float32. Quantized sources are refused. Take it from
  export or a `level: basic` optimize: `extended`/`all` graphs hold CPU-only fused ops, and the
  host-specific `nchwc` layouts of `all` break the conversion.
- `ort`: onnxruntime's ORT format for mobile/minimal builds (`optimization_style: Fixed` bakes
  optimizations in; `Runtime` saves some for NNAPI/CoreML), plus `model.required_operators.config`
  for a reduced onnxruntime build; the bytes are re-serialised in a fixed order so the release
  stays reproducible. The manifest requires the same onnxruntime minor version or newer.

Converted builds are compared with their source on the CPU (held-out data when the recipe has
`data:`, else verify's test inputs, else fixed random inputs); a float output beyond
`atol + rtol·|ref|`, or an integer output that differs, fails the stage with a table (default tolerances per conversion: the table below).

- **Inputs**: the upstream `model`s named by `from`; verify's `report` and `vectors` (optional but
  recommended: without them builds ship unverified); the recipe's `model:` and `data:`.
- **Outputs**: `release` (folder).
- **Metrics**: `builds`, `release_files`. Publishing is reported as an effect (`published NAME@VERSION`
  in the run summary, `effects` in `zoo run --json`), not a metric.

Every build says what runs it and whether that was checked (manifest schema 3; schema 1 and 2
manifests still read):

- `runtime`: `onnx` (standard ONNX domains: any runtime implementing its opsets), `onnxruntime>=1.32`
  (com.microsoft operators such as FusedConv, MatMulNBits or Attention, or the ORT format) or
  `openvino>=2026.4`; `execution_providers` the onnxruntime providers (or OpenVINO device) it is made
  for, `requires` the hardware (`device: cuda`), `provider_options` the options a provider is
  created with (a TensorRT build's precision and engine cache; `zoo.load_session` passes them).
- `portable: true` when it is standard ONNX, `onnx.checker` (full check) accepts it and its test
  vectors are reproduced by ONNX's reference evaluator (`onnx.reference`) as by onnxruntime. **Every
  version needs one portable build**, or deploy fails and says how to add one (optimize at
  `level: basic` — onnxruntime applies its extended fusions when it loads a model, so the latency is
  the same — or ship the plain export). Every ONNX build passes `onnx.checker` before it is published.
- `verified`: run on the runtime and device it is made for, its outputs checked (`verify` on
  onnxruntime's CPU provider; `ort` and `openvino` conversions by their runtime in deploy). A
  `convert: fp16` build is run on `CUDAExecutionProvider` and timed when the deploying host's
  onnxruntime has it, a `convert: tensorrt` build on `TensorrtExecutionProvider`; elsewhere they
  are published `verified: false` with the reason (outputs checked on the CPU only), the card says
  so, and `zoo pull` never picks them by itself. (So a GPU
  host's release of such a recipe differs from a CPU host's in that field: lock records made on a
  GPU host describe its own release.)
- `measured_on`: the runtime, its version, the execution provider, the CPU or GPU and its platform
  class, and the threads its `latency_*` metrics were measured with (`zoo show` prints it per build).

`convert: openvino` (the `openvino` extra) converts the build's source to OpenVINO IR
(`model.xml` + `model.bin`, byte-reproducible: converted in a fresh process, the source's file name
dropped) and runs it with OpenVINO's CPU plugin, float32 inference pinned (its default is bf16 on
CPUs with bf16 units), one thread: parity against the source, the task's metrics, test vectors,
and latency and throughput timed with verify's settings (warmup, runs, batch sizes, threads), with a
speedup against verify's reference build. From a QDQ model OpenVINO runs int8 kernels; its outputs are judged against onnxruntime's
int8 by the quantized bar (mean cosine) when they differ beyond the tolerance.

`convert: tensorrt` ships the source model for onnxruntime's TensorRT execution provider, which
compiles it into an engine for the GPU it runs on (an engine is specific to a GPU model and a
TensorRT version, so the ONNX file ships, not an engine). The build's `provider_options` say how:
`trt_fp16_enable` (the default `precision: fp16` from a float model) or `trt_int8_enable` (from a
QDQ model: TensorRT's explicit quantization) and an engine cache, which `zoo.load_session` keeps
in the local zoo's `engines/` so the engine is built once per model and GPU. Before anything is
built, deploy checks on any host that TensorRT can compile the model as one engine: standard ONNX
domains only (build from the plain export), and for int8 every Q/DQ in int8 with a zero point of 0
and no int32 (bias) dequantization — quantize's `preset: tensorrt` (symmetric int8, per-channel,
float biases) makes such a model; others are refused with exit 2 naming the nodes. On a host where
onnxruntime offers `TensorrtExecutionProvider` the build is run there (engine cached in the stage's
work folder): parity against its source on the GPU, latency with `measured_on` naming the GPU and

**Generative builds**: a build whose model takes a KV cache (`past_key_values.N.key`/`.value`
inputs, zoo's decoder convention) ships, beside its `model.onnx`, the files onnxruntime-genai
needs to run the build folder as it is: `genai_config.json` (fitted to that build's own inputs and
outputs) and the tokenizer files (`tokenizer.json`, `tokenizer_config.json` with the chat template
where there is one, `special_tokens_map.json` where the model has one), each in the build's
`extra_files` with its sha256, so `zoo pull` brings them. They come from the `genai` output of the
causal LM's export among deploy's `needs:`, for every build of the model (a quantize or optimize
stage's output is its model alone; their builds keep the export's inputs and outputs): keep that
export in `needs:`, or deploy fails naming it. Where two exports give such files, each build takes
the one whose genai_config.json names its inputs. Without verify's vectors, a generative build's
test vectors are the first step of a seeded 8-token prompt (nothing cached): its logits and cache.

The package, one module per job: `kind` (the `Deploy` class, the engine's entry point), `config`
(`DeployConfig`, `BuildSpec`), `release` (one run: each build, then card and manifest), `shipped`
(what a build ships), `as_is` (an upstream model shipped unchanged), `conversion` with one module per
runtime's builds (`fp16`, `ort_format`, `openvino`, `tensorrt`; each runs its build where the host has
the device), `measured` (deploy's own timings), `checks` (valid and portable ONNX), `vectors` (test
vectors), `genai_files` (a generative build's genai_config.json and tokenizer files), `manifest_parts` (lineage, preprocessing), `provenance_files` (metadata_props, zoo.lock,
the statement), `card` (the model card and the published copy with timings).

This docstring is the kind's description on the docs site (docs/kinds.md, written by
scripts/gen_kinds_doc.py): Markdown, for users.
"""
