"""The registry: one grammar of spec names, and the caches behind declaration cleared together."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import draftmeta.backends
import draftmeta.integrations.vllm.specs
from draftmeta import spec_cache
from draftmeta.advance import advance_spec
from draftmeta.codegen import explain
from draftmeta.registry import SPECS, clear_spec_caches, get_spec, recorded_classes


@pytest.mark.parametrize(("name", "host_bound", "overflow", "dcp"), [
    ("state.wrap", "frozen", "wrap", False),
    ("state.clamp", "frozen", "clamp", False),
    ("state.dcp", "frozen", "clamp", True),
    ("state.clamp", None, "clamp", False),
])
def test_a_source_advance_name_with_a_host_bound_is_that_advance(
    name: str, host_bound: str | None, overflow: str, dcp: bool
) -> None:
    expected = advance_spec(overflow, host_bound or "advance", dcp)  # type: ignore[arg-type]
    assert explain(get_spec(name, host_bound)) == explain(expected)  # type: ignore[arg-type]


def test_a_frozen_name_refuses_the_advancing_host_bound() -> None:
    assert explain(get_spec("state.clamp.frozen", "frozen")) == explain(
        get_spec("state.clamp.frozen"))
    with pytest.raises(ValueError, match=r"state\.clamp\.frozen is the frozen host bound; for "
                                         r"host bound advance name state\.clamp"):
        get_spec("state.clamp.frozen", "advance")


def test_every_builder_name_takes_either_host_bound() -> None:
    with recorded_classes():
        for name in SPECS:
            if name.startswith("state."):
                continue
            frozen = explain(get_spec(name, "frozen"))
            assert frozen != explain(get_spec(name, "advance")), name
            assert explain(get_spec(name)) == explain(get_spec(name, "advance")), name


def test_a_spec_cache_is_emptied_by_clearing_the_registrys_caches() -> None:
    made: list[int] = []

    @spec_cache.spec_cache
    def declare(n: int) -> list[int]:
        made.append(n)
        return [n]

    first = declare(1)
    assert declare(1) is first and made == [1]
    clear_spec_caches()
    assert declare(1) is not first and made == [1, 1]


_UNAFFECTED = {
    # the installed source (no stand-ins), a recorded file's contents
    "draftmeta.integrations.vllm.catalogue.classes.source_fields",
    "draftmeta.integrations.vllm.catalogue.classes._read_recorded",
}
"""Caches of spec declaration whose results do not depend on which classes are loaded."""

_DECLARING = (
    *(f"draftmeta.backends.{m.name}" for m in pkgutil.iter_modules(draftmeta.backends.__path__)),
    *(f"draftmeta.integrations.vllm.specs.{m.name}"
      for m in pkgutil.iter_modules(draftmeta.integrations.vllm.specs.__path__)),
    "draftmeta.integrations.vllm.catalogue.classes",
)
"""The modules that declare specs or load the classes they are declared against."""


def test_every_cache_of_spec_declaration_is_cleared_with_the_registrys() -> None:
    registered = set(spec_cache.registered())
    found = []
    for module_name in _DECLARING:
        module = importlib.import_module(module_name)
        for name, value in vars(module).items():
            if hasattr(value, "cache_clear") and getattr(value, "__module__", "") == \
                    module.__name__:
                found.append((f"{module.__name__}.{name}", value))
    assert len(found) >= 4
    assert [name for name, value in found
            if value not in registered and name not in _UNAFFECTED] == []
