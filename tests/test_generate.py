"""`zoo generate NAME[@VERSION] "prompt"` and `zoo.generate` (issue #35) on a published generative
version: onnxruntime-genai's fp32 and int4 builds of a tiny random Llama (tests/decoder_models.py,
tests/generative_zoo.py) in the local zoo. The greedy continuation is transformers' own and
onnxruntime-genai's on the pulled build, streamed as it comes, with tokens/s and prefill ms at the
end; sampling is seeded; the build is `zoo pull`'s choice or --build; the refusals are one line
with their exit code; the command imports neither torch nor transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="the tiny Llama is built with transformers (torch extra)")

import generative_zoo  # noqa: E402
import zoo.api as zoo  # noqa: E402
from cli_helpers import zoo as zoo_cli  # noqa: E402
from decoder_models import genai_build, tiny_llama_folder  # noqa: E402
from generative_zoo import REF  # noqa: E402
from registry_servers import make_staging  # noqa: E402
from zoo.errors import InvalidInput, MissingExtra  # noqa: E402
from zoo.registry.store import LocalZoo  # noqa: E402

PROMPT = "The function returns"
TIMINGS = ("prefill_ms", "decode_tokens_per_s")


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """(the Hugging Face folder, {build name: the builder's folder}) of one tiny Llama."""
    base = tmp_path_factory.mktemp("llama")
    hf = tiny_llama_folder(base / "hf")
    return hf, {"cpu-fp32": genai_build(hf, base / "fp32"), "cpu-int4": genai_build(hf, base / "int4", "int4")}


@pytest.fixture
def published(builds, tmp_path):
    """The version in this test's local zoo (conftest's ZOO_HOME, which the subprocesses see)."""
    return generative_zoo.publish(builds[1], tmp_path / "staging")


def _hf_greedy(hf, prompt_ids, new):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(hf)).eval()
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=new, do_sample=False, eos_token_id=None,
                         pad_token_id=0, attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    return out[0, len(prompt_ids):].tolist()


def _json(*args):
    r = zoo_cli("generate", *args, "--json")
    assert r.code == 0, r.text
    assert r.err == ""
    return json.loads(r.out)


def test_greedy_generation_is_transformers_and_onnxruntime_genais_continuation(builds, published):
    import onnxruntime_genai as og

    result = zoo.generate(REF, PROMPT, build="cpu-fp32", max_new_tokens=20)
    assert result["build"] == "cpu-fp32"
    assert result["tokens"] == _hf_greedy(builds[0], result["prompt_tokens"], 20)
    assert len(set(result["tokens"])) > 3 and result["new_tokens"] == 20 and result["finish_reason"] == "length"
    # onnxruntime-genai runs the pulled build's folder as it is, to the same tokens
    folder = os.path.dirname(published.is_materialized(published.resolve(REF), "cpu-fp32"))
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(result["prompt_tokens"]) + 20, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(result["prompt_tokens"])
    while not generator.is_done():
        generator.generate_next_token()
    assert [int(t) for t in generator.get_sequence(0)] == result["prompt_tokens"] + result["tokens"]
    # the text is the tokenizer's decoding of the prompt and the new tokens, past the prompt's
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    assert tokenizer.encode(PROMPT).ids == result["prompt_tokens"]
    full = tokenizer.decode(result["prompt_tokens"] + result["tokens"], skip_special_tokens=True)
    assert full == PROMPT + result["text"]


def test_the_default_build_is_the_one_zoo_pull_chooses(published):
    """Both builds record verify's decode-step latency (tests/generative_zoo.py): the int4 one's is
    the lower, so `zoo pull` takes it, and so does generate."""
    assert zoo.generate(REF, PROMPT, max_new_tokens=2)["build"] == zoo.pull(REF)["build"] == "cpu-int4"


def test_the_command_streams_the_text_then_prints_its_speed(published):
    r = zoo_cli("generate", REF, PROMPT, "--max-new-tokens", "12")
    assert r.code == 0, r.text
    api = zoo.generate(REF, PROMPT, max_new_tokens=12)
    assert r.out == api["text"] + "\n" and len(api["text"]) > 5
    (line,) = r.err.splitlines()
    assert line.startswith("12 new tokens (max new tokens) · prefill ") and " ms · decode " in line
    assert line.endswith(f" tokens/s · {REF} [cpu-int4]")


@pytest.mark.parametrize("sampling", [{}, {"sample": True, "seed": 3}, {"sample": True, "seed": 5, "temperature": 2.0}])
def test_on_text_gets_the_text_piece_by_piece_as_tokens_come(published, sampling):
    pieces = []
    result = zoo.generate(REF, PROMPT, max_new_tokens=30, on_text=pieces.append, **sampling)
    assert len(pieces) > 5 and "".join(pieces) == result["text"]


def test_json_is_one_document_equal_to_the_api_but_for_timings(published):
    doc = _json(REF, PROMPT, "-n", "8")
    api = zoo.generate(REF, PROMPT, max_new_tokens=8)
    assert doc["schema_version"] == 1
    assert {k: v for k, v in doc.items() if k not in (*TIMINGS, "schema_version")} == \
        {k: v for k, v in api.items() if k not in TIMINGS}
    assert doc["prefill_ms"] > 0 and doc["decode_tokens_per_s"] > 0 and doc["sampling"] is None


def test_seeded_sampling_gives_the_same_text_for_a_seed_and_another_for_another(published):
    first = _json(REF, PROMPT, "-n", "16", "--sample", "--seed", "7", "--temperature", "1.5")
    again = _json(REF, PROMPT, "-n", "16", "--sample", "--seed", "7", "--temperature", "1.5")
    other = _json(REF, PROMPT, "-n", "16", "--sample", "--seed", "8", "--temperature", "1.5")
    assert first["tokens"] == again["tokens"] and first["tokens"] != other["tokens"]
    assert first["sampling"] == {"temperature": 1.5, "top_k": None, "top_p": 1.0, "seed": 7}
    top1 = zoo.generate(REF, PROMPT, max_new_tokens=16, sample=True, top_k=1, seed=7)
    assert top1["tokens"] == zoo.generate(REF, PROMPT, max_new_tokens=16)["tokens"]


def test_build_chooses_another_build(published):
    doc = _json(REF, PROMPT, "-n", "6", "--build", "cpu-fp32")
    assert doc["build"] == "cpu-fp32" and doc["new_tokens"] == 6
    assert doc["tokens"] == zoo.generate(REF, PROMPT, build="cpu-fp32", max_new_tokens=6)["tokens"]


def test_generation_stops_at_the_builds_end_of_sequence_token(builds, tmp_path):
    """The build's genai_config.json names the end: here the id greedy decoding reaches at its 6th token."""
    generative_zoo.publish({"cpu-fp32": builds[1]["cpu-fp32"]}, tmp_path / "staging-free", name="free")
    free = zoo.generate("free", PROMPT, max_new_tokens=20)["tokens"]
    k = next(i for i in range(5, 20) if free[i] not in free[:i])
    changed = tmp_path / "changed"
    changed.mkdir()
    for f in os.listdir(builds[1]["cpu-fp32"]):
        (changed / f).write_bytes((builds[1]["cpu-fp32"] / f).read_bytes())
    config = json.loads((changed / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = free[k]
    (changed / "genai_config.json").write_text(json.dumps(config))
    generative_zoo.publish({"cpu-fp32": changed}, tmp_path / "staging-eos", name="stops")
    result = zoo.generate("stops", PROMPT, max_new_tokens=20)
    assert result["tokens"] == free[:k + 1] and result["finish_reason"] == "eos"
    r = zoo_cli("generate", "stops", PROMPT, "-n", "20")
    assert r.code == 0 and r.err.startswith(f"{k + 1} new tokens (end of sequence)")


def test_the_command_imports_neither_torch_nor_transformers(published):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "zoo", "generate", REF, PROMPT, "-n", "4"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "onnxruntime" in imported and "tokenizers" in imported
    assert not imported & {"torch", "transformers", "onnxruntime_genai"}, imported & {"torch", "transformers"}


# ---- refusals ------------------------------------------------------------------------------------
def test_a_model_that_is_not_generative_is_refused(tmp_path):
    LocalZoo().publish(make_staging(tmp_path / "s", name="lenet", version="1.0.0"))
    r = zoo_cli("generate", "lenet@1.0.0", PROMPT)
    assert r.code == 2 and r.out == ""
    assert "not a generative model" in r.err or "not a decoder" in r.err, r.err


def test_a_build_without_its_tokenizer_is_refused_before_anything_runs(builds, tmp_path):
    generative_zoo.publish({"cpu-fp32": builds[1]["cpu-fp32"]}, tmp_path / "s", name="untokenized",
                           sidecars=("model.onnx.data", "genai_config.json"))
    r = zoo_cli("generate", "untokenized", PROMPT, "--json")
    assert r.code == 2
    error = json.loads(r.out)["error"]
    assert error["type"] == "InvalidInput" and "ships no tokenizer.json" in error["message"]
    assert "untokenized@1.0.0 build cpu-fp32" in error["message"]


def test_an_unknown_model_is_exit_2_with_a_did_you_mean(published):
    r = zoo_cli("generate", "tiny-lama", PROMPT)
    assert r.code == 2 and "tiny-llama" in r.err


def test_sampling_options_without_sample_are_refused(published):
    r = zoo_cli("generate", REF, PROMPT, "--temperature", "0.7")
    assert r.code == 2 and "sampling only" in r.err and "--sample" in r.err
    with pytest.raises(InvalidInput, match="top_k must be a positive integer"):
        zoo.generate(REF, PROMPT, sample=True, top_k=0)


def test_a_continuation_past_the_context_length_is_refused_with_the_room_left(published):
    r = zoo_cli("generate", REF, PROMPT, "--max-new-tokens", "1000")
    assert r.code == 2 and "context length of 256 tokens" in r.err and "at most 252 new tokens" in r.err


def test_a_tampered_tokenizer_is_an_integrity_error(published):
    """A byte of the pulled tokenizer.json changed after a first generation placed it: the next
    one checks it against its sha256 (as `zoo pull` does) and refuses, exit 4."""
    assert zoo_cli("generate", REF, PROMPT, "-n", "2", "--build", "cpu-fp32").code == 0
    manifest = published.resolve(REF)
    path = published.is_materialized(manifest, "cpu-fp32")
    tokenizer = os.path.join(os.path.dirname(path), "tokenizer.json")
    os.chmod(tokenizer, 0o644)
    with open(tokenizer, "r+b") as f:
        f.seek(100)
        f.write(b"X")
    r = zoo_cli("generate", REF, PROMPT, "-n", "4", "--build", "cpu-fp32")
    assert r.code == 4 and "does not match its sha256" in r.err, r.text


def test_without_tokenizers_the_install_hint_is_given_tokenizers_hidden(published, tmp_path):
    """`tokenizers` hidden from the import system (a stand-in package that fails to import, first on
    the path): the missing extra is exit 2 with the pip command, before anything is pulled."""
    hidden = tmp_path / "hidden" / "tokenizers"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    r = zoo_cli("generate", REF, PROMPT, env={"PYTHONPATH": os.pathsep.join([str(hidden.parent),
                                                                             os.environ.get("PYTHONPATH", "")])})
    assert r.code == 2 and "tokenizers" in r.err and "pip install 'zoo-onnx[text]'" in r.err, r.err
    with pytest.raises(MissingExtra):  # the same class through the API, the package hidden here
        saved = sys.modules.get("tokenizers")
        sys.modules["tokenizers"] = None
        try:
            zoo.generate(REF, PROMPT)
        finally:
            if saved is not None:
                sys.modules["tokenizers"] = saved
            else:
                del sys.modules["tokenizers"]


def test_a_build_only_a_remote_holds_is_pulled_checked_and_run(published, tmp_path):
    """A folder remote holds the version; a fresh zoo generates from it with --remote (the files
    downloaded and sha256-checked by the pull), then offline from what it placed."""
    remote = tmp_path / "remote-zoo"
    zoo.push(REF, str(remote))
    fresh = {"ZOO_HOME": str(tmp_path / "fresh-home")}
    offline = zoo_cli("generate", REF, PROMPT, "-n", "4", "--offline", env=fresh)
    assert offline.code == 2, offline.text  # the fresh zoo has no such model yet
    r = zoo_cli("generate", REF, PROMPT, "-n", "8", "--remote", str(remote), "--json", env=fresh)
    assert r.code == 0, r.text
    doc = json.loads(r.out)
    assert doc["tokens"] == zoo.generate(REF, PROMPT, max_new_tokens=8)["tokens"]
    again = zoo_cli("generate", REF, PROMPT, "-n", "8", "--offline", "--json", env=fresh)
    assert again.code == 0 and json.loads(again.out)["tokens"] == doc["tokens"]
