"""The generator's one result, :class:`~draftmeta.codegen.GeneratedUpdate`: what it holds, that
``explain``, the compiled update and the fused step share it, and its line map, which names the
field of a write that raises (there is no marker per write in the generated code)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from draftmeta import DraftState, advance_state, explain
from draftmeta.codegen import GeneratedUpdate, Part, generate
from draftmeta.errors import WriteFailed
from draftmeta.fields import record_items
from draftmeta.fused import FusedStep, fusable_paths
from draftmeta.spec import DraftSpec
from draftmeta.testing import random_state
from tests.toy import toy_metadata, toy_spec

PARTS: tuple[Part, ...] = ("full", "check", "finish", "seal", "step")


def _state(seed: int = 0) -> DraftState:
    return random_state(torch.Generator().manual_seed(seed), batch_size=6, block_size=4,
                        max_model_len=32, steps=6)


def _shipped() -> dict[str, Callable[[], DraftSpec[Any]]]:
    from draftmeta.registry import SPECS

    return dict(SPECS)


def _write_block(source: str) -> tuple[int, list[str]]:
    """The first line number (the ``def`` is 1) and the lines of the body of phase 4's
    ``try:``, or ``(0, [])`` where the function writes no tensor."""
    lines = source.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith("    # 4. tensor writes")]
    if not header:
        return 0, []
    assert lines[header[0] + 1] == "    try:"
    start = header[0] + 2
    end = lines.index("    except Exception as _exc:", start)
    return start + 1, lines[start:end]


def _expected_write_fields(source: str) -> dict[int, str]:
    """Read from the source alone: each write line's field is the one named by the rule
    comment (``# path: what the rule does``) that opens its block."""
    first, block = _write_block(source)
    out: dict[int, str] = {}
    field = None
    for number, line in enumerate(block, start=first):
        if re.match(r" {8}# ", line):
            field = line[10:].split(": ", 1)[0]
        assert field is not None, f"line {number} comes before any rule comment: {line!r}"
        out[number] = field
    return out


def _write_map_problems(generated: GeneratedUpdate) -> list[str]:
    """Where the line map disagrees, over the write lines, with the rule comments."""
    expected = _expected_write_fields(generated.source)
    actual = {n: f for n, f in generated.fields_by_line.items() if n in expected}
    return [f"{generated.spec} {generated.part} line {n}: map says {actual.get(n)!r}, the "
            f"comment {field!r}" for n, field in expected.items() if actual.get(n) != field]


# -- the result object ------------------------------------------------------------------------

def test_generate_returns_the_source_its_globals_and_a_line_to_field_map() -> None:
    spec = toy_spec()
    generated = generate(spec)
    assert (generated.spec, generated.part, generated.skip) == ("toy", "full", frozenset())
    assert generated.function_name == "draft_update_toy"
    assert generated.source.startswith("def draft_update_toy(metadata, state):\n")
    used = set(re.findall(r"\b_[A-Za-z]\w*\b", generated.source))
    assigned = set(re.findall(r"^\s*(_\w+) = ", generated.source, re.MULTILINE)) | {"_exc"}
    assert used - assigned <= set(generated.globals)  # every global the source reads is there
    assert set(generated.bound) <= set(generated.globals)
    assert generated.globals["_FIELD_AT_LINE"] == generated.fields_by_line
    assert set(generated.fields_by_line.values()) <= set(spec.rules)
    assert generated.filename.startswith("<draftmeta generated update toy ")


def test_the_same_spec_gives_an_equal_result() -> None:
    a, b = generate(toy_spec()), generate(toy_spec())
    assert (a.source, a.bound, dict(a.fields_by_line), a.filename) == (
        b.source, b.bound, dict(b.fields_by_line), b.filename)


def test_explain_and_the_compiled_update_come_from_one_result() -> None:
    spec = toy_spec()
    generated = generate(spec)
    assert explain(spec) == generated.explain()
    assert explain(spec).endswith("\n" + generated.source)
    compiled = spec.update.__draftmeta_generated__  # type: ignore[attr-defined]
    assert isinstance(compiled, GeneratedUpdate)
    assert compiled.source == generated.source
    assert spec.update.__code__.co_filename == generated.filename
    seal, step = spec.sealed
    assert [f.__draftmeta_generated__.part for f in (seal, step)] == ["seal", "step"]  # type: ignore[attr-defined]


def test_the_result_is_frozen() -> None:
    generated = generate(toy_spec())
    with pytest.raises(dataclasses.FrozenInstanceError):
        generated.source = ""  # type: ignore[misc]
    with pytest.raises(TypeError):
        generated.fields_by_line[1] = "positions"  # type: ignore[index]


@pytest.mark.parametrize("part", PARTS)
def test_every_variant_is_named_and_takes_the_arguments_of_its_part(part: Part) -> None:
    generated = generate(toy_spec(), part)
    prefix = {"full": "update", "check": "check", "finish": "finish", "seal": "seal",
              "step": "step"}[part]
    args = "metadata, state, seal" if part == "step" else "metadata, state"
    assert generated.source.startswith(f"def draft_{prefix}_toy({args}):\n")
    assert generated.filename.startswith(f"<draftmeta generated {prefix} toy ")


# -- the line map -----------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(_shipped()))
def test_the_line_map_names_the_field_of_every_write_line_of_a_shipped_spec(name: str) -> None:
    spec = _shipped()[name]()
    for part, skip in (("full", frozenset()), ("seal", frozenset()), ("step", frozenset()),
                       ("finish", fusable_paths(spec))):
        generated = generate(spec, part, skip)  # type: ignore[arg-type]
        assert _write_map_problems(generated) == []
        assert "_path" not in generated.source  # no marker store per write


def test_a_line_map_off_by_one_line_is_caught() -> None:
    # negative control of the check above: the same source with every entry moved a line down
    generated = generate(toy_spec())
    shifted = {n + 1: f for n, f in generated.fields_by_line.items()}
    assert _write_map_problems(dataclasses.replace(generated, fields_by_line=shifted))


def test_the_toy_spec_has_writes_in_several_fields() -> None:
    # what the failure tests below rely on: three writes, in this order
    assert list(dict.fromkeys(_expected_write_fields(generate(toy_spec()).source).values())) == [
        "positions", "decode.lens_copy", "decode.decode_lens"]


# -- a write that raises ----------------------------------------------------------------------

class Injected(RuntimeError):
    """The failure of an injected write."""


class _Failing:
    """Stands in for a rule's bound function, whose checks still pass (it passes them on): its
    ``apply`` raises one frame deeper than the generated function (``deeper``), or is not
    callable, so that the write's own line raises."""

    def __init__(self, function: object, deeper: bool) -> None:
        self._function = function
        self.apply = self._raise if deeper else None

    def _raise(self, *args: object, **kwargs: object) -> None:
        raise Injected("the write failed")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._function, name)


