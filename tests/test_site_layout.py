"""The site at a laptop's and a phone's width: wide tables and code blocks scroll sideways inside
their own box, no table cell breaks a word in the middle, and the screenshots that show it (1280
and 390 px, taken with headless Chromium from the built site) are committed.

Reads ``docs/stylesheets/extra.css`` and ``mkdocs.yml``; needs no browser and no site build. How
the screenshots were taken: ``docs/screenshots/README.md``.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSS = ROOT / "docs" / "stylesheets" / "extra.css"
SCREENSHOTS = ROOT / "docs" / "screenshots"


def declarations(css: str) -> dict[str, dict[str, str]]:
    """``{selector: {property: value}}`` of every rule, ``@media`` blocks included (a selector
    list counts for each of its selectors; a later rule overrides an earlier one)."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.DOTALL)
    css = re.sub(r"@media[^{]*\{", "", css)
    rules: dict[str, dict[str, str]] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css):
        props = {name.strip(): value.strip() for name, _, value in
                 (d.partition(":") for d in body.split(";") if ":" in d)}
        for selector in selectors.split(","):
            rules.setdefault(" ".join(selector.split()), {}).update(props)
    return rules


def check_layout(css: str) -> None:
    rules = declarations(css)
    table = ".md-typeset table:not([class])"
    assert rules[".md-typeset__scrollwrap"]["overflow-x"] == "auto", "wide tables must scroll"
    assert rules[".md-typeset pre > code"]["overflow-x"] == "auto", "code blocks must scroll"
    assert rules[".md-typeset pre > code"]["white-space"] == "pre"
    for cell in ("td", "th"):
        assert rules[f"{table} {cell}"]["word-break"] == "normal", cell
        assert rules[f"{table} {cell}"]["overflow-wrap"] == "normal", cell
    assert rules[f"{table} th"]["min-width"] == "0", "Material's 5rem header minimum"
    assert rules[f'{table} td[style*="right"]']["white-space"] == "nowrap", "numbers"
    assert rules[".md-typeset img"]["max-width"] == "100%"


def test_the_stylesheet_scrolls_wide_tables_and_code_and_keeps_words_whole() -> None:
    check_layout(CSS.read_text(encoding="utf-8"))


def test_a_stylesheet_without_scrolling_code_blocks_is_caught() -> None:
    css = CSS.read_text(encoding="utf-8")
    with pytest.raises((AssertionError, KeyError)):
        check_layout(css.replace("overflow-x: auto;\n  white-space: pre;", "white-space: pre;"))
    with pytest.raises((AssertionError, KeyError)):
        check_layout(css.replace("min-width: 0;", ""))


def test_the_stylesheet_is_registered() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    extra = config[config.index("extra_css:"):].split("\n\n")[0]
    assert "  - stylesheets/extra.css" in extra.splitlines()


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", head[16:24])
    return width, height


@pytest.mark.parametrize("page", ["index", "e2e-cuda", "e2e"])
def test_each_checked_page_has_a_small_screenshot_at_both_widths(page: str) -> None:
    for width in (1280, 390):
        shot = SCREENSHOTS / f"{page}-{width}.png"
        assert shot.stat().st_size < 300_000, shot
        shown, _ = _png_size(shot)
        # the 1280 px shots are stored at three quarters of their size
        assert shown == (width if width == 390 else width * 3 // 4), (shot, shown)
