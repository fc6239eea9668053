"""A corpus for a causal language model (`data: {source: text}`, zoo_stages/lib/data/corpus.py): the
byte-level BPE learnt from the train split (identical bytes in two processes), the fixed-length
`input_ids` blocks, the split by document, a .txt corpus, a user's tokenizer, the tokenizer files a
runtime needs, the task told from a corpus, and bad fields refused at their recipe line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_helpers import write_recipe, zoo
from conftest import REPO
from zoo_stages.lib.data import corpus, datasets
from zoo_stages.sections.task import infer_task, task_kind

PYDOC = {"source": "text", "path": "data/pydoc-topics.jsonl", "tokenizer": {"train": {"vocab_size": 512}},
         "block_size": 64, "val_fraction": 0.1}


@pytest.fixture(autouse=True)
def fresh_cache():
    datasets.clear_cache()
    yield
    datasets.clear_cache()


def _docs(tmp_path: Path, texts: list[str], name: str = "docs.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"body": t}) + "\n" for t in texts))
    return path


DOCS = [f"Document {i} says that the {w} is {v}, and the {w} stays {v}." for i, (w, v) in
        enumerate([("river", "cold"), ("mountain", "high"), ("garden", "green"), ("city", "loud"),
                   ("forest", "dark"), ("desert", "dry"), ("ocean", "deep"), ("valley", "quiet"),
                   ("island", "small"), ("bridge", "long")])]


def test_the_bpe_learnt_from_the_train_split_is_identical_across_processes():
    code = ("import sys; from pathlib import Path; from zoo_stages.lib.data import datasets; "
            f"sys.stdout.write(datasets.tokenizer_json({PYDOC!r}, Path({str(REPO / 'recipes')!r})))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs[0] == runs[1] == datasets.tokenizer_json(PYDOC, REPO / "recipes")
    doc = json.loads(runs[0])
    assert doc["model"]["type"] == "BPE" and doc["pre_tokenizer"]["type"] == "ByteLevel"
    assert doc["padding"] is None and doc["truncation"] is None  # a generator's prompt is encoded as it is
    assert [(t["id"], t["content"]) for t in doc["added_tokens"]] == [(0, "<|endoftext|>")]
    assert datasets.vocab_size(PYDOC, REPO / "recipes") == 512


def test_blocks_are_the_documents_joined_by_end_of_text_and_cut_to_block_size(tmp_path):
    from tokenizers import Tokenizer

    _docs(tmp_path, DOCS)
    spec = {"source": "text", "path": "docs.jsonl", "text": "body", "block_size": 8, "val_fraction": 0.2,
            "tokenizer": {"train": {"vocab_size": 300, "min_frequency": 1}}}
    train, val = (datasets.load_split(spec, tmp_path, s) for s in ("train", "val"))
    assert list(train.features) == ["input_ids"] and train.labels is None and val.labels is None
    blocks = train.features["input_ids"]
    assert blocks.dtype == np.int64 and blocks.shape[1] == 8 and not blocks.flags.writeable
    tokenizer_json = datasets.tokenizer_json(spec, tmp_path)
    tok = Tokenizer.from_str(tokenizer_json)
    train_idx, val_idx = datasets._indices(datasets._key(spec, tmp_path))
    stream = [i for d in train_idx for i in (*tok.encode(DOCS[int(d)], add_special_tokens=False).ids, 0)]
    assert len(blocks) == len(stream) // 8  # the last partial block is dropped
    assert blocks.reshape(-1).tolist() == stream[:len(blocks) * 8]
    assert tok.decode(blocks.reshape(-1).tolist(), skip_special_tokens=False).startswith(DOCS[int(train_idx[0])])
    assert datasets.documents(spec, tmp_path, "val") == [DOCS[int(i)] for i in val_idx]
    info = datasets.split_info(spec, tmp_path)
    assert (info["num_train"], info["num_val"], info["unit"]) == (8, 2, "documents")
    assert (info["num_train_blocks"], info["num_val_blocks"]) == (len(train), len(val))


def test_the_split_is_by_document_and_the_tokenizer_never_saw_the_held_out_ones(tmp_path):
    _docs(tmp_path, DOCS)
    spec = {"source": "text", "path": "docs.jsonl", "text": "body", "block_size": 4, "val_fraction": 0.3,
            "tokenizer": {"train": {"vocab_size": 400, "min_frequency": 1}}}
    train_idx, val_idx = datasets._indices(datasets._key(spec, tmp_path))
    assert set(train_idx.tolist()).isdisjoint(val_idx.tolist()) and len(train_idx) + len(val_idx) == len(DOCS)
    own = corpus.plain(corpus.train_bpe([DOCS[int(i)] for i in train_idx], 400, 1, False))
    assert datasets.tokenizer_json(spec, tmp_path) == own
    # a held-out document's own word was never merged: it only occurs in a held-out text
    held_out = {DOCS[int(i)].split()[5] for i in val_idx}
    vocab = json.loads(own)["model"]["vocab"]
    assert held_out and not any(("Ġ" + word) in vocab for word in held_out)


def test_a_txt_corpus_holds_documents_separated_by_blank_lines(tmp_path):
    (tmp_path / "book.txt").write_text("\n\n".join(DOCS[:6]) + "\r\n\r\n\r\n" + "\n".join(DOCS[6:]) + "\n")
    spec = {"source": "text", "path": "book.txt", "tokenizer": {"train": {"vocab_size": 300}}, "block_size": 4}
    loaded = datasets._loaded(datasets._key(spec, tmp_path))
    assert list(loaded.samples["text"]) == DOCS[:6] + ["\n".join(DOCS[6:])]
    assert loaded.facts["format"] == "txt"
    assert datasets.split_info(spec, tmp_path)["num_samples"] == 7
    assert datasets.preprocessing(spec, tmp_path)["corpus"]["documents"]["text_key"] is None


def test_a_tokenizer_file_needs_an_end_of_text_token(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    _docs(tmp_path, DOCS)
    tok = corpus.train_bpe(DOCS, 300, 1, False)
    tok.save(str(tmp_path / "mine.json"))
    spec = {"source": "text", "path": "docs.jsonl", "text": "body", "block_size": 4,
            "tokenizer": {"path": "mine.json"}}
    assert datasets.load_split(spec, tmp_path, "train").features["input_ids"].shape[1] == 4
    bare = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    bare.pre_tokenizer = pre_tokenizers.Whitespace()
    bare.save(str(tmp_path / "bare.json"))
    datasets.clear_cache()
    with pytest.raises(datasets.DataError, match="no end-of-text token") as e:
        datasets.load_split({**spec, "tokenizer": {"path": "bare.json"}}, tmp_path, "train")
    assert e.value.field == ("data", "tokenizer")


def test_tokenizer_files_are_what_a_fast_tokenizer_saves_without_a_chat_template():
    files = datasets.tokenizer_files(PYDOC, REPO / "recipes")
    assert sorted(files) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    assert files["tokenizer.json"] == datasets.tokenizer_json(PYDOC, REPO / "recipes")
    config = json.loads(files["tokenizer_config.json"])
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert config["eos_token"] == config["bos_token"] == "<|endoftext|>" and "chat_template" not in config
    assert config["added_tokens_decoder"]["0"]["content"] == "<|endoftext|>"
    assert config["model_max_length"] == 64
    assert json.loads(files["special_tokens_map.json"])["eos_token"] == "<|endoftext|>"
    record = datasets.preprocessing(PYDOC, REPO / "recipes")
    assert record["modality"] == "corpus" and record["corpus"]["chat_template"] is None
    assert record["corpus"]["tokenizer"]["end_of_text"] == {"token": "<|endoftext|>", "id": 0}


def test_the_committed_pydoc_corpus_is_split_by_topic():
    info = datasets.split_info({**PYDOC, "block_size": 128}, REPO / "recipes")
    assert info["num_samples"] == 79 and info["num_val"] == 8
    assert info["num_train_blocks"] > 500 and info["num_val_blocks"] > 40


def test_the_task_of_a_corpus_or_a_causal_lm_is_text_generation(tmp_path):
    assert task_kind("text-generation") == "generation"
    assert task_kind("image-generation") == "generation"  # any *-generation: a decoder's metrics (verify)
    assert infer_task(PYDOC, None, REPO / "recipes") == "text-generation"
    for arch in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Phi3ForCausalLM"):
        assert infer_task(None, {"framework": "transformers", "architecture": arch}, tmp_path) == "text-generation"


def test_the_corpus_fields_leave_other_recipes_data_section_as_it_was():
    from zoo_stages.sections.data import DataSpec

    plain = DataSpec.model_validate({"source": "csv", "path": "x.csv"}).model_dump(mode="json")
    assert "block_size" not in plain  # a lockfile's record of a csv recipe keeps its fields
    text = DataSpec.model_validate(PYDOC).model_dump(mode="json")
    assert text["block_size"] == 64 and text["text"] == "text"
    assert text["tokenizer"]["train"] == {"model": "bpe", "vocab_size": 512, "lowercase": False, "min_frequency": 2}


HEAD = "schema_version: 1\nname: lm\nversion: 0.1.0\n"
STAGES = "stages:\n  train:\n    config: {epochs: 1}\n"


@pytest.mark.parametrize("data, where, message", [
    ("  source: text\n  path: docs.csv\n  tokenizer: {train: {vocab_size: 300}}\n", "6:9",
     "source: text reads a .jsonl or .ndjson or .txt file, not 'docs.csv'"),
    ("  source: text\n  path: docs.jsonl\n", "5:3", "source: text needs data.tokenizer"),
    ("  source: text\n  path: docs.jsonl\n  label: y\n  tokenizer: {train: {vocab_size: 300}}\n", "7:10",
     "`label` does not apply to source text"),
    ("  source: csv\n  path: docs.csv\n  block_size: 64\n", "7:15", "`block_size` does not apply to source csv"),
    ("  source: text\n  path: docs.jsonl\n  tokenizer: {train: {model: wordpiece, vocab_size: 300}}\n", "7:14",
     "source: text trains a byte-level BPE"),
    ("  source: text\n  path: docs.jsonl\n  tokenizer: {train: {vocab_size: 100}}\n", "7:14",
     "vocab_size 100 is below 257"),
    ("  source: text\n  path: docs.jsonl\n  text: content\n  tokenizer: {train: {vocab_size: 300}}\n", "7:9",
     "data.text: line 1 of 'docs.jsonl' has no key 'content'"),
    ("  source: text\n  path: book.txt\n  text: body\n  tokenizer: {train: {vocab_size: 300}}\n", "7:9",
     "a .txt corpus has no keys"),
    ("  source: text\n  path: docs.jsonl\n  block_size: 1\n  tokenizer: {train: {vocab_size: 300}}\n", "7:15",
     "data.block_size: Input should be greater than or equal to 2"),
], ids=["suffix", "no-tokenizer", "label", "block-size-for-csv", "wordpiece", "small-vocab", "missing-key",
        "txt-with-key", "block-size-1"])
def test_bad_corpus_fields_are_one_error_at_the_recipe_line(tmp_path, data, where, message):
    _docs(tmp_path, DOCS, "docs.jsonl")
    (tmp_path / "docs.csv").write_text("text,label\na,b\n")
    (tmp_path / "book.txt").write_text("one\n\ntwo\n")
    recipe = write_recipe(tmp_path, HEAD + "data:\n" + data + STAGES)
    result = zoo("validate", recipe)
    assert result.code == 2, result.text
    assert f"{recipe}:{where}:" in result.err and message in result.err, result.err
    assert "Traceback" not in result.text


def test_a_corpus_too_short_for_one_block_is_an_error_at_block_size(tmp_path):
    _docs(tmp_path, DOCS[:3])
    spec = {"source": "text", "path": "docs.jsonl", "text": "body", "block_size": 4096,
            "tokenizer": {"train": {"vocab_size": 300}}}
    with pytest.raises(datasets.DataError, match="fewer than 4096 tokens") as e:
        datasets.load_split(spec, tmp_path, "val")
    assert e.value.field == ("data", "block_size")
