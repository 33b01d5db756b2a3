"""Griffe extensions for the docs build.

``SphinxRoles`` renders the reStructuredText used in the package's docstrings as Markdown: Sphinx
roles become links, and bare doctest examples (``>>>``) become ``pycon`` code blocks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

_DIRECTIVE = re.compile(r"^:::\s+([\w.]+)", re.MULTILINE)
"""A mkdocstrings directive on a reference page: the module it renders."""

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")
"""A Sphinx cross-reference role: ``~`` (shorten) and the target's dotted name."""


def fence_doctests(text: str) -> str:
    """Wrap bare doctest examples (``>>>`` lines up to the next blank line) in pycon fences."""
    out: list[str] = []
    in_fence = in_doctest = False
    indent = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_doctest and not stripped:
            out.append(f"{indent}```")
            in_doctest = False
        elif not in_fence and not in_doctest and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            in_doctest = True
        out.append(line)
    if in_doctest:
        out.append(f"{indent}```")
    return "\n".join(out)


class SphinxRoles(griffe.Extension):
    """Turn Sphinx roles in docstrings (``:class:`~draftmeta.state.DraftState```) into Markdown.

    The package's docstrings use Sphinx cross-reference roles, which Markdown shows verbatim. A
    role whose target is rendered on this site (a documented object of a module that a page
    under ``docs/reference`` renders with ``:::``) becomes a cross-reference link; any other
    (the standard library, vLLM, private or undocumented objects) becomes inline code. ``~``
    shortens the shown name to its last part, as in Sphinx. Bare doctests become ``pycon``
    code blocks (Markdown would show them as nested quotes).
    """

    def __init__(self) -> None:
        super().__init__()
        self._documented: set[str] = set()
        for page in (Path(__file__).parent / "reference").glob("**/*.md"):
            self._documented.update(_DIRECTIVE.findall(page.read_text(encoding="utf-8")))

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        self._rewrite(pkg, loader.modules_collection, set())

    def _rewrite(
        self, obj: griffe.Object, collection: griffe.ModulesCollection, seen: set[str]
    ) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            text = _ROLE.sub(
                lambda m: self._render(obj, m.group(1) == "~", m.group(2), collection),
                obj.docstring.value,
            )
            obj.docstring.value = fence_doctests(text)
        for member in list(obj.members.values()):
            if not member.is_alias:
                self._rewrite(member, collection, seen)  # type: ignore[arg-type]

    def _render(
        self, obj: griffe.Object, short: bool, name: str, collection: griffe.ModulesCollection
    ) -> str:
        shown = f"`{name.rsplit('.', 1)[-1] if short else name}`"
        target = self._target(obj, name, collection)
        return f"[{shown}][{target}]" if target else shown

    def _target(
        self, obj: griffe.Object, name: str, collection: griffe.ModulesCollection
    ) -> str | None:
        scope = obj if obj.is_module or obj.is_class else obj.parent
        head, _, rest = name.partition(".")
        try:
            if head in collection.members:
                path = name
            else:
                assert scope is not None
                path = scope.resolve(head) + (f".{rest}" if rest else "")
            found: griffe.Object | griffe.Alias = collection.get_member(path)
            while found.is_alias:
                found = found.final_target  # type: ignore[union-attr]
        except Exception:  # unresolvable, external or not loaded: inline code
            return None
        return found.path if self._rendered(found) else None

    def _rendered(self, obj: griffe.Object) -> bool:
        chain: list[griffe.Object] = []
        node: griffe.Object | None = obj
        while node is not None and not node.is_module:
            chain.append(node)
            node = node.parent
        if node is None or node.path not in self._documented:
            return False
        return all(not o.name.startswith("_") and o.docstring is not None for o in chain)