def _failing(original: object, how: str) -> object:
    """What replaces a write's first global: a memo list becomes ``None`` (its subscript
    raises on the write's line), a bound function a :class:`_Failing` one."""
    if isinstance(original, list):
        assert how == "here"
        return None
    return _Failing(original, deeper=how == "deeper")


def _first_global_on_line(generated: GeneratedUpdate, field: str) -> str:
    """The first global read by the first statement of ``field``'s write (found from the
    source's rule comments, not from the line map under test)."""
    lines = generated.source.splitlines()
    for number, owner in _expected_write_fields(generated.source).items():
        line = lines[number - 1]
        if owner == field and not line.lstrip().startswith("#"):
            names = [n for n in re.findall(r"\b_\w+\b", line) if n in generated.globals]
            return names[0]
    raise AssertionError(f"no write line of {field}")


def _values(meta: Any, state: DraftState) -> dict[str, Any]:
    """Every written or stored field of the toy metadata, and the whole state, copied."""
    def get(path: str) -> Any:
        obj = meta
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj.clone() if isinstance(obj, torch.Tensor) else obj

    out = {p: get(p) for p in ("positions", "decode.lens_copy", "decode.decode_lens",
                               "max_seq_len", "scale")}
    out.update({f"state.{k}": v.clone() if isinstance(v, torch.Tensor) else v
                for k, v in record_items(state) or () if k != "workspace"})
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))
    return bool(a == b)


