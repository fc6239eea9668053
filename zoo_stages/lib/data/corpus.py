"""A text corpus for a causal language model (``data: {source: text}``): documents, a byte-level BPE
tokenizer, and fixed-length blocks of token ids.

- Documents come from a ``.jsonl`` file (one JSON object per line, its text under ``data.text``,
  default ``text``) or a ``.txt`` file (documents separated by one or more blank lines). The split
  (`zoo_stages.lib.data.split`) is made over documents, so the held-out text is text the model never
  saw, not the tail of a document it trained on.
- The tokenizer is a ``tokenizer.json`` beside the recipe (``data.tokenizer.path``; it needs an
  end-of-text token, one of `END_OF_TEXT_CANDIDATES`) or learnt from the train split's documents
  (``data.tokenizer.train: {model: bpe, vocab_size}``): GPT-2's byte-level BPE (every byte is in the
  vocabulary, so no text is unknown), ``<|endoftext|>`` as id 0 and its only special token, no
  normalisation unless ``lowercase``. `tokenizers`' BpeTrainer is deterministic here: its merges
  are ranked by count, ties by the pair's ids, and with the full byte alphabet given those ids are
  the sorted alphabet's (the same JSON in every process: `tests/test_data_corpus.py` trains in two).
- Each split's documents are encoded, each followed by the end-of-text token, joined into one
  stream and cut into non-overlapping blocks of ``data.block_size`` tokens (the last, partial
  block is dropped): the named array ``input_ids``, int64 [blocks, block_size]. No padding, no
  attention mask: every position of a block is a real token.
- A base language model has no chat template (it continues text; it was never trained on turns),
  so `tokenizer_files` writes none, and says so in the preprocessing record.

`tokenizer_files` gives the files a runtime needs to tokenize as training did, as transformers'
``PreTrainedTokenizerFast.save_pretrained`` writes them (tokenizer.json, tokenizer_config.json,
special_tokens_map.json), built here as JSON so their bytes do not depend on the transformers
version. numpy and tokenizers are imported inside functions.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from zoo_stages.lib.data.errors import DataError
from zoo_stages.lib.data.loaded import Loaded

if TYPE_CHECKING:
    import numpy as np

END_OF_TEXT = "<|endoftext|>"
# the end-of-text tokens of the common tokenizer families, in the order they are looked for
END_OF_TEXT_CANDIDATES = (END_OF_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>", "<|end|>")
MAX_DOCUMENT_FILE_BYTES = 2 * 1024 ** 3


def load_documents(path: Path, given: str, text_key: str | None) -> Loaded:
    """Every document of the corpus file at `path` (`given`: the recipe's spelling, for errors), as
    the sample array ``text`` (no labels)."""
    import numpy as np

    from zoo.files import read_regular

    try:
        raw = read_regular(path, MAX_DOCUMENT_FILE_BYTES)
    except OSError as e:
        raise DataError(f"data.path {given!r} cannot be read: {e}") from None
    if len(raw) > MAX_DOCUMENT_FILE_BYTES:
        raise DataError(f"data.path {given!r} is larger than {MAX_DOCUMENT_FILE_BYTES // 1024 ** 3} GiB",
                        hint="train on a part of the corpus")
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"data.path {given!r} is not UTF-8 text (byte {e.start})",
                        hint="save the corpus as UTF-8") from None
    if text_key is None:
        docs = _paragraphs(content)
        fmt = "txt"
    else:
        docs = _jsonl_documents(content, given, text_key)
        fmt = "jsonl"
    if len(docs) < 2:
        raise DataError(f"data.path {given!r} holds {len(docs)} document(s): a corpus needs at least 2 to hold one out",
                        hint="a .txt corpus separates its documents by blank lines; a .jsonl one has one per line")
    samples = np.empty(len(docs), dtype=object)
    samples[:] = docs
    facts = {"format": fmt, "documents": len(docs), "sha256": hashlib.sha256(raw).hexdigest(),
             "characters": sum(len(d) for d in docs)}
    return Loaded(samples={"text": samples}, labels=None, label_kind=None, facts=facts)


def _paragraphs(content: str) -> list[str]:
    """The documents of a .txt corpus: runs of non-blank lines (line ends normalised to \\n)."""
    docs, current = [], []
    for line in content.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if line.strip():
            current.append(line)
        elif current:
            docs.append("\n".join(current))
            current = []
    if current:
        docs.append("\n".join(current))
    return docs


def _jsonl_documents(content: str, given: str, key: str) -> list[str]:
    docs = []
    for n, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise DataError(f"data.path {given!r} line {n} is not JSON: {e}",
                            hint="a .jsonl corpus holds one JSON object per line") from None
        if not isinstance(obj, dict) or key not in obj:
            raise DataError(f"data.text: line {n} of {given!r} has no key {key!r}",
                            hint="set `data.text:` to the key that holds each document's text")
        text = obj[key]
        if not isinstance(text, str):
            raise DataError(f"data.text: line {n} of {given!r} has a {type(text).__name__} under {key!r}, not a string")
        if text.strip():
            docs.append(text)
    return docs


def train_bpe(texts: Sequence[str], vocab_size: int, min_frequency: int, lowercase: bool) -> Any:
    """A byte-level BPE tokenizer learnt from `texts` (deterministic; see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from zoo_stages.lib.data.text import _tokenizers

    _tokenizers()  # the install hint when tokenizers is missing
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    if lowercase:
        tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(list(texts), trainer=trainer)
    return tokenizer


def end_of_text(tokenizer_json: str, where: str = "data.tokenizer") -> tuple[str, int]:
    """(token, id) of the tokenizer's end-of-text token; DataError naming `where` when it has none."""
    from zoo_stages.lib.data.text import _tokenizers

    tokenizer = _tokenizers().Tokenizer.from_str(tokenizer_json)
    for token in END_OF_TEXT_CANDIDATES:
        token_id = tokenizer.token_to_id(token)
        if token_id is not None:
            return token, int(token_id)
    raise DataError(f"{where}: the tokenizer has no end-of-text token ({', '.join(END_OF_TEXT_CANDIDATES)}), "
                    "which separates the corpus's documents",
                    hint="add one to the tokenizer (add_special_tokens), or train one: "
                         "`tokenizer: {train: {model: bpe, vocab_size: 4096}}`")


def plain(tokenizer: Any) -> str:
    """The tokenizer's JSON without padding or truncation: a generator's tokenizer encodes a prompt as it is."""
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer.to_str()


def blocks(tokenizer_json: str, texts: Sequence[str], block_size: int) -> "np.ndarray":
    """int64 [N, block_size]: the documents encoded, each followed by the end-of-text token, joined,
    cut into whole blocks (a last partial block is dropped)."""
    import numpy as np

    from zoo_stages.lib.data.text import _tokenizers

    tokenizer = _tokenizers().Tokenizer.from_str(tokenizer_json)
    _, eot = end_of_text(tokenizer_json)
    encodings = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    stream = np.fromiter((i for e in encodings for i in (*e.ids, eot)), dtype=np.int64)
    n = len(stream) // block_size
    return np.ascontiguousarray(stream[:n * block_size].reshape(n, block_size))


def tokenizer_files(tokenizer_json: str, block_size: int) -> dict[str, str]:
    """{file name: text} of what a runtime needs to tokenize as training did (tokenizer.json,
    tokenizer_config.json, special_tokens_map.json, as `PreTrainedTokenizerFast.save_pretrained`
    writes them). No chat template: a base language model has none."""
    token, token_id = end_of_text(tokenizer_json)
    doc = json.loads(tokenizer_json)
    added = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
             for t in doc.get("added_tokens") or []}
    config = {
        "added_tokens_decoder": dict(sorted(added.items(), key=lambda kv: int(kv[0]))),
        "bos_token": token,
        "clean_up_tokenization_spaces": False,
        "eos_token": token,
        "model_max_length": int(block_size),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": token if doc.get("model", {}).get("unk_token") is None else doc["model"]["unk_token"],
    }
    special = {"bos_token": token, "eos_token": token, "unk_token": config["unk_token"]}
    return {"tokenizer.json": tokenizer_json, "tokenizer_config.json": _json(config),
            "special_tokens_map.json": _json(special)}


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def corpus_record(spec: dict, tokenizer_json: str, loaded: Loaded) -> dict[str, Any]:
    """What a user must do to a text before feeding the model (for `preprocessing`)."""
    from zoo_stages.lib.data.text import vocab_size

    doc = json.loads(tokenizer_json)
    token, token_id = end_of_text(tokenizer_json)
    source = spec["tokenizer"]
    return {
        "features": ["input_ids"],
        "documents": {"format": loaded.facts["format"], "count": loaded.facts["documents"],
                      "sha256": loaded.facts["sha256"], "text_key": spec.get("text")},
        "tokenizer": {
            "sha256": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
            "source": "file" if source.get("path") else "trained on the train split",
            "kind": (doc.get("model") or {}).get("type"),
            "vocab_size": vocab_size(tokenizer_json),
            "end_of_text": {"token": token, "id": token_id},
            "file": "tokenizer.json",
        },
        "block_size": spec["block_size"],
        "blocks": "documents encoded without special tokens, each followed by the end-of-text token, joined and "
                  "cut into non-overlapping blocks (the last partial block dropped)",
        "chat_template": None,  # a base language model: it continues text and was trained on no turns
        "dtype": "int64",
    }
