"""Texts to token ids with Hugging Face `tokenizers` (the ``text`` extra, imported when used).

The tokenizer is a ``tokenizer.json`` beside the recipe (``data.tokenizer.path``) or trained
on the train split's texts (``data.tokenizer.train``: a BERT-style WordPiece with the special
tokens [PAD] [UNK] [CLS] [SEP] [MASK], ids 0..4, and the template ``[CLS] text [SEP]``).
Its vocabulary is learnt by `learn_wordpiece_vocab` (ties broken by text, not hash order),
so its JSON is the same bytes in every run and process. Either way the tokenizer is set to pad (right, with its pad
token) and truncate (right) to ``max_length``; that configured JSON is what the model ships
with (`datasets.tokenizer_json`), so ``Tokenizer.from_str(json).encode_batch(texts)`` gives
the model's ``input_ids`` and ``attention_mask`` (int64 [N, max_length]), and optionally
``token_type_ids``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from zoo.errors import InvalidInput
from zoo_stages.lib.data.errors import DataError

if TYPE_CHECKING:
    import numpy as np

TEXT_EXTRA = "pip install 'zoo-onnx[text]'"
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_CANDIDATES = ("[PAD]", "<pad>", "<|pad|>", "<PAD>")


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise InvalidInput("data.text needs Hugging Face `tokenizers`, which is not installed", hint=TEXT_EXTRA) from None
    return tokenizers


def train_wordpiece(texts: Sequence[str], vocab_size: int, lowercase: bool, min_frequency: int) -> Any:
    """A BERT-style WordPiece tokenizer whose vocabulary is learnt from `texts` (deterministic).

    The vocabulary is learnt here, not by `tokenizers`' WordPieceTrainer: that trainer breaks
    ties between equally frequent pairs in hash-map order, which differs between processes (two
    runs gave two vocabularies). `learn_wordpiece_vocab` is the same BPE-style algorithm with
    ties broken by the pair's text.
    """
    tk = _tokenizers()
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

    normalizer = normalizers.BertNormalizer(lowercase=lowercase, clean_text=True, handle_chinese_chars=True,
                                            strip_accents=None)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    words: Counter[str] = Counter()
    for t in texts:
        words.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(t)))
    vocab = learn_wordpiece_vocab(words, vocab_size, min_frequency)
    tokenizer = tk.Tokenizer(models.WordPiece(vocab={tok: i for i, tok in enumerate(vocab)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tokenizer


def learn_wordpiece_vocab(words: Mapping[str, int], vocab_size: int, min_frequency: int) -> list[str]:
    """WordPiece vocabulary (BPE merges with the ``##`` continuation prefix) from word counts.

    The special tokens come first (ids 0..4), then every character (``c`` at a word's start,
    ``##c`` inside it) in sorted order, then merged pieces in the order learnt: each step merges
    the most frequent adjacent pair (ties: the smaller (left, right) text), while it occurs at
    least `min_frequency` times, until the vocabulary has `vocab_size` entries.
    """
    import heapq

    seqs = [[w[0]] + ["##" + c for c in w[1:]] for w in sorted(words)]
    counts = [words[w] for w in sorted(words)]
    vocab = list(SPECIAL_TOKENS) + sorted({s for seq in seqs for s in seq} - set(SPECIAL_TOKENS))
    known = set(vocab)
    pairs: dict[tuple[str, str], int] = defaultdict(int)
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, seq in enumerate(seqs):
        for pair in zip(seq, seq[1:]):
            pairs[pair] += counts[i]
            where[pair].add(i)
    heap = [(-n, pair) for pair, n in pairs.items()]
    heapq.heapify(heap)
    while len(vocab) < vocab_size and heap:
        neg, pair = heapq.heappop(heap)
        if pairs.get(pair, 0) != -neg:  # stale entry: the count changed since it was pushed
            continue
        if -neg < min_frequency:
            break
        merged = pair[0] + pair[1].removeprefix("##")
        if merged not in known:
            known.add(merged)
            vocab.append(merged)
        touched: set[tuple[str, str]] = set()
        for i in sorted(where.pop(pair, ())):
            seq = seqs[i]
            for p in zip(seq, seq[1:]):
                pairs[p] -= counts[i]
                touched.add(p)
            out, j = [], 0
            while j < len(seq):
                if j + 1 < len(seq) and (seq[j], seq[j + 1]) == pair:
                    out.append(merged)
                    j += 2
                else:
                    out.append(seq[j])
                    j += 1
            seqs[i] = out
            for p in zip(out, out[1:]):
                pairs[p] += counts[i]
                where[p].add(i)
                touched.add(p)
        pairs.pop(pair, None)
        for p in sorted(touched - {pair}):
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
            else:
                pairs.pop(p, None)
                where.pop(p, None)
    return vocab


def load_tokenizer(path: Path, given: str) -> Any:
    """A tokenizer.json file."""
    tk = _tokenizers()
    try:
        return tk.Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception for unreadable files
        raise DataError(f"data.tokenizer.path {given!r} is not a Hugging Face tokenizer.json: {e}",
                        hint="save one with tokenizer.save('tokenizer.json'), or use `tokenizer: {train: {...}}`") \
            from None


def configured(tokenizer: Any, max_length: int, where: str) -> str:
    """The tokenizer's JSON, set to pad and truncate (right) to `max_length`."""
    pad = tokenizer.padding
    if pad is not None:
        pad_id, pad_token = pad["pad_id"], pad["pad_token"]
    else:
        pad_token = next((t for t in PAD_CANDIDATES if tokenizer.token_to_id(t) is not None), None)
        if pad_token is None:
            raise DataError(f"{where}: the tokenizer has no padding token ({', '.join(PAD_CANDIDATES)})",
                            hint="add a pad token to the tokenizer, or train one with `tokenizer: {train: {...}}`")
        pad_id = tokenizer.token_to_id(pad_token)
    tokenizer.enable_truncation(max_length=max_length, direction="right")
    tokenizer.enable_padding(length=max_length, pad_id=pad_id, pad_token=pad_token, direction="right")
    return tokenizer.to_str()


def encode(tokenizer_json: str, texts: Sequence[str], token_type_ids: bool) -> dict[str, "np.ndarray"]:
    """input_ids, attention_mask (and token_type_ids) as int64 [N, max_length]."""
    import numpy as np

    tk = _tokenizers()
    tokenizer = tk.Tokenizer.from_str(tokenizer_json)
    encodings = tokenizer.encode_batch(list(texts))
    out = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
           "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}
    if token_type_ids:
        out["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
    return out


def vocab_size(tokenizer_json: str) -> int:
    """Every token id the tokenizer can give (added tokens included)."""
    return int(_tokenizers().Tokenizer.from_str(tokenizer_json).get_vocab_size(with_added_tokens=True))


def text_record(spec: dict, tokenizer_json: str, features: list[str]) -> dict[str, Any]:
    """What a user must do to a text before feeding the model (for `preprocessing`)."""
    doc = json.loads(tokenizer_json)
    padding, truncation = doc.get("padding") or {}, doc.get("truncation") or {}
    source = spec["tokenizer"]
    return {
        "features": features,
        "text_column": spec["text"],
        "tokenizer": {
            "sha256": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
            "source": "file" if source.get("path") else "trained on the train split",
            "kind": (doc.get("model") or {}).get("type"),
            "vocab_size": vocab_size(tokenizer_json),
            "lowercase": _lowercase(doc.get("normalizer")),
            "file": "tokenizer.json",
        },
        "max_length": spec["max_length"],
        "padding": {"side": str(padding.get("direction", "Right")).lower(), "to": "max_length",
                    "token": padding.get("pad_token"), "id": padding.get("pad_id")},
        "truncation": {"side": str(truncation.get("direction", "Right")).lower(), "max_length": spec["max_length"]},
        "dtype": "int64",
    }


def _lowercase(normalizer: Any) -> bool:
    """Whether the normalizer (a JSON tree) lowercases."""
    if isinstance(normalizer, dict):
        if normalizer.get("type") == "Lowercase" or normalizer.get("lowercase") is True:
            return True
        return any(_lowercase(v) for v in normalizer.values())
    if isinstance(normalizer, list):
        return any(_lowercase(v) for v in normalizer)
    return False
