"""onnxruntime-genai's model builder, and the files a runtime needs beside a generative build.

`hf_folder` assembles the local Hugging Face folder the builder reads (the model's config.json
and model.safetensors as ``save_pretrained`` writes them from the weights export loaded, and the
tokenizer files); `run` runs ``python -m onnxruntime_genai.models.builder`` on it in a process
of its own, for the CPU, offline (``HF_HUB_OFFLINE``: nothing is downloaded), with a cache folder
of its own. It writes the ONNX model itself (the ``genai`` exporter) or, with the builder's
``config_only=true``, only genai_config.json (for a torch.onnx export).

`genai_config` fits a builder's genai_config.json to the ONNX file it describes: the decoder's
``inputs``/``outputs`` are those the file really has (a torch.onnx export takes ``position_ids``,
the builder's own graph does not), so onnxruntime_genai loads and feeds it. `tokenizer_files`
writes tokenizer.json (padding and truncation off: a prompt is not a fixed-length block),
tokenizer_config.json (the source's, with its ``chat_template`` inlined where it has one,
special tokens named, the builder's local-path keys dropped) and special_tokens_map.json where
the source has one.

The builder stamps the ONNX model's ``producer_version`` with ``git rev-parse HEAD`` run four
folders above its own package (in a virtual environment inside a git checkout, that checkout's
commit: every commit of the checkout would change the bytes), so `normalise_builder_model`
writes the package's version there instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from zoo.errors import InvalidInput

TOOL = "onnxruntime-genai"
CONFIG_FILE = "genai_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TIMEOUT_S = 1800
# keys of a tokenizer_config.json that describe where it was loaded from, not the tokenizer
_LOCAL_KEYS = ("is_local", "local_files_only", "name_or_path", "_commit_hash")


def version() -> str:
    from importlib import metadata

    return metadata.version(TOOL)


def hf_folder(model: Any, tokenizer: Mapping[str, bytes], dest: Path) -> Path:
    """`dest` as a Hugging Face folder of `model` (config.json, model.safetensors) and its tokenizer."""
    import shutil

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    model.save_pretrained(str(dest), safe_serialization=True)
    for name, blob in tokenizer.items():
        (dest / name).write_bytes(blob)
    return dest


def run(folder: Path, out: Path, *, precision: str = "fp32", extra: Mapping[str, str] | None = None,
        log: Any = None) -> Path:
    """onnxruntime-genai's builder on `folder` for the CPU at `precision`, into `out` (a new folder)."""
    import shutil

    if out.exists():
        shutil.rmtree(out)
    cache = out.parent / f"{out.name}-cache"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(folder), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(cache)]
    if extra:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in sorted(extra.items()))]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
           "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S, cwd=str(out.parent))
    except subprocess.TimeoutExpired:
        raise InvalidInput(f"onnxruntime-genai's model builder did not finish in {TIMEOUT_S} s") from None
    if log is not None:
        log.info("onnxruntime-genai builder: %s", " ".join(cmd[2:]))
        for line in done.stdout.splitlines()[-20:]:
            log.info("  %s", line)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + "\n" + done.stderr).strip().splitlines()[-15:])
        raise InvalidInput(f"onnxruntime-genai's model builder failed (exit {done.returncode}):\n{tail}",
                           hint="its log is in the stage's log; `exporter: dynamo` exports through torch.onnx")
    shutil.rmtree(cache, ignore_errors=True)
    if not (out / CONFIG_FILE).is_file():
        raise InvalidInput(f"onnxruntime-genai's model builder wrote no {CONFIG_FILE}")
    return out


def config_only(folder: Path, out: Path, log: Any = None) -> dict[str, Any]:
    """The genai_config.json the builder writes for `folder` without building a model."""
    run(folder, out, extra={"config_only": "true"}, log=log)
    return json.loads((out / CONFIG_FILE).read_text())


def genai_config(config: Mapping[str, Any], inputs: list[str], outputs: list[str], filename: str = "model.onnx"
                 ) -> dict[str, Any]:
    """`config` (a builder's genai_config.json) with the decoder's file name and its ``inputs`` and
    ``outputs`` those of the ONNX file (`inputs`/`outputs`: its port names, zoo's convention)."""
    from zoo import decoder_io

    out = json.loads(json.dumps(config))
    decoder = out["model"]["decoder"]
    decoder["filename"] = filename
    names: dict[str, str] = {}
    for name in (decoder_io.INPUT_IDS, decoder_io.ATTENTION_MASK, decoder_io.POSITION_IDS):
        if name in inputs:
            names[name] = name
    missing = [n for n in (decoder_io.INPUT_IDS,) if n not in inputs]
    if missing or not any(decoder_io.PAST_RE.match(n) for n in inputs) or decoder_io.LOGITS not in outputs:
        raise InvalidInput("the decoder does not follow zoo's convention (input_ids, past_key_values.N.key/value "
                           f"in, logits and present.N.key/value out); it has inputs {', '.join(inputs)} and outputs "
                           f"{', '.join(outputs)}")
    names["past_key_names"] = "past_key_values.%d.key"
    names["past_value_names"] = "past_key_values.%d.value"
    decoder["inputs"] = names
    decoder["outputs"] = {"logits": decoder_io.LOGITS, "present_key_names": "present.%d.key",
                          "present_value_names": "present.%d.value"}
    decoder["num_hidden_layers"] = decoder_io.num_layers(inputs)
    return out


