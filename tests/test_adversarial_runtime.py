"""Adversarial run time: every metadata object, state or formula that an update cannot handle is
refused before the first write with draftmeta's error (type and message asserted), the
metadata and the state bit-identical afterwards; user text never runs as code; two threads on
distinct metadata objects are fine."""

from __future__ import annotations

import copy
import dataclasses
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest
import torch

from draftmeta import (
    Alias,
    CopyFrom,
    Derive,
    DraftSpec,
    DraftState,
    Equals,
    HostConstant,
    HostDerive,
    PreconditionFailed,
    Reset,
    Satisfies,
    Unchanged,
    UpdateError,
    advance_state,
    explain,
)
from draftmeta.derivations import Derivation, TokenToRequest
from draftmeta.errors import WriteFailed
from draftmeta.loop import DraftLoop
from draftmeta.testing import compare_metadata, random_state
from tests.toy import Scheduler, ToyDecode, ToyMeta, toy_group, toy_metadata, toy_rules, toy_spec

Meta = ToyMeta[ToyDecode]


def _state(seed: int = 0, **kw: Any) -> DraftState:
    params: dict[str, Any] = {"batch_size": 5, "block_size": 4, "max_model_len": 40, "steps": 4}
    params.update(kw)
    return random_state(torch.Generator().manual_seed(seed), **params)


def _opaque(obj: object) -> bool:
    return isinstance(obj, Scheduler)


def _snapshot(obj: object) -> object:
    return copy.deepcopy(obj)


@dataclasses.dataclass
class _SubDecode(ToyDecode):
    extra: int = 0


@dataclasses.dataclass
class _SubMeta(ToyMeta[ToyDecode]):
    extra_lens: torch.Tensor | None = None


def _sub_meta(m: Meta, s: DraftState) -> Any:
    fields = {f.name: getattr(m, f.name) for f in dataclasses.fields(m)}
    return _SubMeta(**fields, extra_lens=s.seq_lens.clone())


def _set_attr(m: Meta, s: DraftState) -> Any:
    m.stale_copy = s.seq_lens.clone()  # type: ignore[attr-defined]
    return m


def _decode(m: Meta) -> ToyDecode:
    assert m.decode is not None
    return m.decode


def _edit(fn: Callable[[Meta, DraftState], None]) -> Callable[[Meta, DraftState], Meta]:
    def apply(m: Meta, s: DraftState) -> Meta:
        fn(m, s)
        return m

    return apply


def _shifted_input(m: Meta, s: DraftState) -> None:
    # the state's seq_lens and the derived copy are two overlapping windows of one buffer
    n = s.seq_lens.shape[0]
    buf = torch.zeros(2 * n, dtype=s.seq_lens.dtype)
    buf[:n] = s.seq_lens
    s.seq_lens = buf[:n]
    _decode(m).seq_lens = s.seq_lens
    _decode(m).lens_copy = buf[1 : n + 1]


