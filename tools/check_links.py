"""Dead relative links in Markdown pages, as GitHub renders them (``tests/test_links.py``).

Every link and image of a page whose target is relative (no scheme, not ``mailto:``) must name
a file or folder that exists, and its ``#anchor``, if any, a heading of the target page (or of
the page itself, for ``#anchor`` alone) as GitHub slugs it: the heading's text lower-cased,
everything but letters, digits, spaces, ``-`` and ``_`` dropped, spaces made ``-``, and a
repeated slug numbered (``-1``, ``-2``). Ids written in HTML (``<a id="x">``, ``name="x"``) count
too. Links inside code are not links. Parsed with markdown-it-py (CommonMark), so what counts as
a link or a heading is what a renderer sees.

    python tools/check_links.py README.md docs/*.md   # exit 1 listing each dead link
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from urllib.parse import unquote

from markdown_it import MarkdownIt
from markdown_it.token import Token

__all__ = ["anchors", "dead_links", "github_slug", "links"]

_PARSER = MarkdownIt("commonmark").enable("table")
_HTML_ID = re.compile(r"""<[^>]*\s(?:id|name)=["']([^"']+)["']""")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading whose rendered text is ``heading``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _text(inline: Token) -> str:
    """The rendered text of a heading's inline token (code spans' contents included)."""
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))


@cache
def _anchors(path: Path) -> frozenset[str]:
    tokens = _PARSER.parse(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    found: set[str] = set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            slug = github_slug(_text(tokens[i + 1]))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        if token.type in ("html_block", "html_inline", "inline"):
            sources = [token.content] if token.type != "inline" else \
                [c.content for c in token.children or () if c.type == "html_inline"]
            for source in sources:
                found.update(_HTML_ID.findall(source))
    return frozenset(found)


def anchors(path: Path) -> frozenset[str]:
    """The anchors of a Markdown page as GitHub renders it."""
    return _anchors(path.resolve())


def links(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, target)`` of every link and image of a Markdown page."""
    for token in _PARSER.parse(path.read_text(encoding="utf-8")):
        if token.type != "inline":
            continue
        line = (token.map[0] + 1) if token.map else 0
        for child in token.children or ():
            target = child.attrGet("href") if child.type == "link_open" else \
                child.attrGet("src") if child.type == "image" else None
            if isinstance(target, str):
                yield line, target


def _relative(target: str) -> bool:
    return not re.match(r"^[a-zA-Z][\w+.-]*:", target) and not target.startswith("//")


def dead_links(pages: Iterable[Path]) -> list[str]:
    """``page:line: target (why)`` for every dead relative link of ``pages``."""
    dead = []
    for page in pages:
        for line, target in links(page):
            if not _relative(target):
                continue
            where, _, anchor = target.partition("#")
            destination = (page.parent / unquote(where)).resolve() if where else page.resolve()
            if not destination.exists():
                dead.append(f"{page}:{line}: {target} (no such file)")
            elif anchor and destination.is_dir():
                dead.append(f"{page}:{line}: {target} (an anchor into a folder)")
            elif anchor and destination.suffix == ".md" and \
                    unquote(anchor) not in anchors(destination):
                dead.append(f"{page}:{line}: {target} (no heading or id {anchor!r} in "
                            f"{destination.name})")
    return dead


def main(argv: list[str] | None = None) -> int:
    """Check the pages named on the command line; exit 1 listing each dead link."""
    pages = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not pages:
        print("usage: python tools/check_links.py PAGE.md ...", file=sys.stderr)
        return 2
    dead = dead_links(pages)
    for entry in dead:
        print(entry)
    print(f"{len(dead)} dead links in {len(pages)} pages", file=sys.stderr)
    return 1 if dead else 0


if __name__ == "__main__":
    raise SystemExit(main())