def _run_failing(field: str, how: str, function: str) -> tuple[WriteFailed, dict[str, Any],
                                                               dict[str, Any]]:
    """Update the toy metadata with ``field``'s write failing; the error and the values before
    and after. ``how``: ``"here"`` (the write's own line raises: its global is ``None``) or
    ``"deeper"`` (a callee raises); ``function``: the update, or a sealed step."""
    spec = toy_spec()
    state = _state()
    meta = toy_metadata(state)
    seal, step = spec.sealed
    if function == "update":
        advance_state(state, "clamp")
        call: Callable[[], object] = lambda: spec.update(meta, state)  # noqa: E731
        fn = spec.update
    else:
        advance_state(state, "clamp")
        sealed = seal(meta, state)
        advance_state(state, "clamp")
        call = lambda: step(meta, state, sealed)  # noqa: E731
        fn = step
    assert meta.decode is not None  # stale values, so that a write would show
    meta.decode.lens_copy.fill_(-1)
    meta.decode.decode_lens.fill_(7)
    generated = fn.__draftmeta_generated__  # type: ignore[attr-defined]
    name = _first_global_on_line(generated, field)
    namespace = fn.__globals__  # type: ignore[attr-defined]
    if how == "deeper":
        assert name.startswith(("_copy_", "_fill_")), name  # a derivation's function
    original = namespace[name]
    namespace[name] = _failing(original, how)
    before = _values(meta, state)
    try:
        with pytest.raises(WriteFailed) as info:
            call()
    finally:
        namespace[name] = original
    return info.value, before, _values(meta, state)


@pytest.mark.parametrize("function", ["update", "step"])
@pytest.mark.parametrize("field", ["positions", "decode.lens_copy", "decode.decode_lens"])
def test_a_write_raising_on_its_own_line_is_reported_with_its_field(field: str, function: str
                                                                    ) -> None:
    error, before, after = _run_failing(field, "here", function)
    assert error.path == field and error.spec == "toy"
    assert isinstance(error.__cause__, TypeError)  # raised in the generated frame itself
    assert f"field {field!r}" in str(error) and "rebuild it" in str(error)
    assert all(_same(before[k], after[k]) for k in before if k.startswith("state."))


@pytest.mark.parametrize("function", ["update", "step"])
def test_a_write_failing_in_the_middle_names_its_field_and_writes_nothing_after_it(
    function: str,
) -> None:
    error, before, after = _run_failing("decode.lens_copy", "deeper", function)
    assert error.path == "decode.lens_copy"
    assert isinstance(error.__cause__, Injected)
    # the write before it happened (the metadata is partly updated, as WriteFailed says) ...
    assert not _same(before["positions"], after["positions"])
    # ... the failing write, those after it and the host values did not, nor anything of the state
    for key in ("decode.lens_copy", "decode.decode_lens", "max_seq_len", "scale"):
        assert _same(before[key], after[key]), key
    assert all(_same(before[k], after[k]) for k in before if k.startswith("state."))


# -- the fused step ---------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("triton") is None
                    or importlib.util.find_spec("vllm") is None,
                    reason="the fused step imports its kernel through Triton; the groups are "
                           "built by vLLM's builders")
def test_the_fused_step_runs_the_generated_check_and_finish_it_keeps() -> None:
    # built on the CPU: the kernel is only imported, never launched
    from tests.golden import regenerate as golden

    state, groups = golden.fused_groups()
    fused = FusedStep(state, groups)
    assert [c.spec for c, _ in fused.generated][1:] == [spec.name for spec, _ in groups]
    for (check, finish), check_fn, finish_fn, (spec, _) in zip(
            fused.generated[1:], fused.checks[1:], fused.finishes[1:], groups):
        assert (check.part, finish.part, finish.skip) == ("check", "finish", fusable_paths(spec))
        assert check.source == generate(spec, "check").source
        assert finish.source == generate(spec, "finish", fusable_paths(spec)).source
        assert check_fn.__draftmeta_generated__ is check  # type: ignore[attr-defined]
        assert finish_fn.__draftmeta_generated__ is finish  # type: ignore[attr-defined]