# (id, break the metadata (or state), error type, fragment)
CASES: list[tuple[str, Callable[[Meta, DraftState], Any], type[Exception], str]] = [
    ("metadata is None", lambda m, s: None, UpdateError, "the metadata object is None"),
    ("metadata of another class", lambda m, s: _decode(m), UpdateError,
     "is a ToyDecode, not the spec's ToyMeta"),
    ("metadata is a subclass with an extra field", _sub_meta, UpdateError,
     "a _SubMeta, not the spec's ToyMeta"),
    ("an attribute set after construction", _set_attr, UpdateError,
     "stale_copy (an attribute outside the class's fields)"),
    ("nested record of a subclass",
     _edit(lambda m, s: setattr(m, "decode", _SubDecode(**vars(_decode(m))))), UpdateError,
     "is a _SubDecode, not the declared ToyDecode"),
    ("nested record missing", _edit(lambda m, s: setattr(m, "decode", None)),
     PreconditionFailed, "'has_decode'"),
    ("advanced field is float", _edit(lambda m, s: setattr(m, "positions", m.positions.float())),
     UpdateError, "advance needs integers"),
    ("advanced field is complex",
     _edit(lambda m, s: setattr(m, "positions", m.positions.to(torch.complex64))),
     UpdateError, "torch.complex64 tensor; advance needs integers"),
    ("advanced field is bool", _edit(lambda m, s: setattr(m, "positions", m.positions.bool())),
     UpdateError, "advance needs integers"),
    ("advanced field is None", _edit(lambda m, s: setattr(m, "positions", None)),
     UpdateError, "'positions'"),
    ("advanced field is the state's positions",
     _edit(lambda m, s: setattr(m, "positions", s.positions)),
     UpdateError, "shares memory with state.positions, so writing it would corrupt"),
    ("filled field is a view of the state's seq_lens",
     _edit(lambda m, s: setattr(_decode(m), "decode_lens", s.seq_lens[:])),
     UpdateError, "shares memory with state.seq_lens"),
    ("filled field is a view of the state's block table",
     _edit(lambda m, s: setattr(_decode(m), "decode_lens", s.block_table[:, 0])),
     UpdateError, "shares memory with state.block_table"),
    ("two written fields share a buffer",
     _edit(lambda m, s: setattr(_decode(m), "decode_lens", _decode(m).lens_copy)),
     UpdateError, "shares memory with 'decode.lens_copy', which this update also writes"),
    ("a written field is an expanded view",
     _edit(lambda m, s: setattr(_decode(m), "decode_lens",
                                torch.ones(1, dtype=torch.int32).expand(s.batch_size))),
     UpdateError, "has elements sharing memory"),
    ("a destination overlapping its source", _edit(_shifted_input),
     UpdateError, "overlaps the memory of its input 0"),
    ("an unchanged field that the advance moves",
     _edit(lambda m, s: setattr(m, "weights", s.positions)),
     UpdateError, "declared unchanged but shares memory with state.positions"),
    ("an alias that became a copy",
     _edit(lambda m, s: setattr(_decode(m), "seq_lens", _decode(m).seq_lens.clone())),
     UpdateError, "no longer shares storage with state.seq_lens"),
    ("a derived field of the wrong shape",
     _edit(lambda m, s: setattr(_decode(m), "lens_copy", _decode(m).lens_copy.repeat(2))),
     UpdateError, "does not fit"),
    ("a derived field that is not a tensor",
     _edit(lambda m, s: setattr(_decode(m), "lens_copy", [1, 2, 3])),
     UpdateError, "AttributeError"),
    ("host int is NaN", _edit(lambda m, s: setattr(m, "max_seq_len", float("nan"))),
     UpdateError, "'max_seq_len': would become nan, not an int"),
    ("host int is a numpy int", _edit(lambda m, s: setattr(m, "max_seq_len", np.int64(3))),
     UpdateError, "not an int"),
    ("state max_model_len is NaN", _edit(lambda m, s: setattr(s, "max_model_len", float("nan"))),
     UpdateError, "'state.max_model_len': is nan"),
    ("state max_model_len is zero", _edit(lambda m, s: setattr(s, "max_model_len", 0)),
     UpdateError, "needs an int >= 1"),
    ("state max_model_len is a numpy int",
     _edit(lambda m, s: setattr(s, "max_model_len", np.int64(40))),
     UpdateError, "'state.max_model_len'"),
    ("state num_reqs is negative", _edit(lambda m, s: setattr(s, "num_reqs", -1)),
     UpdateError, "needs an int >= 0"),
    ("state num_reqs is a float", _edit(lambda m, s: setattr(s, "num_reqs", 2.0)),
     UpdateError, "'state.num_reqs'"),
]


def _real(mismatches: list[Any]) -> list[Any]:
    """Mismatches other than a NaN compared with itself (NaN != NaN, yet nothing changed)."""
    return [m for m in mismatches if m.detail != "nan != nan"]


def _run(case: Callable[[Meta, DraftState], Any], spec: DraftSpec[Any] | None = None
         ) -> tuple[Any, Any, Any, Any]:
    state = _state()
    meta = toy_metadata(state)
    target = case(meta, state)
    before_meta, before_state = _snapshot(target), state.clone()
    scheduler = getattr(target, "scheduler", None)
    with pytest.raises(Exception) as info:
        (spec or toy_spec()).update(target, state)
    assert _real(compare_metadata(target, before_meta, opaque=_opaque)) == []
    assert getattr(target, "scheduler", None) is scheduler
    assert _real(compare_metadata(state, before_state, ignore=lambda p: p == "workspace")) == []
    return info.value, target, state, before_meta


@pytest.mark.parametrize(
    ("case", "error", "fragment"), [pytest.param(c, e, f, id=i) for i, c, e, f in CASES]
)
def test_an_update_refuses_before_writing(
    case: Callable[[Meta, DraftState], Any], error: type[Exception], fragment: str
) -> None:
    exc = _run(case)[0]
    assert type(exc) is error, repr(exc)
    assert fragment in str(exc)


def test_the_unbroken_metadata_updates_fine() -> None:
    """Positive control for the table above: the same setup without the break updates."""
    state = _state()
    meta = toy_metadata(state)
    advance_state(state)
    toy_spec().update(meta, state)
    assert compare_metadata(meta, toy_metadata(state), opaque=_opaque) == []


# -- formulas -------------------------------------------------------------------------------


