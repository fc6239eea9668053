"""The files a runtime needs beside a generative build (genai_config.json, the tokenizer files),
shipped in the build's folder so that onnxruntime_genai loads a pulled build as it is.

A build is generative when its model takes zoo's decoder inputs (`zoo.decoder_io.is_decoder`).
Its files come from the generative lineage: the export of a causal LM writes them as its `genai`
output (`zoo_stages.exporters.decoder`), and the stages after it (optimize, quantize: their only
output is the model) keep the decoder's inputs and outputs, so the export's files describe their
models too. deploy takes them from the `genai` output of the stages it needs: the one there is,
or, where several exports give one (say a torch.onnx and an onnxruntime-genai export), the one
whose genai_config.json names exactly the build's inputs. Each build's genai_config.json is
fitted to that build's own ports (`genai_builder.genai_config`). A generative build without such
a folder among deploy's inputs fails the stage, naming the stage to add to ``needs:``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zoo.errors import InvalidInput
from zoo.files import atomic_write

if TYPE_CHECKING:
    from zoo_stages.deploy.release import Release

GENAI_OUTPUT = "genai"
CONFIG_FILE = "genai_config.json"


def is_generative(info: Any) -> bool:
    """Whether a described model (`model_info.describe`) is a decoder with a KV cache."""
    from zoo import decoder_io

    return info is not None and decoder_io.is_decoder(p.name for p in info.inputs)


def ship(job: "Release", name: str, info: Any, bdir: Path) -> list[Path]:
    """Write the generative build's runtime files into `bdir` (beside its model.onnx); their paths."""
    from zoo_stages.lib.models import genai_builder

    inputs = [p.name for p in info.inputs]
    outputs = [p.name for p in info.outputs]
    folder = _folder(job, name, inputs)
    config = json.loads((folder / CONFIG_FILE).read_text())
    fitted = genai_builder.genai_config(config, inputs, outputs, "model.onnx")
    written = []
    target = bdir / CONFIG_FILE
    atomic_write(target, genai_builder.config_bytes(fitted), fsync=False)
    written.append(target)
    for source in sorted(folder.iterdir()):
        if source.name == CONFIG_FILE or not source.is_file():
            continue
        target = bdir / source.name
        atomic_write(target, source.read_bytes(), fsync=False)
        written.append(target)
    return written


def _folder(job: "Release", name: str, inputs: list[str]) -> Path:
    """The `genai` folder of the stage deploy needs that made this build's decoder (see the module docstring)."""
    found = {stage: Path(path) for stage, path in job.inputs.all(GENAI_OUTPUT).items()}
    if not found:
        raise InvalidInput(f"build {name} is a generative model (it takes past_key_values.N inputs), but no stage "
                           "deploy needs gives its genai_config.json and tokenizer files",
                           hint="add the export stage of the causal LM to deploy's `needs:` (its `genai` output "
                                "ships beside every build of the model)")
    if len(found) == 1:
        return next(iter(found.values()))
    fitting = [stage for stage, folder in sorted(found.items())
               if set(_named_inputs(folder / CONFIG_FILE)) == {n for n in inputs if not n.startswith("past_key_values.")}]
    if len(fitting) != 1:
        raise InvalidInput(f"build {name}: {len(found)} stages deploy needs give genai files "
                           f"({', '.join(sorted(found))}) and {len(fitting) or 'none'} of them fit its inputs",
                           hint="keep in deploy's `needs:` the one export this build derives from")
    return found[fitting[0]]


def _named_inputs(config: Path) -> list[str]:
    """The non-cache inputs a genai_config.json names (input_ids, attention_mask, position_ids)."""
    inputs = json.loads(config.read_text())["model"]["decoder"]["inputs"]
    return [v for k, v in inputs.items() if k not in ("past_key_names", "past_value_names")]
