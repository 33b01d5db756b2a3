"""The built site: nothing loaded from an outside host, diagrams rendered by the vendored
Mermaid, the generated command-line page complete, the changelog included.

One strict ``mkdocs build`` (about 20 s) into a temporary folder; skipped where the docs extra
is not installed (``pip install -e '.[docs]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="needs the docs extra (pip install -e '.[docs]')",
)

_TAG = re.compile(r"<(?:link|script)\b[^>]*>", re.IGNORECASE)
_URL = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.IGNORECASE)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built strictly from this checkout."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def test_no_page_loads_a_stylesheet_script_or_font_from_another_host(site: Path) -> None:
    outside = {
        (page.relative_to(site).as_posix(), tag)
        for page in _pages(site)
        for tag in _TAG.findall(page.read_text(encoding="utf-8"))
        if _URL.search(tag)
    }
    assert outside == set()


def test_every_page_with_a_diagram_loads_the_vendored_mermaid(site: Path) -> None:
    # Material fetches mermaid from a CDN unless a page already loaded it
    with_diagrams = [page for page in _pages(site)
                     if 'class="mermaid"' in page.read_text(encoding="utf-8")]
    assert with_diagrams, "no page has a Mermaid diagram"
    for page in with_diagrams:
        scripts = re.findall(r'<script src="([^"]+)"', page.read_text(encoding="utf-8"))
        assert any(s.endswith("assets/mermaid/mermaid.min.js") for s in scripts), page
    assert (site / "assets" / "mermaid" / "mermaid.min.js").stat().st_size > 1_000_000
    assert (site / "assets" / "mermaid" / "LICENSE").exists()


def test_the_command_line_page_has_every_command_and_option_of_the_parser(site: Path) -> None:
    from draftmeta.cli import parser

    page = (site / "cli" / "index.html").read_text(encoding="utf-8")
    top = parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        assert f'<h2 id="draftmeta-{name}">draftmeta {name}' in page, name
        for action in p._actions:
            for option in action.option_strings:
                assert f"<code>{option}" in page or f", {option}" in page, (name, option)


def test_the_changelog_is_on_the_site(site: Path) -> None:
    page = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    headings = re.findall(r"^##+ (.+)$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"),
                          re.MULTILINE)
    assert '<h1 id="changelog">Changelog' in page and headings
    for heading in headings:
        assert f">{heading}<" in page, heading
