"""Generated update functions: semantics, readable deterministic source, tracebacks, atomicity,
and no allocation in steady state."""

from __future__ import annotations

import copy
import linecache
import traceback
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from draftmeta import (
    Derive,
    DraftState,
    Equals,
    PreconditionFailed,
    UpdateError,
    advance_state,
    explain,
)
from draftmeta.derivations import Derivation
from draftmeta.testing import compare_metadata, random_state
from tests.toy import Scheduler, ToyDecode, ToyMeta, toy_metadata, toy_rules, toy_spec

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs CUDA"))]


def _state(seed: int = 0, device: str = "cpu", **kw: Any) -> DraftState:
    params: dict[str, Any] = {"batch_size": 6, "block_size": 4, "max_model_len": 32, "steps": 6}
    params.update(kw)
    return random_state(torch.Generator().manual_seed(seed), device=device, **params)


def _storages(meta: ToyMeta[ToyDecode]) -> list[int]:
    assert meta.decode is not None
    tensors = [meta.positions, meta.slot_mapping, meta.weights, meta.decode.block_table,
               meta.decode.seq_lens, meta.decode.lens_copy, meta.decode.decode_lens]
    return [t.untyped_storage().data_ptr() for t in tensors]


def _opaque(obj: object) -> bool:
    return isinstance(obj, Scheduler)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(8))
def test_update_equals_rebuild_on_the_toy_metadata(device: str, seed: int) -> None:
    spec = toy_spec()
    state = _state(seed, device)
    meta = toy_metadata(state)
    meta.decode.decode_lens.fill_(7)  # type: ignore[union-attr]  # stale: the update must refill it
    before = _storages(meta)
    for step in range(1, 7):
        advance_state(state, "clamp")
        scheduler = meta.scheduler
        spec.update(meta, state)
        rebuilt = toy_metadata(state)
        assert compare_metadata(meta, rebuilt, opaque=_opaque) == [], f"seed {seed} step {step}"
        assert meta.scheduler is not scheduler and not meta.scheduler.filled
        assert _storages(meta) == before


def test_explain_is_deterministic_and_readable() -> None:
    a, b = toy_spec(), toy_spec()
    source = explain(a)
    assert source == explain(b) == explain(a)
    assert source.startswith("# globals of the generated function's module:\n")
    assert "\ndef draft_update_toy(metadata, state):\n" in source
    for line in (
        "if not (metadata.decode is not None):",
        "raise _PreconditionFailed(_SPEC, 'decode_only',",
        "_decode = metadata.decode",
        "if _pair is None or _pair[0] is not _decode.seq_lens or "
        "_pair[1] is not state.seq_lens:",
        "if _decode.seq_lens is not state.seq_lens and "
        "not _shares_storage(_decode.seq_lens, state.seq_lens):",
        "_new_max_seq_len = min(metadata.max_seq_len + 1, state.max_model_len)",
        "_rows_of_positions_now[2].add_(1).clamp_(max=state.max_model_len - 1)",
        "# decode.lens_copy: derive: copy of the input's leading rows",
        "metadata.max_seq_len = _new_max_seq_len",
        "#   weights: unchanged",
    ):
        assert line in source, line
    # every check comes before the first write
    lines = source.splitlines()
    first_write = next(i for i, s in enumerate(lines) if "# 4. tensor writes" in s)
    # the only raise after it reports a formula or hook that failed despite its check
    assert all("raise" not in s or "raise _WriteFailed(" in s for s in lines[first_write:])
    assert source.endswith(a.update.__draftmeta_source__)  # type: ignore[attr-defined]


