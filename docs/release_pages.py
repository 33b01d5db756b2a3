"""The pages' generated texts, made from the vLLM catalogue and the command line's parser and
written into the pages.

A page holds each one between two markers, HTML comments that GitHub's view of the page leaves
out, so the raw Markdown reads as the site does:

- ``<!-- generated: table -->``: the vLLM guide's table, one row per supported release (its
  install commands and the draft paths draftmeta serves);
- ``<!-- generated: install -->``: the Install page's section per release (heading, why it
  installs that way, the commands), README's release (``DEFAULT_RELEASE``) first, then oldest
  first;
- ``<!-- generated: coverage -->``: the first two lines ``draftmeta coverage`` prints, with the
  supported releases as it lists them;
- ``<!-- generated: cli -->``: the command-line reference, every command and option with its
  default (:func:`draftmeta.cli.markdown_reference`);

each followed by its text and ``<!-- /generated -->``. The release texts come from the
catalogue's release modules (:func:`draftmeta.integrations.vllm.catalogue.releases`, each
release's ``install``). After a release module is added (or one's ``install`` changed, or a
command's option), one command rewrites every page, and ``--check`` (run by
``tests/test_docs_generated.py``) says which page is stale::

    python docs/release_pages.py --write    # regenerate the texts in README.md and docs/*.md
    python docs/release_pages.py --check    # exit 1 naming each page whose text is stale

As a mkdocs hook it regenerates the texts again when the site is built, so the site never
shows a stale one. The tests also expand the pages with :func:`expand` to check what a reader
gets (``tests/test_install_docs.py``, ``tests/test_one_file_release.py``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # this checkout's catalogue, not an installed copy's
    sys.path.insert(0, str(ROOT))

from draftmeta.integrations.vllm.catalogue import DEFAULT_RELEASE, releases  # noqa: E402
from draftmeta.integrations.vllm.catalogue.model import Release  # noqa: E402

MARKER = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->(?P<text>.*?)<!-- /generated -->",
                    re.S)
"""A generated text in a page: its name and its current text."""

OPENING = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->")
"""A generated text's opening marker (each needs its closing ``<!-- /generated -->``)."""

CLOSING = "<!-- /generated -->"
"""A generated text's closing marker."""

PAGES = ("README.md", "docs/*.md")
"""The pages that may hold generated texts, relative to the repository root."""


def release_table() -> str:
    """The vLLM guide's release table: release, install commands, draft paths served."""
    rows = ["| release | install, from a checkout ([Install](install.md) has every step) "
            "| draft paths draftmeta serves |", "|---|---|---|"]
    for r in releases():
        commands = [f"`{c}`" for c in r.install_commands()]
        joined = commands[0] if len(commands) == 1 else \
            f"{', '.join(commands[:-1])}, then {commands[-1]}"
        paths = ", ".join(p.replace("_", " ") for p in r.paths)
        rows.append(f"| {r.version} | {joined} | {paths} |")
    return "\n".join(rows)


def install_section(r: Release) -> str:
    """One release's section of the Install page."""
    title = f"### vLLM {r.version}" + (f" ({r.install.title})" if r.install.title else "")
    commands = [f"python3 -m venv {r.venv}", *r.install_commands(f"{r.venv}/bin/pip")]
    parts = [title, r.install.about, "```bash\n" + "\n".join(commands) + "\n```"]
    return "\n\n".join(p for p in parts if p)


def install_sections() -> str:
    """Every release's section, README's release first, then the others oldest first."""
    ordered = sorted(releases(), key=lambda r: r.version != DEFAULT_RELEASE)
    return "\n\n".join(install_section(r) for r in ordered)


def release_list() -> str:
    """The supported releases as ``draftmeta coverage`` prints them: ``0.32, 0.33, 0.34``."""
    return ", ".join(r.version for r in releases())


def coverage_head() -> str:
    """The first two lines ``draftmeta coverage`` prints with README's release installed and
    the plugin active, as a text block."""
    release = next(r for r in releases() if r.version == DEFAULT_RELEASE)
    return (f"```text\nvLLM {release.version}.0; catalogue {release.version} (supported: "
            f"{release_list()})\nplugin: active (installed=True, enabled=True): vLLM loads it "
            "in every process\n```")


def command_line() -> str:
    """The command-line reference: every command, option and default, from the parser."""
    from draftmeta.cli import markdown_reference

    return markdown_reference()


GENERATED = {"table": release_table, "install": install_sections, "coverage": coverage_head,
             "cli": command_line}
"""Each generated text's name and what makes it."""


def expand(markdown: str, page: str = "a page") -> str:
    """``markdown`` with every generated text made afresh (markers kept).

    Raises:
        ValueError: a marker names no generated text (the message lists the names), or an
            opening marker has no closing ``<!-- /generated -->``.
    """
    opened = len(OPENING.findall(markdown))
    closed = markdown.count(CLOSING)
    if opened != closed or opened != len(MARKER.findall(markdown)):
        raise ValueError(f"{page}: {opened} opening <!-- generated: NAME --> markers and "
                         f"{closed} closing {CLOSING} markers; each generated text needs both")

    def replace(match: re.Match[str]) -> str:
        make = GENERATED.get(match["name"])
        if make is None:
            raise ValueError(f"{page}: <!-- generated: {match['name']} --> names no generated "
                             f"text; use one of: {', '.join(GENERATED)}")
        return f"<!-- generated: {match['name']} -->\n\n{make()}\n\n{CLOSING}"

    return MARKER.sub(replace, markdown)


def without_generated(markdown: str) -> str:
    """``markdown`` with its generated texts left out (the markers kept): what was written by
    hand."""
    return MARKER.sub(lambda m: f"<!-- generated: {m['name']} -->{CLOSING}", markdown)


def pages(root: Path = ROOT) -> list[Path]:
    """Every page of :data:`PAGES` that holds a generated text."""
    found = [p for pattern in PAGES for p in sorted(root.glob(pattern))]
    return [p for p in found if OPENING.search(p.read_text())]


def stale(root: Path = ROOT) -> list[str]:
    """The pages (relative paths) whose generated texts differ from what the catalogue makes."""
    return [p.relative_to(root).as_posix() for p in pages(root)
            if expand(p.read_text(), p.name) != p.read_text()]


def main(argv: list[str] | None = None) -> int:
    """``--write``: regenerate every page's texts; ``--check``: exit 1 naming the stale ones."""
    import argparse

    parser = argparse.ArgumentParser(prog="python docs/release_pages.py",
                                     description="The generated texts of README.md and "
                                     "docs/*.md: releases from the vLLM catalogue, the command "
                                     "line from its parser.")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="regenerate them in the pages")
    action.add_argument("--check", action="store_true",
                        help="exit 1 naming each page whose generated text is stale")
    args = parser.parse_args(argv)
    if args.check:
        out_of_date = stale()
        for page in out_of_date:
            print(f"{page}: its generated texts are stale; run python docs/release_pages.py "
                  "--write", file=sys.stderr)
        return 1 if out_of_date else 0
    for page in pages():
        text = page.read_text()
        new = expand(text, page.name)
        if new != text:
            page.write_text(new)
            print(f"{page.relative_to(ROOT).as_posix()}: generated texts regenerated")
    return 0


def on_page_markdown(markdown: str, *, page: Any, **_: Any) -> str:
    """mkdocs' hook: a page's Markdown with its generated texts made afresh."""
    return expand(markdown, page.file.src_uri)


if __name__ == "__main__":
    raise SystemExit(main())