class _CheckRaises(Derivation):
    name = "check_raises"
    formula = "raises in check"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return str(1 // 0)

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        raise AssertionError("unreachable")


class _ApplyRaises(Derivation):
    name = "apply_raises"
    formula = "raises in apply"

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        raise RuntimeError("kernel failed")


class _SeesHost(Derivation):
    """Records the host value its check and its apply see."""

    name = "sees_host"
    formula = "records max_seq_len"
    seen: ClassVar[list[tuple[str, object]]] = []

    def check(self, out: torch.Tensor, *inputs: object) -> str | None:
        self.seen.append(("check", inputs[1]))
        return None

    def apply(self, out: torch.Tensor, *inputs: object, workspace: Any) -> None:
        self.seen.append(("apply", inputs[1]))
        out.copy_(_as_tensor(inputs[0]))


def _as_tensor(x: object) -> torch.Tensor:
    assert isinstance(x, torch.Tensor)
    return x


def _toy_with(path: str, rule: Any) -> DraftSpec[Any]:
    rules = toy_rules()
    rules[path] = rule
    return toy_spec(rules=rules)


def test_a_check_that_raises_becomes_an_update_error() -> None:
    spec = _toy_with("decode.lens_copy", Derive(_CheckRaises(), ("decode.seq_lens",)))
    exc = _run(lambda m, s: m, spec)[0]
    assert isinstance(exc, UpdateError) and "ZeroDivisionError" in str(exc)
    assert isinstance(exc.__cause__, ZeroDivisionError)


def test_a_write_that_raises_is_reported_as_write_failed_naming_the_field() -> None:
    spec = _toy_with("decode.decode_lens", Derive(_ApplyRaises(), ()))
    state = _state()
    meta = toy_metadata(state)
    with pytest.raises(WriteFailed, match=r"'decode\.decode_lens'.*kernel failed.*rebuild it"):
        spec.update(meta, state)


def test_the_loop_replaces_metadata_whose_write_failed() -> None:
    spec = _toy_with("decode.decode_lens", Derive(_ApplyRaises(), ()))
    state = _state()
    meta = toy_metadata(state)
    group = toy_group("g", state, spec=spec, metadata=meta)
    loop = DraftLoop([group], state, shadow=0)
    loop.run(lambda i, m: None, 2)
    assert "write failed" in (loop.stats.fallbacks()["g"])
    assert loop.groups[0].metadata is not meta
    assert compare_metadata(loop.groups[0].metadata, toy_metadata(state), opaque=_opaque) == []


def test_a_check_sees_the_new_host_value_that_apply_sees() -> None:
    rules = toy_rules()
    rules["decode.lens_copy"] = Derive(_SeesHost(), ("decode.seq_lens", "max_seq_len"))
    spec = toy_spec(rules=rules)
    state = _state()
    meta = toy_metadata(state)
    old = meta.max_seq_len
    _SeesHost.seen.clear()
    spec.update(meta, state)
    assert _SeesHost.seen == [("check", old + 1), ("apply", old + 1)]


def test_a_token_map_refuses_zero_requests() -> None:
    @dataclasses.dataclass
    class TokenMeta:
        req: torch.Tensor

    spec = DraftSpec(TokenMeta, {"req": Derive(TokenToRequest(), ("state.query_start_loc",
                                                                  "state.num_reqs"))})
    state = _state()
    meta = TokenMeta(torch.zeros(state.batch_size, dtype=torch.int32))
    state.num_reqs = 0
    with pytest.raises(UpdateError, match="needs at least one request"):
        spec.update(meta, state)
    assert int(meta.req.abs().sum()) == 0


def test_a_flat_copy_into_a_non_contiguous_field_is_refused() -> None:
    @dataclasses.dataclass
    class FlatMeta:
        lens: torch.Tensor

    spec = DraftSpec(FlatMeta, {"lens": Derive(CopyFrom(flat=True), ("state.seq_lens",))})
    state = _state()
    meta = FlatMeta(torch.zeros(2, 4, dtype=torch.int32)[:, :2])
    with pytest.raises(UpdateError, match="contiguous field"):
        spec.update(meta, state)


def test_a_derived_field_on_another_device_is_refused_before_writing() -> None:
    state = _state()
    meta = toy_metadata(state)
    _decode(meta).lens_copy = _decode(meta).lens_copy.to("meta")
    positions = meta.positions.clone()
    with pytest.raises(UpdateError, match="input on cpu but output on meta"):
        toy_spec().update(meta, state)
    assert torch.equal(meta.positions, positions)


def test_an_alias_of_an_absent_state_buffer_is_refused() -> None:
    @dataclasses.dataclass
    class DcpMeta:
        local: torch.Tensor

    spec = DraftSpec(DcpMeta, {"local": Alias("dcp_local_seq_lens")})
    state = _state()
    with pytest.raises(UpdateError, match=r"alias of state\.dcp_local_seq_lens, which is None"):
        spec.update(DcpMeta(state.seq_lens), state)


def test_a_nan_host_derive_is_refused() -> None:
    spec = _toy_with("scale", HostDerive(lambda m: float("nan"), ("state.max_model_len",)))
    exc = _run(lambda m, s: m, spec)[0]
    assert isinstance(exc, UpdateError) and exc.detail == "would become NaN"
    assert exc.path == "scale"


# -- preconditions through optional records --------------------------------------------------


@dataclasses.dataclass
class _Part:
    count: int


@dataclasses.dataclass
class _WithPart:
    part: _Part | None
    n: int


def test_a_precondition_through_a_missing_record_fails_as_a_precondition() -> None:
    spec = DraftSpec(_WithPart, {"part": Unchanged(), "n": HostConstant()},
                     preconditions=[Equals("part.count", 0, name="no_count")])
    spec.update(_WithPart(_Part(0), 1), _state())  # holds
    with pytest.raises(PreconditionFailed, match=r"'no_count' does not hold \(part is None\)"):
        spec.update(_WithPart(None, 1), _state())
    with pytest.raises(PreconditionFailed, match=r"part\.count is 3, expected 0"):
        spec.update(_WithPart(_Part(3), 1), _state())


# -- injection --------------------------------------------------------------------------------


@dataclasses.dataclass
class _Pair:
    seq_lens: torch.Tensor


@dataclasses.dataclass
class _Collide:
    pair: _Pair
    new_max_seq_len: _Pair
    max_seq_len: int
    problem: _Pair


def test_generated_locals_never_collide_with_nested_record_names() -> None:
    spec = DraftSpec(_Collide, {
        "pair.seq_lens": Alias("seq_lens"),
        "new_max_seq_len.seq_lens": Alias("seq_lens"),
        "problem.seq_lens": Alias("seq_lens"),
        "max_seq_len": HostDerive(lambda x: x, ("state.max_seq_len",)),
    })
    state = _state()
    meta = _Collide(_Pair(state.seq_lens), _Pair(state.seq_lens), 0, _Pair(state.seq_lens))
    spec.update(meta, state)
    assert meta.max_seq_len == state.max_seq_len
    source = explain(spec)
    assert "_pair_1 = metadata.pair" in source and "_problem_1 = metadata.problem" in source


def test_user_text_never_runs_as_code() -> None:
    evil = 'x"""\nraise SystemExit("injected")\n"""'
    ran: list[str] = []
    rules = toy_rules()
    rules["scale"] = HostDerive(lambda m: 1.0 / m, ("state.max_model_len",),
                                formula="1/L\nraise SystemExit('formula')")
    rules["scheduler"] = Reset(Scheduler, label="S\nraise SystemExit('label')")
    spec = toy_spec(
        name=evil,
        rules=rules,
        preconditions=[
            Equals("num_prefills", "{state.max_model_len}", name="n\n'"),
            Satisfies("ok}{", lambda n: ran.append("called") or True, ("num_reqs",),
                      description="{__import__('os')}"),
        ],
    )
    source = explain(spec)
    compile(source, "<check>", "exec")
    assert "\nraise SystemExit" not in source
    state = _state()
    meta = toy_metadata(state)
    with pytest.raises(PreconditionFailed) as info:
        spec.update(meta, state)
    assert "expected '{state.max_model_len}'" in str(info.value)  # not evaluated
    assert info.value.name == "n\n'"


def test_an_infinite_precondition_value_is_bound_not_pasted() -> None:
    spec = toy_spec(preconditions=[Equals("scale", float("inf"), name="inf_scale")])
    state = _state()
    with pytest.raises(PreconditionFailed, match="expected inf"):
        spec.update(toy_metadata(state), state)


# -- concurrency ------------------------------------------------------------------------------


def test_two_threads_updating_distinct_metadata_objects_agree_with_rebuilds() -> None:
    spec = toy_spec()
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            state = _state(seed, num_padded=2)
            meta = toy_metadata(state)
            for _ in range(40):
                advance_state(state)
                spec.update(meta, state)
                diff = compare_metadata(meta, toy_metadata(state), opaque=_opaque)
                assert diff == [], diff
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_two_loops_in_two_threads_keep_their_own_state() -> None:
    results: dict[int, Any] = {}

    def worker(seed: int) -> None:
        state = _state(seed)
        group = toy_group("toy", state)
        loop = DraftLoop([group], state, shadow=0)
        loop.run(lambda i, m: None, 5)
        results[seed] = (loop.stats.groups["toy"].updates,
                         compare_metadata(loop.groups[0].metadata, toy_metadata(state),
                                          opaque=_opaque))

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {1: (4, []), 2: (4, [])}

