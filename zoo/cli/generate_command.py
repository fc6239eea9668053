"""`zoo generate NAME[@VERSION|@TAG] "prompt"`: a continuation streamed from a generative build.

Only parses arguments, calls `zoo.api.generate`, and prints: the continuation on stdout as its
tokens come, then one line on stderr with the figures (new tokens, why it stopped, prefill ms,
decode tokens/s, the build). With --json, one document at the end (docs/cli-json.md).
torch and transformers are never imported: onnxruntime runs the build, `tokenizers` reads its
tokenizer.json.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from zoo.cli.completion import complete_refs, complete_remotes


def register(app: typer.Typer) -> None:
    app.command("generate")(generate_cmd)


def generate_cmd(
    ref: str = typer.Argument(..., help="NAME, NAME@VERSION or NAME@TAG of a generative (text-generation) model.",
                              show_default=False, autocompletion=complete_refs),
    prompt: str = typer.Argument(..., help="The text to continue.", show_default=False),
    build: Optional[str] = typer.Option(None, "--build", "-b",
                                        help="Build to run [default: the one `zoo pull` chooses among those "
                                             "onnxruntime runs]."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", "-n", min=1, help="Stop after this many new tokens."),
    sample: bool = typer.Option(False, "--sample", help="Draw each token (seeded) instead of taking the most likely."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="With --sample: divide the logits by "
                                                                           "this [default: 1.0]."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="With --sample: only the K most likely tokens."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="With --sample: only the most likely tokens whose "
                                                               "probabilities add up to P [default: 1.0]."),
    seed: Optional[int] = typer.Option(None, "--seed", help="With --sample: the generator's seed (the same seed, "
                                                           "the same text) [default: 0]."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1,
                                          help="onnxruntime's intra-op threads [default: onnxruntime's choice]."),
    remote: Optional[str] = typer.Option(None, "--remote", "-r", metavar="REMOTE", autocompletion=complete_remotes,
                                         help="Pull from this remote when the local zoo lacks the build: a `zoo "
                                              "remote` name, a folder or a URL."),
    offline: bool = typer.Option(False, "--offline", help="Use only the local zoo; never touch the network."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document at the end instead of streaming "
                                                       "(docs/cli-json.md)."),
) -> None:
    """Continue a prompt with a generative build, streaming the text as it comes; prints the decode
    speed (tokens/s) and the prefill time at the end, on stderr."""
    from zoo import api
    from zoo.cli.jsonout import emit

    def show(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    result = api.generate(ref, prompt, build=build, max_new_tokens=max_new_tokens, sample=sample,
                          temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, threads=threads,
                          remote=remote, offline=offline, on_text=None if as_json else show)
    if as_json:
        emit(result)
        return
    print(flush=True)
    print(figures(result), file=sys.stderr, flush=True)


def figures(result: dict) -> str:
    """The line after a continuation: `64 new tokens (length) · prefill 1.92 ms · decode 812 tokens/s · REF [BUILD]`."""
    from zoo.formatting import ms

    rate = result["decode_tokens_per_s"]
    speed = f"decode {rate:.3g} tokens/s" if rate is not None and rate < 1000 else \
        f"decode {rate:.0f} tokens/s" if rate is not None else "decode - tokens/s"
    stop = "end of sequence" if result["finish_reason"] == "eos" else "max new tokens"
    return (f"{result['new_tokens']} new tokens ({stop}) · prefill {ms(result['prefill_ms'])} ms · {speed} · "
            f"{result['ref']} [{result['build']}]")
