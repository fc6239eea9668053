"""A generative build's tokenizer.json, read as data with Hugging Face `tokenizers` (the ``text``
extra, imported when used), and the text of generated tokens as they come.

The file is a pulled file: it is read within a size bound as a regular file (never a link or a
device, `zoo.files.read_regular`) and parsed by `tokenizers` from its JSON text; nothing in a build
is imported or run. `TextStream` turns token ids into text one at a time the way the tokenizer's
decoder decodes them all at once after the prompt (a character split over several byte-level
tokens appears once it is whole; the first new token's spacing is the prompt's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from zoo.errors import InvalidInput, MissingExtra

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_MAX_BYTES = 64 << 20  # the largest vocabularies' tokenizer.json are tens of MB
TEXT_EXTRA = "pip install 'zoo-onnx[text]'"


def require_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise MissingExtra("generating text needs Hugging Face `tokenizers` (the build's tokenizer.json), which is "
                           "not installed", hint=f"{TEXT_EXTRA} (the 'text' extra)") from None
    return tokenizers


def load_tokenizer(path: Path) -> Any:
    """A ``tokenizers.Tokenizer`` from tokenizer.json at `path`; InvalidInput naming the file for
    one that is missing, too large, not a regular file or not a tokenizer."""
    from zoo.files import NotARegularFile, read_regular

    tokenizers = require_tokenizers()
    try:
        data = read_regular(path, TOKENIZER_MAX_BYTES)
    except FileNotFoundError:
        raise InvalidInput(f"{path} does not exist", hint="a generative build ships its tokenizer.json beside its "
                                                          "model file") from None
    except NotARegularFile:
        raise InvalidInput(f"{path} is not a regular file") from None
    if len(data) > TOKENIZER_MAX_BYTES:
        raise InvalidInput(f"{path} is larger than {TOKENIZER_MAX_BYTES >> 20} MiB: not a tokenizer.json zoo reads")
    try:
        return tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # tokenizers raises a plain Exception for JSON it cannot read as a tokenizer
        raise InvalidInput(f"{path} is not a tokenizer `tokenizers` can read: {e}") from None


def encode(tokenizer: Any, text: str) -> list[int]:
    """The token ids of `text`, with the special tokens the tokenizer's post-processor adds (a BOS)."""
    ids = tokenizer.encode(text).ids
    if not ids:
        raise InvalidInput("the prompt is empty once tokenized", hint="give a prompt of at least one token")
    return list(ids)


class TextStream:
    """The text of new tokens after `prompt_ids`, one token at a time, special tokens skipped.

    The text is what the tokenizer decodes of the prompt and the new tokens together, past the
    prompt's own text (so a first token's leading space is kept, as a SentencePiece decoder would
    drop it decoding the new tokens alone); a piece is given out once it does not end in an
    incomplete character (U+FFFD), so the pieces and `finish` join to `text()`."""

    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._prompt = [int(t) for t in prompt_ids]
        self._base = tokenizer.decode(self._prompt, skip_special_tokens=True)
        self._new: list[int] = []
        self._given = ""

    def text(self) -> str:
        """The continuation's text so far."""
        full = self._tokenizer.decode(self._prompt + self._new, skip_special_tokens=True)
        if full.startswith(self._base):
            return full[len(self._base):]
        return self._tokenizer.decode(self._new, skip_special_tokens=True)

    def step(self, token: int) -> str:
        """The new text once `token` is added ('' while a character is incomplete)."""
        self._new.append(int(token))
        text = self.text()
        if text.endswith("\ufffd") or not text.startswith(self._given):
            return ""
        piece, self._given = text[len(self._given):], text
        return piece

    def finish(self) -> str:
        """What is left to give out at the end (an incomplete character as U+FFFD)."""
        text = self.text()
        if not text.startswith(self._given):
            return ""
        piece, self._given = text[len(self._given):], text
        return piece