def test_generated_source_shows_in_tracebacks() -> None:
    spec = toy_spec()
    state = _state()
    meta = toy_metadata(state)
    meta.decode.seq_lens = meta.decode.seq_lens.clone()  # type: ignore[union-attr]
    with pytest.raises(UpdateError) as info:
        spec.update(meta, state)
    assert "no longer shares storage with state.seq_lens" in str(info.value)
    frames = traceback.extract_tb(info.value.__traceback__)
    generated = [f for f in frames if f.filename.startswith("<draftmeta generated update toy")]
    assert generated, [f.filename for f in frames]
    frame = generated[-1]
    assert frame.line is not None and "raise _UpdateError(_SPEC, 'decode.seq_lens'" in frame.line
    assert linecache.getline(frame.filename, frame.lineno).strip() == frame.line


class _Exploding(Derivation):
    name = "exploding"
    formula = "raises"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return "input is not ready"

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        raise AssertionError("apply must not run after a failed check")


def _snapshot(meta: ToyMeta[ToyDecode]) -> ToyMeta[ToyDecode]:
    return copy.deepcopy(meta)


@pytest.mark.parametrize(
    "break_it",
    [
        pytest.param(lambda m, s, r: setattr(m, "num_prefills", 2), id="precondition"),
        pytest.param(lambda m, s, r: setattr(m, "num_decode_tokens", 99), id="same-value"),
        pytest.param(
            lambda m, s, r: setattr(m.decode, "seq_lens", m.decode.seq_lens.clone()), id="alias"
        ),
        pytest.param(
            lambda m, s, r: setattr(m, "positions", m.positions.float()), id="advance-dtype"
        ),
        pytest.param(
            lambda m, s, r: setattr(m.decode, "lens_copy", m.decode.lens_copy.repeat(2)),
            id="derive-shape",
        ),
        pytest.param(
            lambda m, s, r: r.__setitem__(
                "decode.lens_copy", Derive(_Exploding(), ("decode.seq_lens",))
            ),
            id="derive-check",
        ),
    ],
)
def test_a_failed_update_leaves_the_metadata_untouched(break_it: Any) -> None:
    state = _state(3)
    rules = toy_rules()
    meta = toy_metadata(state)
    break_it(meta, state, rules)
    spec = toy_spec(rules=rules)
    advance_state(state, "clamp")
    before = _snapshot(meta)
    scheduler = meta.scheduler
    with pytest.raises((PreconditionFailed, UpdateError)):
        spec.update(meta, state)
    assert compare_metadata(meta, before, opaque=_opaque) == []
    assert meta.scheduler is scheduler, "the host object was replaced by a failed update"


def test_unsupported_spec_refuses_before_writing() -> None:
    from draftmeta import Unsupported

    rules = toy_rules()
    rules["weights"] = Unsupported("weights depend on the sampler")
    spec = toy_spec(rules=rules)
    state = _state()
    meta = toy_metadata(state)
    with pytest.raises(PreconditionFailed) as info:
        spec.update(meta, state)
    assert info.value.name == "unsupported"
    assert "weights depend on the sampler" in str(info.value)


def test_steady_state_allocates_no_tensor_on_cpu() -> None:
    spec = toy_spec()
    state = _state(batch_size=16, max_model_len=512, block_size=16)
    meta = toy_metadata(state)
    advance_state(state, "clamp")
    spec.update(meta, state)  # first step: workspace buffers may be allocated
    buffers = len(state.workspace)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            advance_state(state, "clamp")
            spec.update(meta, state)
    sizes = [e.cpu_memory_usage for e in prof.events() if e.name == "[memory]"]
    # python-int operands become 8-byte scalar wrappers; any tensor here is >= 64 bytes
    assert [s for s in sizes if s > 8] == [], sizes
    assert len(state.workspace) == buffers


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_steady_state_allocates_nothing_on_cuda() -> None:
    spec = toy_spec()
    state = _state(device="cuda", batch_size=64, max_model_len=4096, block_size=16)
    meta = toy_metadata(state)
    advance_state(state, "clamp")
    spec.update(meta, state)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    ptrs = _storages(meta)
    for _ in range(5):
        advance_state(state, "clamp")
        spec.update(meta, state)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    assert _storages(meta) == ptrs


