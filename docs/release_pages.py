"""The site's release texts, generated from the vLLM catalogue at build time (a mkdocs hook).

A page asks for one with a marker, an HTML comment that GitHub's view of the page leaves out:

- ``<!-- releases: table -->``: the vLLM guide's table, one row per supported release (its
  install commands and the draft paths draftmeta serves);
- ``<!-- releases: install -->``: the Install page's section per release (heading, why it installs
  that way, the commands), README's release (``DEFAULT_RELEASE``) first, then oldest first;
- ``<!-- releases: list -->``: the supported releases, comma-separated, as ``draftmeta
  coverage`` prints them.

Everything comes from the catalogue's release modules
(:func:`draftmeta.integrations.vllm.catalogue.releases`, each release's ``install``), so a
release added as one module appears on every page with nothing else edited. The tests expand
the pages with :func:`expand` and check what a reader gets (``tests/test_install_docs.py``,
``tests/test_one_file_release.py``).
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

MARKER = re.compile(r"<!-- releases: (?P<name>[\w-]+) -->")
"""Where a page asks for a generated text."""


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
    title = f"## vLLM {r.version}" + (f" ({r.install.title})" if r.install.title else "")
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


GENERATED = {"table": release_table, "install": install_sections, "list": release_list}
"""Each marker's name and what it is replaced with."""


def expand(markdown: str, page: str = "a page") -> str:
    """``markdown`` with every marker replaced by its text.

    Raises:
        ValueError: a marker names no generated text (the message lists the names).
    """

    def replace(match: re.Match[str]) -> str:
        make = GENERATED.get(match["name"])
        if make is None:
            raise ValueError(f"{page}: {match[0]} names no generated release text; "
                             f"use one of: {', '.join(GENERATED)}")
        return make()

    return MARKER.sub(replace, markdown)


def on_page_markdown(markdown: str, *, page: Any, **_: Any) -> str:
    """mkdocs' hook: a page's Markdown with its release texts generated."""
    return expand(markdown, page.file.src_uri)
