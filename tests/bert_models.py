"""A tiny Hugging Face BERT classifier exported to ONNX, for the transformer tests of optimize and
quantize (needs the torch extra and `transformers`): two int64 inputs ``input_ids`` and
``attention_mask`` ([batch, sequence], both dynamic), one float output ``logits`` [batch, 3]."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB = 500
CLASSES = 3
MAX_POSITIONS = 64
INPUTS = {"input_ids": {"shape": ["batch", "sequence"], "dtype": "int64"},
          "attention_mask": {"shape": ["batch", "sequence"], "dtype": "int64"}}  # the recipe's model.inputs


def export_tiny_bert(path: Path, seed: int = 0) -> Path:
    """BertForSequenceClassification (2 layers, hidden 64, 2 heads) exported with the TorchScript
    exporter at opset 17, IR version 13. Eager attention: onnxruntime's transformer optimizer
    fuses its pattern into Attention (`transformers`' sdpa export it does not)."""
    import onnx
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=MAX_POSITIONS, num_labels=CLASSES)
    config._attn_implementation = "eager"
    model = BertForSequenceClassification(config).eval()
    ids = torch.zeros(1, 16, dtype=torch.long)
    mask = torch.ones(1, 16, dtype=torch.long)
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(model, (ids, mask), str(path), dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["logits"],
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "logits": {0: "batch"}})
    exported = onnx.load(str(path))
    exported.ir_version = 13
    onnx.save(exported, str(path))
    return Path(path)


def token_features(samples: int, sequence: int = 16, seed: int = 0) -> dict[str, np.ndarray]:
    """Tokenised-text-like features: random ids, right-padded masks of random lengths."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(4, sequence + 1, samples)
    mask = (np.arange(sequence)[None, :] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(1, VOCAB, (samples, sequence)).astype(np.int64) * mask
    return {"input_ids": ids, "attention_mask": mask}
