"""The `deploy` stage kind: device builds, test vectors, model card, manifest, publish.

Recipe usage::

    deploy:
      needs: [optimize, quantize, verify]
      config:
        builds:
          cpu-fp32:  {from: optimize}                  # shipped as is; verified under the same name
          cpu-int8:  {from: quantize}
          cuda-fp16: {from: optimize, convert: fp16}   # float16, float32 I/O, parity-checked on the CPU
          mobile:    {from: quantize, convert: ort}    # ORT format for onnxruntime mobile
          tensorrt-fp16: {from: export, convert: tensorrt}  # onnxruntime's TensorRT provider, fp16 engine
        publish: true

For every build, ``out_dir/release/`` gets ``builds/<build>/model.onnx`` (or ``model.ort``),
its test vectors (``builds/<build>/test_data_set_0/input_0.pb``... in the ONNX Model Zoo
layout) and a `Build` entry; then the model card ``README.md`` and, last, ``zoo-manifest.json``
(the manifest format of zoo/manifest.py). That folder is a complete release, and it is
byte-deterministic: the same inputs give the same bytes (no timestamps, sorted keys, one inference
thread). Deploy does not publish it: with ``publish: true`` it declares the folder as the version's
release (`release_output`) and the engine publishes it to the local zoo (zoo/engine/publish.py),
after a run or a cache hit alike, through `publication`, which adds the timings measured upstream.

Provenance (`zoo_stages.lib.release.provenance`): every shipped ONNX build is stamped with
``metadata_props`` (zoo version, recipe name@version and digest, deploy's key, build name,
source digest, license and the sources' attribution); an ORT-format build is converted from a
stamped copy of its source, so it carries the same props. The release also holds ``zoo.lock``
(the lock records of every ancestor stage: what reproduces it) and ``provenance.intoto.json``
(an in-toto statement, SLSA provenance v1, whose subjects are every build file), both listed
in the manifest's ``files``; the model card gets a Provenance section rendered from the
statement.

- Builds without conversion ship their upstream model unchanged, with verify's metrics and test
  vectors for the build of the same name (``verified_as`` overrides the name). Those vectors
  are re-run against the model (``check_vectors``) so a wrong name mapping fails loudly.
- ``convert: fp16`` and ``convert: ort`` builds are compared with their source on the CPU
  (held-out data when the recipe has a ``data:`` section, else verify's test inputs, else fixed
  random inputs); a difference beyond ``atol + rtol * |ref|`` raises GateFailed with a table.
  Their test vectors are the converted model's outputs on verify's test inputs.
- ``convert: tensorrt`` builds (`zoo_stages.lib.runtimes.tensorrt_build`) ship their source model for
  onnxruntime's TensorRT provider, with the provider options (precision, engine cache) in the
  build's ``provider_options``: fp16 from a float model, int8 from a QDQ model made with
  quantize's ``preset: tensorrt``; a model TensorRT cannot compile as one engine is refused. On a
  host where onnxruntime offers the provider they are run there (parity, latency, measured_on
  with the GPU); elsewhere they are published ``verified: false`` with the reason.
- Every ONNX build whose bytes verify's checker gate did not see (a conversion, an unverified
  build) passes ``onnx.checker`` with ``full_check`` here, or the stage fails (StageFailed naming
  the build) and nothing is published: a build is valid ONNX, not only a graph onnxruntime
  tolerates.

The package, one module per job: `kind` (the `Deploy` class, the engine's entry point), `config`
(`DeployConfig`, `BuildSpec`), `release` (one run: each build, then card and manifest), `shipped`
(what a build ships), `as_is` (an upstream model shipped unchanged), `conversion` with one module per
runtime's builds (`fp16`, `ort_format`, `openvino`, `tensorrt`; each runs its build where the host has
the device), `measured` (deploy's own timings), `checks` (valid and portable ONNX), `vectors` (test
vectors), `manifest_parts` (lineage, preprocessing), `provenance_files` (metadata_props, zoo.lock,
the statement), `card` (the model card and the published copy with timings).
"""
