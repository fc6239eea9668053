"""Small decoder language models for the tests, made here: nothing is downloaded.

`tiny_llama_folder` writes a Hugging Face model folder (config.json, model.safetensors and a
byte-level BPE tokenizer learnt from the standard library's `pydoc_data` topics, the real English
text that ships with Python) holding a randomly initialised `LlamaForCausalLM` of a few hundred
thousand parameters; `genai_build` runs onnxruntime-genai's model builder on such a folder, in a
process of its own, and returns the folder of its ONNX model (zoo's decoder I/O convention,
`zoo/decoder_io.py`) with its genai_config.json and tokenizer files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def pydoc_text() -> str:
    """The documentation topics that ship with CPython (about 65,000 words of English prose)."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def tiny_tokenizer(folder: Path, vocab_size: int = 512) -> int:
    """A byte-level BPE tokenizer learnt from `pydoc_text`, saved as transformers' fast tokenizer
    files in `folder`; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(pydoc_text().split("\n\n"), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    return tok.get_vocab_size()


def tiny_llama_folder(folder: Path, *, seed: int = 0, hidden_size: int = 64, layers: int = 2, heads: int = 4,
                      kv_heads: int = 2, intermediate_size: int = 128, vocab_size: int = 512) -> Path:
    """A randomly initialised LlamaForCausalLM (grouped-query attention: `kv_heads` < `heads`) with
    its tokenizer, saved as a Hugging Face folder (safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    vocab = tiny_tokenizer(folder, vocab_size)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def genai_build(hf_folder: Path, out: Path, precision: str = "fp32", extra: dict[str, str] | None = None) -> Path:
    """onnxruntime-genai's model builder on `hf_folder` for the CPU at `precision` (fp32, int4, int8),
    in a process of its own; `out` holds model.onnx, genai_config.json and the tokenizer files."""
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_folder), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(out.parent / f"{out.name}-cache")]
    if extra:
        cmd += ["--extra_options", *(f"{k}={v}" for k, v in extra.items())]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"onnxruntime-genai's builder failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return out


def head_size(build: Path) -> int:
    """The head size a build's genai_config.json declares (its cache inputs leave it symbolic)."""
    return int(json.loads((build / "genai_config.json").read_text())["model"]["decoder"]["head_size"])
