"""The texts generated from the catalogue and the command line's parser are written into the
pages themselves, so the raw Markdown (what GitHub shows) reads as the site does, and they are
up to date (``python docs/release_pages.py --write`` regenerates them, ``--check`` names a stale
page); the overview's examples show what they print, as they print it."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.releases import release_pages

ROOT = Path(__file__).resolve().parents[1]


def test_every_generated_release_text_in_the_pages_is_up_to_date() -> None:
    pages = release_pages()
    assert {p.relative_to(ROOT).as_posix() for p in pages.pages()} == {
        "docs/cli.md", "docs/index.md", "docs/install.md", "docs/vllm.md"}
    assert pages.stale() == [], "run python docs/release_pages.py --write"


def test_no_page_asks_for_a_text_only_the_sites_build_would_write() -> None:
    # each marker closes over its text: none is left for the build alone to fill
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        for match in release_pages().MARKER.finditer(text):
            assert match["text"].strip(), f"{page.name}: {match['name']} is empty"


def _copy(tmp_path: Path) -> Path:
    for page in ("docs/index.md", "docs/install.md", "docs/vllm.md"):
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / page, tmp_path / page)
    return tmp_path


def test_a_page_whose_generated_text_was_edited_by_hand_is_stale(tmp_path: Path) -> None:
    # negative control
    root = _copy(tmp_path)
    vllm = root / "docs" / "vllm.md"
    assert release_pages().stale(root) == []
    vllm.write_text(vllm.read_text().replace("| 0.33 |", "| 0.33.1 |", 1))
    assert release_pages().stale(root) == ["docs/vllm.md"]


def test_a_marker_without_its_closing_marker_or_with_an_unknown_name_is_refused() -> None:
    pages = release_pages()
    with pytest.raises(ValueError, match="each generated text needs both"):
        pages.expand("<!-- generated: table -->\n\ntext\n", "page.md")
    with pytest.raises(ValueError, match="names no generated text; use one of"):
        pages.expand("<!-- generated: tabel -->\n<!-- /generated -->\n", "page.md")


def test_the_check_command_exits_1_on_a_stale_page_and_write_makes_it_current(
    tmp_path: Path,
) -> None:
    # the command as a contributor runs it, on a copy of the pages (its root is where it lies;
    # the catalogue is the installed draftmeta's)
    root = _copy(tmp_path)
    shutil.copy(ROOT / "docs" / "release_pages.py", root / "docs" / "release_pages.py")
    index = root / "docs" / "index.md"
    index.write_text(index.read_text().replace("(supported: ", "(supported: 0.31, ", 1))
    run = [sys.executable, "docs/release_pages.py"]
    check = subprocess.run([*run, "--check"], cwd=root, capture_output=True, text=True)
    assert check.returncode == 1 and "docs/index.md: its generated texts are stale" in check.stderr
    subprocess.run([*run, "--write"], cwd=root, check=True, capture_output=True)
    assert subprocess.run([*run, "--check"], cwd=root).returncode == 0
    assert index.read_text() == (ROOT / "docs" / "index.md").read_text()


def run_and_compare(page: str) -> list[tuple[str, str]]:
    """``(printed, shown)`` for each ```python block of ``page`` that a ```text block follows:
    what the block prints, its page's blocks run in order in one namespace as a script
    (``__main__``), and the text the page shows under it."""
    blocks = re.findall(r"```python\n(.*?)```(\s*(?:prints\s*)?```text\n(.*?)```)?", page, re.S)
    module = types.ModuleType("__main__")
    main = sys.modules["__main__"]
    sys.modules["__main__"] = module  # dataclasses look their module up
    pairs = []
    try:
        for code, follows, shown in blocks:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                exec(compile(code, "overview.py", "exec", dont_inherit=True), module.__dict__)
            if follows:
                pairs.append((printed.getvalue(), shown))
    finally:
        sys.modules["__main__"] = main
    return pairs


def test_the_overviews_examples_show_what_they_print() -> None:
    pairs = run_and_compare((ROOT / "docs" / "index.md").read_text())
    assert len(pairs) == 2
    for printed, shown in pairs:
        assert printed == shown, "docs/index.md: paste what the example above prints"


def test_an_example_whose_shown_output_is_stale_is_caught() -> None:
    # negative control: the page's first example with one line of its output changed
    page = (ROOT / "docs" / "index.md").read_text()
    stale = page.replace("def draft_update_", "def draft_update_old_", 1)
    assert stale != page
    printed, shown = run_and_compare(stale)[0]
    assert printed != shown
