"""Writing SVG (and HTML) by hand, safely: every text and attribute value escaped, coordinates
rounded, no style attributes (the site's Content-Security-Policy allows only its style sheet)."""

from __future__ import annotations

import html

# Tableau 10: distinct for the colour-blind as far as ten colours go
PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac"]
CHAR_WIDTH = 6.4  # px per character of an 11px sans-serif label (an estimate used to keep labels apart)


def esc(value) -> str:
    """Text or an attribute value, escaped for HTML and SVG (quotes included)."""
    return html.escape(str(value), quote=True)


def coord(value: float) -> str:
    """A coordinate with at most one decimal, without a trailing '.0'."""
    text = f"{value:.1f}"
    return text[:-2] if text.endswith(".0") else text


def attrs(**values) -> str:
    """` name="value"` pairs (underscores become dashes; None is left out; floats are coordinates)."""
    out = []
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = coord(value)
        out.append(f' {name.rstrip("_").replace("_", "-")}="{esc(value)}"')
    return "".join(out)


def element(tag: str, content: str = "", **values) -> str:
    """`<tag attrs>content</tag>` (`content` is already markup; escape text with `esc`)."""
    return f"<{tag}{attrs(**values)}>{content}</{tag}>"


def text_width(text: str) -> float:
    return CHAR_WIDTH * len(text) + 2


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]
