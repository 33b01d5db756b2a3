"""One list per public name: ``draftmeta._EXPORTS`` is the list; ``__all__`` is derived from
it, the imports for type checkers are held equal to it, and the docs pages that list the public
names or every rule kind are held complete."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import draftmeta
import draftmeta.rules
from draftmeta.rules import Rule

ROOT = Path(__file__).resolve().parent.parent


def _type_checking_imports() -> dict[str, str]:
    """``{name: module}`` of the ``if TYPE_CHECKING:`` imports of ``draftmeta/__init__.py``."""
    tree = ast.parse((ROOT / "draftmeta" / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module is not None
                for alias in stmt.names:
                    # ``X as X``: an explicit re-export for mypy --strict, pyright and ruff
                    assert alias.asname == alias.name, ast.unparse(stmt)
                    found[alias.name] = stmt.module
    return found


def test_all_is_derived_from_the_export_table() -> None:
    assert draftmeta.__all__ == sorted([*draftmeta._EXPORTS, "__version__"])


def test_the_imports_for_type_checkers_are_the_export_table() -> None:
    assert _type_checking_imports() == draftmeta._EXPORTS


@pytest.mark.parametrize("name", sorted(draftmeta._EXPORTS))
def test_every_public_name_is_defined_where_the_export_table_says(name: str) -> None:
    module = importlib.import_module(draftmeta._EXPORTS[name])
    assert getattr(draftmeta, name) is getattr(module, name)


def rule_kinds() -> list[str]:
    """Every shipped rule kind: the public :class:`~draftmeta.rules.Rule` subclasses of
    :mod:`draftmeta.rules`."""
    return sorted(n for n in draftmeta.rules.__all__
                  if isinstance(getattr(draftmeta.rules, n), type)
                  and issubclass(getattr(draftmeta.rules, n), Rule)
                  and getattr(draftmeta.rules, n) is not Rule)


def missing_names(text: str, names: list[str]) -> list[str]:
    """The names that ``text`` never mentions as a word."""
    return [n for n in names if not re.search(rf"\b{re.escape(n)}\b", text)]


def _section(page: str, heading: str) -> str:
    """The text of ``page`` under ``heading`` up to the next heading of the same level."""
    text = (ROOT / page).read_text()
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start:] if end < 0 else text[start:end]


RULE_LISTS = {
    "docs/concepts.md: The rules": ("docs/concepts.md", "## The rules"),
    "docs/concepts.md: All rules at a glance": ("docs/concepts.md", "### All rules at a glance"),
    "docs/guide.md: How to choose": ("docs/guide.md", None),
    "docs/reference/draftmeta.md: Public names": ("docs/reference/draftmeta.md",
                                                  "## Public names"),
}
"""The docs places that list every rule kind (the guide's "How to choose" list is found by its
first line)."""


def _rule_list(place: str) -> str:
    page, heading = RULE_LISTS[place]
    if heading is not None:
        return _section(page, heading)
    text = (ROOT / page).read_text()
    start = text.index("How to choose:")
    return text[start:text.index("\n\n", text.index("Unsupported", start))]


def test_there_are_rule_kinds_to_list() -> None:
    kinds = rule_kinds()
    assert {"Alias", "HostSet", "Unsupported", "WrittenBy"} <= set(kinds)
    assert "Rule" not in kinds and "Clamp" not in kinds  # Clamp is an overflow policy


@pytest.mark.parametrize("place", sorted(RULE_LISTS))
def test_the_docs_list_every_shipped_rule_kind(place: str) -> None:
    assert missing_names(_rule_list(place), rule_kinds()) == []


def test_the_reference_lists_every_public_name() -> None:
    table = _section("docs/reference/draftmeta.md", "## Public names")
    assert missing_names(table, sorted(draftmeta._EXPORTS)) == []


def test_a_docs_page_missing_a_rule_kind_is_reported() -> None:
    # negative control: the concepts page's rule list with HostSet taken out
    text = _rule_list("docs/concepts.md: The rules").replace("HostSet", "Host")
    assert missing_names(text, rule_kinds()) == ["HostSet"]
