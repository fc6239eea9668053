"""A model card (the version's README.md: untrusted markdown) as safe HTML.

markdown-it-py renders it with raw HTML off, so ``<script>`` in a card is shown as text. Links and
images stay only where `link_for` maps them to a file the site holds (a relative link to one of
the version's copied files); anything else (an external URL, a file the site does not copy) is
shown as text beside what it was attached to, so the site never points outside itself.
"""

from __future__ import annotations

from typing import Callable


def strip_front_matter(text: str) -> str:
    """The card without its YAML front matter (the Hub's metadata block between ``---`` lines)."""
    if not text.startswith("---\n"):
        return text
    end = text.find("\n---\n", 4)
    return text if end < 0 else text[end + 5:]


def render_card(text: str, link_for: Callable[[str], str | None]) -> str:
    """HTML for the markdown `text`; `link_for(url)` is the site's href for a link or image URL, or None."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    tokens = md.parse(strip_front_matter(text))
    for token in tokens:
        if token.type == "inline" and token.children:
            token.children = _keep_site_links(token.children, link_for)
    return md.renderer.render(tokens, md.options, {})


def _keep_site_links(children: list, link_for) -> list:
    from markdown_it.token import Token

    out = []
    open_links: list[str | None] = []  # per open link: the URL to show after its text when dropped
    for token in children:
        if token.type == "link_open":
            url = str(token.attrGet("href") or "")
            href = link_for(url)
            if href is None:
                open_links.append(None if token.info == "auto" else url)  # an autolink's text is its URL already
                continue
            token.attrs = {"href": href}
            open_links.append("")
        elif token.type == "link_close":
            dropped = open_links.pop() if open_links else ""
            if dropped != "":
                if dropped:
                    out.append(_text(Token, f" ({dropped})"))
                continue
        elif token.type == "image":
            url = str(token.attrGet("src") or "")
            src = link_for(url)
            if src is None:
                alt = token.content or "image"
                out.append(_text(Token, f"[{alt}: {url}]"))
                continue
            token.attrs = {"src": src, "alt": token.content or ""}
        out.append(token)
    return out


def _text(token_class, content: str):
    token = token_class("text", "", 0)
    token.content = content
    return token