def config_bytes(config: Mapping[str, Any]) -> bytes:
    """genai_config.json's bytes: sorted keys, indented, so the same config gives the same file."""
    return (json.dumps(config, indent=4, sort_keys=True) + "\n").encode("utf-8")


def tokenizer_files(tokenizer_json: str, tokenizer_config: Mapping[str, Any] | None, *, chat_template: str | None,
                    special_tokens_map: Mapping[str, Any] | None, eos_token: str | None, bos_token: str | None,
                    context_length: int | None) -> dict[str, bytes]:
    """{file name: bytes} of the tokenizer a generative build ships (see the module docstring)."""
    tok = json.loads(tokenizer_json)
    tok["padding"] = None
    tok["truncation"] = None
    config: dict[str, Any] = {k: v for k, v in dict(tokenizer_config or {}).items() if k not in _LOCAL_KEYS}
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if eos_token is not None:
        config.setdefault("eos_token", eos_token)
    if bos_token is not None:
        config.setdefault("bos_token", bos_token)
    if context_length:
        config["model_max_length"] = int(context_length)
    if chat_template:
        config["chat_template"] = chat_template
    files = {"tokenizer.json": (json.dumps(tok, ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode("utf-8"),
             "tokenizer_config.json": (json.dumps(config, ensure_ascii=False, indent=2, sort_keys=True) + "\n"
                                       ).encode("utf-8")}
    if special_tokens_map:
        files["special_tokens_map.json"] = (json.dumps(dict(special_tokens_map), ensure_ascii=False, indent=2,
                                                       sort_keys=True) + "\n").encode("utf-8")
    return files


def token_text(tokenizer_json: str, token_id: int | None) -> str | None:
    """The text of token `token_id` in a tokenizer.json (its added tokens, then its vocabulary)."""
    if token_id is None:
        return None
    tok = json.loads(tokenizer_json)
    for added in tok.get("added_tokens") or []:
        if added.get("id") == token_id:
            return str(added["content"])
    vocab = (tok.get("model") or {}).get("vocab") or {}
    if isinstance(vocab, dict):
        for text, i in vocab.items():
            if i == token_id:
                return str(text)
    return None


def normalise_builder_model(proto: Any) -> None:
    """The builder's model made reproducible (``producer_version`` without the git commit it read
    from wherever its package is installed, see the module docstring) and valid ONNX
    (`standard_rms_norms`, its intermediate shape declarations dropped)."""
    proto.producer_name = "onnxruntime-genai"
    proto.producer_version = version()
    # its value_info declares some of its own constants with another rank than they have (a [1]
    # INT64 constant as a scalar): onnx's strict shape inference refuses them; the ports keep theirs
    del proto.graph.value_info[:]
    standard_rms_norms(proto)


def standard_rms_norms(proto: Any) -> int:
    """Each ``SimplifiedLayerNormalization`` of the default domain rewritten as standard operators.

    The builder writes the final RMS norm as onnxruntime's SimplifiedLayerNormalization, which
    onnxruntime registers in the ONNX domain although ONNX has no such operator: onnx's checker
    (export's, verify's and deploy's gate) refuses the model. ``Y = X / sqrt(mean(X², last axis) +
    epsilon) * scale`` in float32 is the same computation (onnxruntime's kernel, stash_type float);
    returns how many were rewritten."""
    import onnx
    from onnx import helper, numpy_helper

    import numpy as np

    nodes = []
    count = 0
    for node in proto.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type != "SimplifiedLayerNormalization":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if int(attrs.get("axis", -1)) != -1 or any(o for o in node.output[1:]):
            raise InvalidInput(f"onnxruntime-genai's builder wrote a SimplifiedLayerNormalization ({node.name}) zoo "
                               "cannot write as standard ONNX (another axis, or its inverse std output used)")
        eps = float(attrs.get("epsilon", 1e-5))
        x, scale = node.input[0], node.input[1]
        base = f"{node.name or 'rms'}/std"
        axes, epsilon = f"{base}/axes", f"{base}/epsilon"
        proto.graph.initializer.extend([numpy_helper.from_array(np.array([-1], dtype=np.int64), axes),
                                        numpy_helper.from_array(np.array(eps, dtype=np.float32), epsilon)])
        nodes += [helper.make_node("Mul", [x, x], [f"{base}/sq"], name=f"{base}/Mul_sq"),
                  helper.make_node("ReduceMean", [f"{base}/sq", axes], [f"{base}/mean"], name=f"{base}/ReduceMean",
                                   keepdims=1),
                  helper.make_node("Add", [f"{base}/mean", epsilon], [f"{base}/var"], name=f"{base}/Add"),
                  helper.make_node("Sqrt", [f"{base}/var"], [f"{base}/rms"], name=f"{base}/Sqrt"),
                  helper.make_node("Div", [x, f"{base}/rms"], [f"{base}/normed"], name=f"{base}/Div"),
                  helper.make_node("Mul", [f"{base}/normed", scale], [node.output[0]], name=f"{base}/Mul_scale")]
        count += 1
    if count:
        del proto.graph.node[:]
        proto.graph.node.extend(nodes)
        onnx.checker.check_model(proto)  # the rewrite itself is well formed
    return count