def _header(source: str) -> dict[str, str]:
    head = source.split("\ndef ", 1)[0].splitlines()[1:]
    return dict(line[len("#   "):].split(" = ", 1) for line in head)  # type: ignore[misc]


def test_bound_names_stay_the_same_when_rules_are_reordered() -> None:
    rules = toy_rules()
    reordered = dict(reversed(list(rules.items())))
    names = set(_header(explain(toy_spec())))
    assert names == set(_header(explain(toy_spec(rules=reordered))))
    assert "_attributes_metadata" in names and "_layout" in names  # no counter suffix


def test_explain_header_says_what_every_global_of_the_source_holds() -> None:
    import re

    from draftmeta.codegen import generate

    spec = toy_spec()
    generated = generate(spec)
    source, namespace = generated.source, generated.globals
    text = explain(spec)
    header = _header(text)
    used = {n for n in namespace if n != "__builtins__" and re.search(rf"\b{n}\b", source)}
    assert used == set(header)
    assert header["_SPEC"] == "'toy'" and header["_attributes_metadata"].startswith("{'")
    assert "0x" not in text.split("\ndef ", 1)[0]  # no addresses


def test_a_single_precondition_is_tested_once() -> None:
    spec = toy_spec(preconditions=[Equals("num_prefills", 0, name="decode_only")])
    source = explain(spec)
    assert source.count("metadata.num_prefills == 0") == 1
    assert "# 1. precondition\n    if not (metadata.num_prefills == 0):\n" in source
    with pytest.raises(PreconditionFailed, match="num_prefills is 2, expected 0"):
        state = _state()
        meta = toy_metadata(state)
        meta.num_prefills = 2
        spec.update(meta, state)


def test_several_preconditions_keep_one_combined_test() -> None:
    source = explain(toy_spec())
    assert "# 1. preconditions: one combined test" in source and "    if not (\n" in source


def test_a_field_written_by_another_rule_is_not_listed_as_not_written() -> None:
    from draftmeta.registry import get_spec

    source = explain(get_spec("FLASHMLA.fp8"))
    written, _, unwritten = source.partition("# fields this update does not write:")
    assert "num_splits: written by the recompute hook" in written
    assert "written by" not in unwritten


def test_the_finish_function_does_not_claim_checks_it_lacks() -> None:
    from draftmeta.codegen import compile_spec

    finish = compile_spec(toy_spec(), "finish").__draftmeta_source__  # type: ignore[attr-defined]
    check = compile_spec(toy_spec(), "check").__draftmeta_source__  # type: ignore[attr-defined]
    assert "every check runs" not in finish and "It checks nothing" in finish
    assert "_PreconditionFailed" not in finish and "_UpdateError" not in finish
    assert "writes nothing" in check and "_PreconditionFailed" in check


# -- what explain's header says of the objects bound into generated code ----------------------

def test_the_memory_checks_description_lists_every_field_it_covers_comma_separated() -> None:
    from draftmeta.codegen import describe_bound
    from draftmeta.layout import LayoutGuard, Written

    guard = LayoutGuard([Written("a"), Written("decode.b"), Written("c", unchanged=True),
                         Written("d", unchanged=True)])
    assert describe_bound(guard) == (
        "the memory check (once per tensor set): a, decode.b own their memory; unchanged c, d "
        "must not overlap a moved buffer")
    assert describe_bound(LayoutGuard([Written("c", unchanged=True)])) == (
        "the memory check (once per tensor set): nothing own their memory; unchanged c must not "
        "overlap a moved buffer")


def test_a_bound_object_with_no_description_formula_or_name_is_described_by_its_class() -> None:
    from draftmeta.codegen import describe_bound

    assert describe_bound(_Plain()) == "_Plain"
    assert describe_bound(_Named()) == "_Named 'tail'"


class _Plain:
    pass


class _Named:
    name = "tail"
